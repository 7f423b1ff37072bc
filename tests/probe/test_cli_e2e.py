"""The probe program end to end against a stand-in platform: a real process, a real WebSocket.

The stand-in speaks the tunnel protocol (clients/protocol.py) so these tests cover the command line,
the hello, the mapping of ProbeError to JSON-RPC errors and the final close codes, without Django.
The platform's own e2e tests (tests/probes_platform) drive the probe through daphne.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from contextlib import asynccontextmanager

import pytest
from websockets.asyncio.server import serve

from clients import protocol
from tests.e2e_support import ROOT, free_port

pytestmark = pytest.mark.e2e
TOKEN = "dev_test-token-for-the-probe"


class StandIn:
    """Accepts one device connection, answers hello, and lets the test send requests."""

    def __init__(self) -> None:
        self.hello: asyncio.Future = asyncio.get_running_loop().create_future()
        self.ws = None
        self.auth = None
        self.next_id = 0
        self.close_with: int | None = None

    async def handler(self, ws) -> None:
        self.auth = ws.request.headers.get("Authorization")
        self.ws = ws
        message = protocol.parse(await ws.recv())
        await ws.send(protocol.result(message["id"], {"deviceId": "dev-1", "heartbeatSec": 20, "resendFrom": 1}))
        self.hello.set_result(message)
        await ws.wait_closed()

    async def call(self, method: str, params: dict) -> dict:
        self.next_id += 1
        await self.ws.send(protocol.request(method, params, self.next_id))
        while True:
            message = json.loads(await asyncio.wait_for(self.ws.recv(), 20))
            if message.get("id") == self.next_id:
                return message


@asynccontextmanager
async def probe_process(tmp_path, *flags: str):
    standin = StandIn()
    port = free_port()
    async with serve(standin.handler, "127.0.0.1", port):
        env = dict(os.environ, AI1NET_PROBE_TOKEN=TOKEN, AI1NET_PROBE_DEVICE_ID="dev-1", PYTHONUNBUFFERED="1")
        log = open(tmp_path / "probe.log", "wb")  # closed below
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "clients.probe", "run", f"http://127.0.0.1:{port}", *flags,
            cwd=str(ROOT), env=env, stdout=log, stderr=log,
        )  # fmt: skip
        try:
            await asyncio.wait_for(asyncio.shield(standin.hello), 20)
            yield standin, proc
        finally:
            if proc.returncode is None:
                proc.terminate()
                await asyncio.wait_for(proc.wait(), 20)
            log.close()


async def test_the_probe_says_hello_and_serves_ops(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (root / "a.txt").write_text("one\ntwo\n")
    (tmp_path / "secret.txt").write_text("s\n")
    async with probe_process(tmp_path, "--allow", str(root)) as (standin, proc):
        hello = standin.hello.result()
        assert standin.auth == f"Bearer {TOKEN}"
        params = hello["params"]
        assert params["kind"] == "probe" and params["roots"] == [str(root)] and params["ackedSeq"] == 0
        assert "read" in params["capabilities"] and "write" not in params["capabilities"]
        assert "run" not in params["capabilities"] and params["modes"] == {"write": False, "exec": False}

        read = await standin.call("probe.read", {"path": str(root / "a.txt")})
        assert read["result"]["lines"] == [[1, "one"], [2, "two"]]
        outside = await standin.call("probe.read", {"path": str(tmp_path / "secret.txt")})
        assert outside["error"]["code"] == protocol.APPLICATION_ERROR
        assert outside["error"]["data"]["code"] == "outside_allowed_roots"
        write = await standin.call("probe.write", {"path": "b.txt", "content": "x"})
        assert write["error"]["data"]["code"] == "not_permitted" and not (root / "b.txt").exists()
        unknown = await standin.call("web.request", {})
        assert unknown["error"]["code"] == protocol.METHOD_NOT_FOUND
    assert proc.returncode == 0  # SIGTERM is a clean stop


async def test_write_and_exec_modes_travel_in_hello_and_work(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    async with probe_process(tmp_path, "--allow", str(root), "--write", "--exec") as (standin, _):
        params = standin.hello.result()["params"]
        assert {"write", "run", "run_background"} <= set(params["capabilities"])
        assert params["modes"] == {"write": True, "exec": True}
        made = await standin.call("probe.write", {"path": "b.txt", "content": "x\n"})
        assert made["result"]["created"] is True and (root / "b.txt").read_text() == "x\n"
        ran = await standin.call("probe.run", {"argv": ["cat", "b.txt"]})
        assert ran["result"]["stdout"] == "x\n"


@pytest.mark.parametrize("code", [protocol.CLOSE_REVOKED, protocol.CLOSE_UNAUTHORIZED])
async def test_a_dead_token_stops_the_probe_for_good(tmp_path, code):
    root = tmp_path / "root"
    root.mkdir()
    async with probe_process(tmp_path, "--allow", str(root)) as (standin, proc):
        await standin.ws.close(code, "gone")
        assert await asyncio.wait_for(proc.wait(), 20) == 3
    assert b"close code" in (tmp_path / "probe.log").read_bytes()


def test_a_bad_allow_list_is_a_usage_error(tmp_path):
    import subprocess

    result = subprocess.run(
        [sys.executable, "-m", "clients.probe", "run", "http://127.0.0.1:9", "--allow", str(tmp_path / "missing")],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env=dict(os.environ, AI1NET_PROBE_TOKEN=TOKEN, AI1NET_PROBE_DEVICE_ID="dev-1"),
    )  # fmt: skip
    assert result.returncode == 2 and "--allow" in result.stderr
