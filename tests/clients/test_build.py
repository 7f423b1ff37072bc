"""`python -m clients.build` makes single-file clients that run on a bare Python: nothing imported
from the virtualenv (-I -S: no site-packages, no PYTHONPATH, no user site, run from elsewhere)."""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys
import zipfile
from importlib.machinery import EXTENSION_SUFFIXES

import pytest

from clients import protocol
from clients.bridge import hook_cache
from clients.build import HOT_MODULES
from clients.common.credentials import Credential, save_credential
from tests.clients.fakes import FakePairingServer, FakeTunnelServer, approved
from tests.clients.test_bridge import ROOT

BARE = [sys.executable, "-I", "-S"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("pyz")
    result = subprocess.run([sys.executable, "-m", "clients.build", "--out", str(out)], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return out


def bare(*args: str, cwd, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([*BARE, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def test_the_bare_interpreter_really_lacks_the_dependencies(tmp_path):
    result = bare("-c", "import websockets", cwd=tmp_path)
    assert result.returncode != 0 and "No module named 'websockets'" in result.stderr


def test_the_bridge_pyz_carries_its_dependencies(built, tmp_path):
    pyz = built / "ai1net-bridge.pyz"
    names = zipfile.ZipFile(pyz).namelist()
    assert "__main__.py" in names and "clients/protocol.py" in names and "clients/common/tunnel.py" in names
    assert "websockets/asyncio/client.py" in names and "qrcode/main.py" in names
    assert not any(name.endswith("build.py") or "/tests/" in name for name in names)
    # One native file: websockets' C masking as built for this interpreter (clients/masking.py).
    assert [name for name in names if name.endswith(".so")] == [f"websockets/speedups{EXTENSION_SUFFIXES[0]}"]
    # Bytecode only for what every hook event runs, each beside its source (another Python uses the source).
    compiled = sorted(name for name in names if name.endswith(".pyc"))
    assert compiled == sorted(f"{module.replace('.', '/')}.pyc" for module in HOT_MODULES["ai1net-bridge"])
    assert all(name[:-1] in names for name in compiled)
    # ... and stored uncompressed, so that a hook call neither imports zlib nor inflates; the rest is deflated.
    kinds = {info.filename: info.compress_type for info in zipfile.ZipFile(pyz).infolist() if not info.is_dir()}
    assert {name for name, kind in kinds.items() if kind == zipfile.ZIP_STORED} == set(compiled)
    assert all(kind == zipfile.ZIP_DEFLATED for name, kind in kinds.items() if name not in compiled)
    assert pyz.read_bytes().startswith(b"#!/usr/bin/env python3\n") and pyz.stat().st_mode & 0o100
    result = bare(str(pyz), "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "pair" in result.stdout and "run" in result.stdout and "status" in result.stdout
    result = bare(str(pyz), "--home", str(tmp_path / "h"), "status", cwd=tmp_path)
    assert result.returncode == 1 and "paired: no" in result.stdout


def test_the_bridge_pyz_pairs_with_a_qr_code(built, tmp_path):
    with FakePairingServer(token_answers=[approved()], interval=1) as server:
        result = bare(str(built / "ai1net-bridge.pyz"), "--home", str(tmp_path / "h"), "pair", server.url,
                      cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "code: BCDF-GHJK" in result.stdout and "\u2588" in result.stdout  # qrcode ran from the zip


async def test_the_bridge_pyz_speaks_the_tunnel(built, tmp_path):
    async with FakeTunnelServer() as server:
        save_credential(tmp_path, Credential(url=server.url, device_id="d", token=server.token, kind="bridge", name="n"))
        server.close_on_connect = protocol.CLOSE_REVOKED
        process = await asyncio.create_subprocess_exec(
            *BARE, str(built / "ai1net-bridge.pyz"), "--home", str(tmp_path), "run", cwd=str(tmp_path),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        _, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 3, err.decode()
    assert "revoked by its owner" in err.decode()
    assert server.handshakes[0]["authorization"] == f"Bearer {server.token}"


@pytest.mark.parametrize("hooks_installed", [True, False])
async def test_the_bridge_pyz_writes_its_hooks_copy_at_start(built, tmp_path, hooks_installed):
    """After an update the hooks read the archive until its copy is written (hook_cache): the bridge's start
    writes it where `hooks install` made the cache, and writes nothing where hooks were never installed."""
    pyz = built / "ai1net-bridge.pyz"
    if hooks_installed:
        (tmp_path / "hook-cache").mkdir()
    async with FakeTunnelServer() as server:
        save_credential(tmp_path, Credential(url=server.url, device_id="d", token=server.token, kind="bridge", name="n"))
        server.close_on_connect = protocol.CLOSE_REVOKED  # it stops at once: the copy is written all the same
        process = await asyncio.create_subprocess_exec(
            *BARE, str(pyz), "--home", str(tmp_path), "run", cwd=str(tmp_path),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        _, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 3, err.decode()
    copy = tmp_path / "hook-cache" / hook_cache.key(pyz)
    assert (copy / "clients" / "bridge" / "hook.py").is_file() is hooks_installed
    assert (tmp_path / "hook-cache").exists() is hooks_installed


def test_the_probe_pyz_runs_when_the_probe_exists(built, tmp_path):
    try:
        has_probe = importlib.util.find_spec("clients.probe.__main__") is not None
    except ModuleNotFoundError:
        has_probe = False
    if not has_probe:
        assert not (built / "ai1net-probe.pyz").exists()
        return
    result = bare(str(built / "ai1net-probe.pyz"), "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr


def _oldest_supported_python() -> str | None:
    """A Python 3.9 interpreter, if this machine has one (the clients promise 3.9+)."""
    import glob
    import shutil

    for candidate in [*sorted(glob.glob("/root/.pyenv/versions/3.9*/bin/python3.9")), shutil.which("python3.9")]:
        # A pyenv shim may exist without the version behind it: only an interpreter that runs counts.
        if candidate and subprocess.run([candidate, "-c", "pass"], capture_output=True).returncode == 0:
            return candidate
    return None


@pytest.mark.parametrize("name", ["ai1net-bridge", "ai1net-probe"])
def test_the_pyz_runs_on_python_3_9(built, tmp_path, name):
    python39 = _oldest_supported_python()
    if python39 is None:
        pytest.skip("no Python 3.9 interpreter on this machine")
    pyz = built / f"{name}.pyz"
    result = subprocess.run([python39, "-I", "-S", str(pyz), "--help"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    # The vendored websockets must import on 3.9 too (the tunnel needs it, --help alone might not).
    check = subprocess.run([python39, "-I", "-S", "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                            "import websockets.asyncio.client, clients.common.tunnel, qrcode; print('ok')", str(pyz)],
                           cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert check.stdout.strip() == "ok", check.stderr
