"""The single-file bridge: `hooks install` run from the .pyz writes a hook command that runs the .pyz,
and that command fails open (daemon down) and answers (daemon up) on a bare interpreter."""

from __future__ import annotations

import asyncio
import json
import shlex
import subprocess
import sys
import time

import pytest

from clients.bridge import hook_cache
from clients.bridge.hooks_install import PYZ_HOOK_ENTRY
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
    cache = home.resolve() / "hook-cache"
    assert (cache / hook_cache.key(pyz) / "clients" / "bridge" / "hook.py").is_file()
    assert f"{pyz} {cache} --home {home.resolve()} hook --window 120 --answer-style allow" in command
    assert "PYTHONPATH" not in command
    done, elapsed = run(command, tmp_path, {"hook_event_name": "UserPromptSubmit", "session_id": "s", "prompt": "x"})
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
    assert elapsed < 1.0
    rollback = subprocess.run([*BARE, str(pyz), "--home", str(home), "hooks", "install", "--rollback"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert rollback.returncode == 0 and not settings.exists()
    # The copy goes with the last hooks (the bridge's start then writes none): install added it.
    assert not cache.exists()


# The hook ends with posix._exit (hook.exit_now, no atexit handlers run): the report goes out just before it.
REPORT = ("import sys, posix; _exit = posix._exit; posix._exit = lambda code: (sys.__stderr__.write(' '.join("
          "sorted(sys.modules)) + '\\n' + sys.modules['clients.bridge.hook'].__file__), sys.__stderr__.flush(), "
          "_exit(code)); ")


def run_reporting(command, cwd, event):
    """The command with its entry reporting the modules it imported and where the hook came from."""
    command = command.replace(shlex.quote(PYZ_HOOK_ENTRY), shlex.quote(REPORT + PYZ_HOOK_ENTRY))
    done, _ = run(command, cwd, event)
    assert done.returncode == 0 and not done.stdout, done.stderr
    modules, hook_file = done.stderr.decode().rsplit("\n", 1)
    return set(modules.split()), hook_file


def test_the_pyz_hook_command_skips_runpy_and_imports_only_cheap_modules(pyz, tmp_path):
    """Python runs an archive named as its script through runpy (importlib.util, contextlib, collections,
    functools: 6 ms of every hook call): the installed command imports the hook out of the archive with -c."""
    home = tmp_path / "home"
    _, command = install(pyz, tmp_path, home)
    cache = home.resolve() / "hook-cache"
    assert f" -I -S -c {shlex.quote(PYZ_HOOK_ENTRY)} {pyz} {cache} --home" in command
    modules, hook_file = run_reporting(command, tmp_path, {"hook_event_name": "Stop", "session_id": "s"})
    assert "clients.bridge.hook" in modules, modules
    # zlib: the modules a hook call reads are stored uncompressed in the archive (clients/build.py).
    # __future__: `from __future__ import annotations` imports it; os: 1 ms, posix has what the hook uses; the
    # utf-8-sig codec: a module to import (clients/bridge/hook.py).
    assert not modules & {"runpy", "importlib.util", "contextlib", "argparse", "asyncio", "logging", "websockets",
                          "clients.bridge.cli", "clients.bridge.__main__", "zlib", "__future__", "os",
                          "encodings.utf_8_sig"}, modules
    # ... and copied out of it by `hooks install`, compiled: no zipimport reads the archive's directory.
    assert hook_file == str(cache / hook_cache.key(pyz) / "clients" / "bridge" / "hook.py")


def test_the_pyz_hook_reads_the_archive_once_it_changed_until_its_copy_is_written(pyz, tmp_path):
    """The copy is named after the archive as it is on disk: a new version (a new file in its place) is read
    from the archive, then from its own copy once `hooks install` (or the bridge's start) wrote it."""
    bridge = tmp_path / "bin" / "ai1net-bridge.pyz"
    bridge.parent.mkdir()
    bridge.write_bytes(pyz.read_bytes())
    home = tmp_path / "home"
    _, command = install(bridge, tmp_path, home)
    cache = home.resolve() / "hook-cache"
    first = hook_cache.key(bridge)
    event = {"hook_event_name": "Stop", "session_id": "s"}
    assert run_reporting(command, tmp_path, event)[1].startswith(str(cache / first) + "/")

    update = bridge.with_name("download.tmp")
    update.write_bytes(pyz.read_bytes())
    update.replace(bridge)  # how a new version lands: the same path, another file
    assert hook_cache.key(bridge) != first
    modules, hook_file = run_reporting(command, tmp_path, event)
    assert hook_file == f"{bridge}/clients/bridge/hook.pyc", hook_file  # from the archive itself, still working
    assert not modules & {"runpy", "argparse", "asyncio", "zlib"}, modules

    install(bridge, tmp_path, home)  # the same command: settings.json unchanged, the new archive's copy written
    assert run_reporting(command, tmp_path, event)[1].startswith(str(cache / hook_cache.key(bridge)) + "/")
    assert sorted(path.name for path in cache.iterdir()) == sorted([first, hook_cache.key(bridge)])  # a day each


async def test_the_pyz_hook_talks_to_the_daemon(pyz, tmp_path):
    home = tmp_path / "home"
    home.mkdir()

    async def backend(route, body):
        return {"messages": [{"message_id": "m", "text": "hello from the phone"}]} if route == "user-prompt-submit" else {}

    api = LocalApi(home, backend)
    api.start()
    try:
        _, command = await asyncio.to_thread(install, pyz, tmp_path, home)
        # It ends without the interpreter's finalization (hook.exit_now): no atexit handler runs, and its
        # output is whole all the same.
        finalized = "import atexit, sys; atexit.register(lambda: sys.__stderr__.write('finalized')); "
        command = command.replace(shlex.quote(PYZ_HOOK_ENTRY), shlex.quote(finalized + PYZ_HOOK_ENTRY))
        event = {"hook_event_name": "UserPromptSubmit", "session_id": "s", "prompt": "x"}
        done, _ = await asyncio.to_thread(run, command, tmp_path, event)
    finally:
        api.stop()
    assert done.returncode == 0 and done.stderr == b"", done.stderr
    assert json.loads(done.stdout)["hookSpecificOutput"]["additionalContext"] == (
        "Message from the user's phone: hello from the phone")
