"""Proof against the real agent host for tool approval from the phone: the real Claude Code CLI (2.1.197)
runs offline through the shared harness with the hooks `hooks install --approve` wrote, and its scripted
fake model makes Bash calls. The phone is an HTTP client on a real daphne.

1. the phone allows the first call "and remember for this session": it runs (the model receives its output);
2. the very same call again runs without reaching the phone;
3. the phone denies the next call with a reason: it does not run (its marker file never appears) and the
   model receives the reason;
4. (interactive only) the person at the desk answers Claude Code's own dialog first: the phone's request
   turns "answered on the desktop" and a late phone answer is refused with that name.

Print mode (`claude -p`, `--approve Bash`) proves the PreToolUse path (PermissionRequest does not fire in
-p); interactive mode under tmux (`--approve asked`) proves the PermissionRequest path.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ai1net.accounts.models import AuditEntry
from clients import permission
from mobile.models import Question
from tests.e2e_support import ROOT, csrf, wait_until

from .test_claude_e2e import HARNESS, claude_bin
from .test_mobile_e2e import pending, world  # noqa: F401 - world is a fixture

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.claude, pytest.mark.django_db(transaction=True)]

ALLOWED = {"command": "touch allowed-marker && echo hi-from-bash", "description": "mark"}
DENIED = {"command": "touch denied-marker", "description": "mark again"}
AT_DESK = {"command": "touch desk-marker && echo desk-said-yes", "description": "ask the desk"}
TEXT = permission.question_text("Bash")
MODES = [("print", "Bash", "PreToolUse")] + (
    [("interactive", "asked", "PermissionRequest")] if shutil.which("tmux") else [])


def script(*calls: dict) -> dict:
    steps = [{"content": [{"type": "tool_use", "name": "Bash", "input": call}]} for call in calls]
    return {"steps": [*steps, {"content": [{"type": "text", "text": "Done. FINAL_TEXT_FROM_FAKE_MODEL"}]}],
            "side_text": "OK"}


def decide(session, item, label, reason=None):
    body = {"question_id": item["question_id"], "nonce": item["nonce"], "input_hash": item["input_hash"],
            "answers": {TEXT: [label]}}
    if reason:
        body["other"] = {TEXT: reason}
    return session.post("/api/mobile/answer", json=body, headers=csrf(session))


def _tmux_showing(text: str) -> Path | None:
    """The harness's private tmux server whose screen shows ``text`` and Claude Code's dialog, if any."""
    for sock in sorted(Path(f"/tmp/tmux-{os.getuid()}").glob("cchook-*")):
        screen = subprocess.run(["tmux", "-S", str(sock), "capture-pane", "-p", "-t", "cc"], capture_output=True,
                                text=True, timeout=10).stdout
        if text in screen and "Do you want to proceed?" in screen:
            return sock
    return None


@pytest.mark.parametrize(("mode", "approve", "event"), MODES)
def test_the_real_claude_code_runs_what_the_phone_allows_not_what_it_denies(world, tmp_path, mode, approve, event):  # noqa: F811, E501
    if not (HARNESS / "run_claude_with_hooks.sh").exists():
        pytest.skip(f"the Claude Code harness is not at {HARNESS}")
    binary = claude_bin()
    server, desk, session = world
    settings = tmp_path / "settings.json"
    installed = subprocess.run(
        [sys.executable, "-m", "clients.bridge", "--home", str(desk.home), "hooks", "install", "--settings",
         str(settings), "--window", "90", "--approve", approve], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert installed.returncode == 0, installed.stderr
    interactive = mode == "interactive"
    calls = [ALLOWED, ALLOWED, DENIED] + ([AT_DESK] if interactive else [])
    (tmp_path / "script.json").write_text(json.dumps(script(*calls)))
    run_dir = tmp_path / "run"
    env = {**os.environ, "CLAUDE_BIN": binary, "FAKE_SCRIPT": str(tmp_path / "script.json"), "RUN_DIR": str(run_dir),
           "MODE": mode, "TIMEOUT": "150"}
    claude = desk.pool.submit(subprocess.run, [str(HARNESS / "run_claude_with_hooks.sh"), str(settings),
                                               "Mark the project"], env=env, capture_output=True, text=True,
                              timeout=240)

    [first] = pending(session)
    assert (first["kind"], first["tool_name"]) == ("permission", "Bash")
    assert first["input_hash"] == permission.input_hash(ALLOWED)
    assert first["rendering"]["text"] == "# mark\n" + ALLOWED["command"]
    assert decide(session, first, permission.ALLOW_SESSION).status_code == 200
    [second] = pending(session)  # the repeated call was allowed by the bridge: the next one here is DENIED
    assert second["input_hash"] == permission.input_hash(DENIED)
    assert decide(session, second, permission.DENY, "use the Makefile").status_code == 200
    if interactive:
        [third] = pending(session)
        assert third["input_hash"] == permission.input_hash(AT_DESK)
        sock = wait_until(lambda: _tmux_showing(str(run_dir / "work")), timeout=30, message="the desktop dialog")
        subprocess.run(["tmux", "-S", str(sock), "send-keys", "-t", "cc", "1"], check=True, timeout=10)  # Yes
        wait_until(lambda: Question.objects.get(pk=third["question_id"]).state == Question.State.ANSWERED_ON_DESKTOP,
                   timeout=30, message="answered on the desktop, on the platform")
        late = decide(session, third, permission.DENY)
        assert (late.status_code, late.json()["error"]) == (409, "answered_on_desktop")
    result = claude.result(260)
    assert result.returncode == 0, (result.stdout, result.stderr, (run_dir / "claude.stderr").read_text())

    received = (run_dir / "api" / "tool_results.jsonl").read_text()
    assert received.count("hi-from-bash") == 2, received
    assert "The user denied this tool call from their phone: use the Makefile" in received, received
    assert (run_dir / "work" / "allowed-marker").exists()
    assert not (run_dir / "work" / "denied-marker").exists()
    audit = desk.audit()
    assert audit.count("permission.take") == 2 and audit.count("permission.remembered") == 1
    assert '"POST /v1/permission-request HTTP/1.1" 200' in desk.process.log()
    decisions = [e.data.get("decision") for e in AuditEntry.objects.filter(action="mobile.answer").order_by("pk")]
    assert decisions == ["allow_session", "deny"]
    asked = [json.loads(line) for line in (desk.home / "audit.jsonl").read_text().splitlines()
             if '"permission.ask"' in line]
    assert [entry.get("hook_event") for entry in asked] == [event] * (3 if interactive else 2)
    if interactive:
        assert "desk-said-yes" in received and (run_dir / "work" / "desk-marker").exists()
        assert audit.count("permission.desktop") == 1
