"""Proof against the real agent host: the real Claude Code CLI (2.1.197) runs offline through the shared
harness (../shared/tools/claude-code-harness) with the hooks that `hooks install` wrote; its scripted
fake model calls AskUserQuestion, the question reaches the phone (an HTTP client on a real daphne),
the phone answers, and the model receives the phone's answer as the tool result.

The CLI is installed by this test's set-up into a cache folder (never committed) unless CLAUDE_BIN
points at one, or ~/.cache/ai1net-claude already holds the pinned version.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from im.models import Message
from mobile.models import AgentSession
from tests.e2e_support import ROOT, npm_cli, wait_until

from .test_mobile_e2e import FRAMEWORK, answer, pending, world  # noqa: F401 - world is a fixture

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.claude, pytest.mark.django_db(transaction=True)]

CLAUDE_VERSION = "2.1.197"
HARNESS = ROOT.parent / "shared" / "tools" / "claude-code-harness"


def claude_bin() -> str:
    return npm_cli("@anthropic-ai/claude-code", CLAUDE_VERSION, "claude", env_var="CLAUDE_BIN",
                   cache_name=f"claude-code-{CLAUDE_VERSION}", home_cache="ai1net-claude")


SCRIPT = {
    "steps": [
        {"content": [{"type": "tool_use", "name": "AskUserQuestion", "input": {"questions": [FRAMEWORK]}}]},
        {"content": [{"type": "text", "text": "Going with your choice. FINAL_TEXT_FROM_FAKE_MODEL"}]},
    ],
    "side_text": "OK",
}
MODES = ["print"] + (["interactive"] if shutil.which("tmux") else [])


@pytest.mark.parametrize("mode", MODES)
def test_the_real_claude_code_receives_the_phones_answer(world, tmp_path, mode):  # noqa: F811
    if not (HARNESS / "run_claude_with_hooks.sh").exists():
        pytest.skip(f"the Claude Code harness is not at {HARNESS}")
    binary = claude_bin()
    server, desk, session = world
    settings = tmp_path / "settings.json"
    installed = subprocess.run(
        [sys.executable, "-m", "clients.bridge", "--home", str(desk.home), "hooks", "install", "--settings",
         str(settings), "--window", "90"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert installed.returncode == 0, installed.stderr
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    run_dir = tmp_path / "run"
    env = {**os.environ, "CLAUDE_BIN": binary, "FAKE_SCRIPT": str(script), "RUN_DIR": str(run_dir), "MODE": mode,
           "TIMEOUT": "150"}
    claude = desk.pool.submit(subprocess.run, [str(HARNESS / "run_claude_with_hooks.sh"), str(settings),
                                               "Set up the project"], env=env, capture_output=True, text=True,
                              timeout=240)

    [question] = pending(session)
    assert question["questions"] == [FRAMEWORK]
    assert answer(session, question, {"Which framework?": ["Vue"]}).status_code == 200
    result = claude.result(260)
    assert result.returncode == 0, (result.stdout, result.stderr, (run_dir / "claude.stderr").read_text())

    tool_results = [json.loads(line) for line in (run_dir / "api" / "tool_results.jsonl").read_text().splitlines()]
    received = json.dumps(tool_results)
    assert 'Your questions have been answered: \\"Which framework?\\"=\\"Vue\\"' in received, received
    if mode == "print":
        assert "FINAL_TEXT_FROM_FAKE_MODEL" in (run_dir / "claude.stdout").read_text()

    # Every hook reached the bridge; PostToolUse, Stop and SessionEnd reached the platform: the first two
    # as events in the session's room, the last by ending the session (its room closes).
    session_id = question["session_id"]
    wait_until(lambda: AgentSession.objects.get(session_id=session_id).state == AgentSession.State.ENDED,
               timeout=20, message="the session ended on the platform")
    room = AgentSession.objects.get(session_id=session_id).room
    wait_until(lambda: {"PostToolUse", "Stop"} <= {
        m.body.get("event") for m in Message.objects.filter(room=room, kind="event")},
        timeout=20, message="PostToolUse and Stop in the session's room")
    assert room.state == "closed"
    log = desk.process.log()
    for route in ("session-start", "user-prompt-submit", "pre-tool-use", "questions/wait", "post-tool-use", "stop",
                  "session-end"):
        assert f'"POST /v1/{route} HTTP/1.1" 200' in log, route
    assert desk.audit().count("question.take") == 1
