"""The hook fails open: no output, exit 0, fast, whatever goes wrong."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from clients.bridge.local_api import LocalApi, write_private_json
from tests.e2e_support import ROOT

QUESTION = {
    "question": "Which framework?",
    "header": "Framework",
    "options": [{"label": "React", "description": "SPA"}, {"label": "Vue", "description": "SPA"}],
    "multiSelect": False,
}
ASK = {
    "session_id": "s1",
    "transcript_path": "/tmp/t.jsonl",
    "cwd": "/tmp",
    "permission_mode": "default",
    "hook_event_name": "PreToolUse",
    "tool_name": "AskUserQuestion",
    "tool_input": {"questions": [QUESTION]},
    "tool_use_id": "toolu_01ABC",
}
EVENTS = [
    {"session_id": "s1", "hook_event_name": "SessionStart", "source": "startup", "cwd": "/tmp"},
    ASK,
    {"session_id": "s1", "hook_event_name": "UserPromptSubmit", "prompt": "hi"},
    {"session_id": "s1", "hook_event_name": "Stop", "stop_hook_active": False},
    {"session_id": "s1", "hook_event_name": "SessionEnd", "reason": "other"},
]


def run_hook(home, stdin: bytes, **env):
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "clients.bridge", "--home", str(home), "hook", "--window", "30"],
        cwd=ROOT,
        input=stdin,
        capture_output=True,
        timeout=30,
        env={**os.environ, **env},
    )
    return result, time.monotonic() - started


@pytest.mark.e2e
@pytest.mark.parametrize("event", EVENTS, ids=lambda e: e["hook_event_name"])
def test_daemon_never_started(tmp_path, event):
    result, elapsed = run_hook(tmp_path, json.dumps(event).encode())
    assert (result.returncode, result.stdout, result.stderr) == (0, b"", b"")
    assert elapsed < 1.0


@pytest.mark.e2e
@pytest.mark.parametrize("event", EVENTS, ids=lambda e: e["hook_event_name"])
def test_daemon_down_with_a_stale_local_json(tmp_path, event):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead_port = sock.getsockname()[1]
    write_private_json(tmp_path / "local.json", {"port": dead_port, "secret": "x" * 43, "pid": 999999})
    result, elapsed = run_hook(tmp_path, json.dumps(event).encode())
    assert (result.returncode, result.stdout, result.stderr) == (0, b"", b"")
    assert elapsed < 1.0


@pytest.mark.e2e
def test_session_end_returns_within_a_second_even_if_the_daemon_hangs(tmp_path):
    with socket.socket() as black_hole:  # accepts connections, never answers
        black_hole.bind(("127.0.0.1", 0))
        black_hole.listen(8)
        write_private_json(
            tmp_path / "local.json", {"port": black_hole.getsockname()[1], "secret": "x" * 43, "pid": 1}
        )
        result, elapsed = run_hook(tmp_path, json.dumps(EVENTS[-1]).encode())
    assert (result.returncode, result.stdout) == (0, b"")
    assert elapsed < 1.0


@pytest.mark.e2e
@pytest.mark.parametrize("stdin", [b"", b"{", b"[]", b'"x"', b'{"hook_event_name": "PreToolUse"}', b"\xff\xfe"])
def test_malformed_stdin(tmp_path, stdin):
    result, elapsed = run_hook(tmp_path, stdin)
    assert (result.returncode, result.stdout, result.stderr) == (0, b"", b"")
    assert elapsed < 1.0


@pytest.fixture
async def live_daemon(tmp_path):
    """A loopback API that always has a phone message waiting."""

    async def backend(route, body):
        return {"messages": [{"message_id": "m1", "text": "from the phone"}]} if route == "user-prompt-submit" else {}

    api = LocalApi(tmp_path, backend)
    api.start()
    yield tmp_path
    api.stop()


@pytest.mark.e2e
async def test_mobile_off_env_silences_a_working_hook(live_daemon):
    import asyncio

    stdin = json.dumps(EVENTS[2]).encode()
    on, _ = await asyncio.to_thread(run_hook, live_daemon, stdin)
    assert json.loads(on.stdout) == {
        "hookSpecificOutput": {
            "hookEventName": "UserPromptSubmit",
            "additionalContext": "Message from the user's phone: from the phone",
        }
    }
    off, elapsed = await asyncio.to_thread(run_hook, live_daemon, stdin, AI1NET_MOBILE_OFF="1")
    assert (off.returncode, off.stdout, off.stderr) == (0, b"", b"")
    assert elapsed < 1.0


@pytest.mark.e2e
async def test_wrong_secret_fails_open(live_daemon):
    import asyncio

    info = json.loads((live_daemon / "local.json").read_text())
    write_private_json(live_daemon / "local.json", dict(info, secret="y" * 43))
    result, _ = await asyncio.to_thread(run_hook, live_daemon, json.dumps(EVENTS[2]).encode())
    assert (result.returncode, result.stdout) == (0, b"")


@pytest.mark.e2e
def test_a_stale_local_json_does_not_leak_the_secret_to_whoever_holds_the_port(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    with socket.socket() as listener:  # some other program now listens on the old port
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.settimeout(0.5)
        write_private_json(tmp_path / "local.json",
                           {"port": listener.getsockname()[1], "secret": "s" * 43, "pid": int(dead.stdout)})
        result, elapsed = run_hook(tmp_path, json.dumps(EVENTS[2]).encode())
        with pytest.raises(TimeoutError):
            listener.accept()
    assert (result.returncode, result.stdout) == (0, b"")
    assert elapsed < 1.0
