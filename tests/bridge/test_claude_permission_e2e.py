"""Proof against the real agent host for tool approval from the phone: the real Claude Code CLI (2.1.197)
runs offline through the shared harness with the hooks `hooks install --approve` wrote; its scripted fake
model runs three Bash calls; the phone (an HTTP client on a real daphne) gets the first as a permission
request and allows it "and remember for this session" (it runs: the model receives its output); the
second, the very same call, runs without asking the phone; the third reaches the phone and is denied
with a reason (it does not run: its marker file never appears, and the model receives the reason).

- print mode (`claude -p`), `--approve Bash`: the PreToolUse path (PermissionRequest does not fire in -p);
- interactive mode (tmux), `--approve asked`: the PermissionRequest path.
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
SCRIPT = {
    "steps": [
        {"content": [{"type": "tool_use", "name": "Bash", "input": ALLOWED}]},
        {"content": [{"type": "tool_use", "name": "Bash", "input": ALLOWED}]},  # remembered: not asked again
        {"content": [{"type": "tool_use", "name": "Bash", "input": DENIED}]},
        {"content": [{"type": "text", "text": "Done. FINAL_TEXT_FROM_FAKE_MODEL"}]},
    ],
    "side_text": "OK",
}
MODES = [("print", "Bash", "PreToolUse")] + (
    [("interactive", "asked", "PermissionRequest")] if shutil.which("tmux") else [])
TEXT = permission.question_text("Bash")


def decide(session, item, label, reason=None):
    body = {"question_id": item["question_id"], "nonce": item["nonce"], "input_hash": item["input_hash"],
            "answers": {TEXT: [label]}}
    if reason:
        body["other"] = {TEXT: reason}
    return session.post("/api/mobile/answer", json=body, headers=csrf(session))


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
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    run_dir = tmp_path / "run"
    env = {**os.environ, "CLAUDE_BIN": binary, "FAKE_SCRIPT": str(script), "RUN_DIR": str(run_dir), "MODE": mode,
           "TIMEOUT": "150"}
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
    result = claude.result(260)
    assert result.returncode == 0, (result.stdout, result.stderr, (run_dir / "claude.stderr").read_text())

    tool_results = [json.loads(line) for line in (run_dir / "api" / "tool_results.jsonl").read_text().splitlines()]
    received = json.dumps(tool_results)
    assert received.count("hi-from-bash") == 2, received
    assert "The user denied this tool call from their phone: use the Makefile" in received, received
    assert (run_dir / "work" / "allowed-marker").exists()
    assert not (run_dir / "work" / "denied-marker").exists()
    assert desk.audit().count("permission.take") == 2
    assert desk.audit().count("permission.remembered") == 1
    assert '"POST /v1/permission-request HTTP/1.1" 200' in desk.process.log()
    decisions = [e.data.get("decision") for e in AuditEntry.objects.filter(action="mobile.answer").order_by("pk")]
    assert decisions == ["allow_session", "deny"]
    asked = [json.loads(line) for line in (desk.home / "audit.jsonl").read_text().splitlines()
             if '"permission.ask"' in line]
    assert [entry.get("hook_event") for entry in asked] == [event, event]


def _tmux_showing(text: str) -> Path | None:
    """The harness's private tmux server whose screen shows ``text`` (our run's folder), if any."""
    for sock in sorted(Path(f"/tmp/tmux-{os.getuid()}").glob("cchook-*")):
        screen = subprocess.run(["tmux", "-S", str(sock), "capture-pane", "-p", "-t", "cc"], capture_output=True,
                                text=True, timeout=10).stdout
        if text in screen and "Do you want to proceed?" in screen:
            return sock
    return None


@pytest.mark.skipif(not shutil.which("tmux"), reason="interactive mode needs tmux")
def test_the_desk_answers_first_and_the_phone_is_told(world, tmp_path):  # noqa: F811
    """Claude Code shows its own dialog while the PermissionRequest hook waits; the person at the desk
    answers it first. The hook sees the call's result in the transcript, the phone's request turns
    "answered on the desktop", and a late phone answer is refused with that name."""
    if not (HARNESS / "run_claude_with_hooks.sh").exists():
        pytest.skip(f"the Claude Code harness is not at {HARNESS}")
    binary = claude_bin()
    server, desk, session = world
    settings = tmp_path / "settings.json"
    installed = subprocess.run(
        [sys.executable, "-m", "clients.bridge", "--home", str(desk.home), "hooks", "install", "--settings",
         str(settings), "--window", "90", "--approve", "asked"], cwd=ROOT, capture_output=True, text=True,
        timeout=30)
    assert installed.returncode == 0, installed.stderr
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"steps": [SCRIPT["steps"][0], SCRIPT["steps"][-1]], "side_text": "OK"}))
    run_dir = tmp_path / "run"
    env = {**os.environ, "CLAUDE_BIN": binary, "FAKE_SCRIPT": str(script), "RUN_DIR": str(run_dir),
           "MODE": "interactive", "TIMEOUT": "150"}
    claude = desk.pool.submit(subprocess.run, [str(HARNESS / "run_claude_with_hooks.sh"), str(settings),
                                               "Mark the project"], env=env, capture_output=True, text=True,
                              timeout=240)
    [item] = pending(session)
    sock = wait_until(lambda: _tmux_showing(str(run_dir / "work")), timeout=30, message="the desktop dialog")
    subprocess.run(["tmux", "-S", str(sock), "send-keys", "-t", "cc", "1"], check=True, timeout=10)
    wait_until(lambda: Question.objects.get(pk=item["question_id"]).state == Question.State.ANSWERED_ON_DESKTOP,
               timeout=30, message="answered on the desktop, on the platform")
    late = decide(session, item, permission.DENY)
    assert (late.status_code, late.json()["error"]) == (409, "answered_on_desktop")
    result = claude.result(260)
    assert result.returncode == 0, (result.stdout, result.stderr, (run_dir / "claude.stderr").read_text())
    assert "hi-from-bash" in (run_dir / "api" / "tool_results.jsonl").read_text()
    assert (run_dir / "work" / "allowed-marker").exists()
    audit = desk.audit()
    assert "permission.desktop" in audit and "permission.take" not in audit
