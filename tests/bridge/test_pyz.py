"""The single-file bridge: `hooks install` run from the .pyz writes a hook command that runs the .pyz,
and that command fails open (daemon down) and answers (daemon up) on a bare interpreter."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import pytest

from clients.bridge.local_api import LocalApi
from tests.e2e_support import ROOT

pytestmark = [pytest.mark.e2e]
BARE = [sys.executable, "-I", "-S"]


@pytest.fixture(scope="module")
def pyz(tmp_path_factory):
    out = tmp_path_factory.mktemp("pyz")
    result = subprocess.run([sys.executable, "-m", "clients.build", "--out", str(out)], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return out / "ai1net-bridge.pyz"


def install(pyz, tmp_path, home):
    settings = tmp_path / "settings.json"
    result = subprocess.run([*BARE, str(pyz), "--home", str(home), "hooks", "install", "--settings", str(settings)],
                            cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    return settings, json.loads(settings.read_text())["hooks"]["UserPromptSubmit"][0]["hooks"][0]["command"]


def run(command, cwd, event):
    started = time.monotonic()
    done = subprocess.run(["/bin/sh", "-c", command], cwd=cwd, input=json.dumps(event).encode(), capture_output=True,
                          timeout=30, env={"PATH": "/usr/bin:/bin"})
    return done, time.monotonic() - started


def test_the_pyz_installs_a_command_that_runs_itself_and_fails_open(pyz, tmp_path):
    home = tmp_path / "home"
    settings, command = install(pyz, tmp_path, home)
    assert f"{pyz} --home {home.resolve()} hook --window 120 --answer-style allow" in command
    assert "PYTHONPATH" not in command
    done, elapsed = run(command, tmp_path, {"hook_event_name": "UserPromptSubmit", "session_id": "s", "prompt": "x"})
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
    assert elapsed < 1.0
    rollback = subprocess.run([*BARE, str(pyz), "--home", str(home), "hooks", "install", "--rollback"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert rollback.returncode == 0 and not settings.exists()


async def test_the_pyz_hook_talks_to_the_daemon(pyz, tmp_path):
    home = tmp_path / "home"
    home.mkdir()

    async def backend(route, body):
        return {"messages": [{"message_id": "m", "text": "hello from the phone"}]} if route == "user-prompt-submit" else {}

    api = LocalApi(home, backend)
    api.start()
    try:
        _, command = await asyncio.to_thread(install, pyz, tmp_path, home)
        event = {"hook_event_name": "UserPromptSubmit", "session_id": "s", "prompt": "x"}
        done, _ = await asyncio.to_thread(run, command, tmp_path, event)
    finally:
        api.stop()
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["hookSpecificOutput"]["additionalContext"] == (
        "Message from the user's phone: hello from the phone")
