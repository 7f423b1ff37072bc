"""The bridge: its on-disk inbox (exactly once, per device), the daemon's dispatch registry and
built-in methods, and the command line (status, run's exit codes, pair)."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import sys
import time

import pytest

from clients import protocol
from clients.bridge import daemon as bridge_daemon
from clients.bridge.daemon import BridgeDaemon, Inbox, PidLock, running_pid
from clients.common.credentials import Credential, load_credential, save_credential
from tests.clients.fakes import FakePairingServer, FakeTunnelServer, approved, pending
from tests.clients.test_tunnel import until

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_inbox_stores_each_seq_once_and_remembers_it(tmp_path):
    path = tmp_path / "bridge.sqlite3"
    inbox = Inbox(path, "dev-a")
    assert inbox.applied_seq() == 0
    assert inbox.record(1, "k", {"n": 1}) and inbox.record(2, "k", {"n": 2})
    assert not inbox.record(2, "k", {"n": 2}) and not inbox.record(1, "k", {"n": 1})
    inbox.close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    reopened = Inbox(path, "dev-a")
    assert reopened.applied_seq() == 2
    assert [seq for seq, _, _ in reopened.items()] == [1, 2]
    assert [seq for seq, _, _ in reopened.unhandled()] == [1, 2]
    reopened.mark_handled(1)
    assert [seq for seq, _, _ in reopened.unhandled()] == [2]
    reopened.close()
    # A new pairing is a new device: its seqs start again at 1.
    other = Inbox(path, "dev-b")
    assert other.applied_seq() == 0 and other.record(1, "k", {})
    other.close()


def test_the_pid_lock_tells_a_running_daemon_from_a_stale_file(tmp_path):
    assert running_pid(tmp_path) is None
    (tmp_path / "bridge.pid").write_text("999999\n")
    assert running_pid(tmp_path) is None  # stale: nobody holds the lock
    lock = PidLock(tmp_path)
    assert lock.acquire()
    assert running_pid(tmp_path) == os.getpid()
    assert not PidLock(tmp_path).acquire()
    lock.release()
    assert running_pid(tmp_path) is None


@pytest.fixture
def core(monkeypatch):
    """The daemon core alone: fresh registries (keeping the built-in methods), no extensions."""
    monkeypatch.setattr(bridge_daemon, "EXTENSIONS", ())
    monkeypatch.setattr(bridge_daemon, "_kind_handlers", {})
    monkeypatch.setattr(bridge_daemon, "_startup_hooks", [])
    monkeypatch.setattr(bridge_daemon, "_capabilities", [])
    monkeypatch.setattr(bridge_daemon, "_method_handlers", {"bridge.ping": bridge_daemon._method_handlers["bridge.ping"]})
    return bridge_daemon


def credential(server: FakeTunnelServer) -> Credential:
    return Credential(url=server.url, device_id="dev-1", token=server.token, kind="bridge", name="desk")


async def test_the_daemon_stores_every_item_dispatches_known_kinds_and_answers_ping(tmp_path, core):
    handled = []

    async def on_answer(daemon, seq, payload):
        handled.append((seq, payload))

    core.register_kind("mobile.answer", on_answer)
    core.add_capability("test_cap")
    async with FakeTunnelServer() as server:
        server.items = [(1, "mobile.answer", {"q": 1}), (2, "unknown.kind", {"x": 2}), (3, "mobile.answer", {"q": 3})]
        daemon = BridgeDaemon(tmp_path, credential(server))
        task = asyncio.ensure_future(daemon.run())
        await until(lambda: server.acked == 3)
        await server.request("bridge.ping", {}, "p1")
        await server.request("bridge.nope", {}, "p2")
        await until(lambda: len(server.responses) == 2)
        assert await daemon.call("mobile.session_start", {"session_id": "s"}) == {
            "echo": {"session_id": "s"}, "method": "mobile.session_start"}
        daemon.stop()
        assert await asyncio.wait_for(task, 10) == 0
    assert handled == [(1, {"q": 1}), (3, {"q": 3})]
    answers = {r["id"]: r for r in server.responses}
    assert answers["p1"]["result"]["pong"] is True
    assert answers["p2"]["error"]["code"] == protocol.METHOD_NOT_FOUND
    assert server.hellos[0]["kind"] == "bridge" and server.hellos[0]["ackedSeq"] == 0
    assert server.hellos[0]["capabilities"] == ["test_cap"]
    inbox = Inbox(tmp_path / "bridge.sqlite3", "dev-1")
    assert [(s, k) for s, k, _ in inbox.items()] == [(1, "mobile.answer"), (2, "unknown.kind"), (3, "mobile.answer")]
    assert inbox.unhandled() == []
    inbox.close()


async def test_items_stored_before_a_crash_are_handled_on_restart(tmp_path, core):
    handled = []

    async def on_message(daemon, seq, payload):
        handled.append(seq)

    core.register_kind("mobile.message", on_message)
    inbox = Inbox(tmp_path / "bridge.sqlite3", "dev-1")
    inbox.record(1, "mobile.message", {"text": "hi"})  # the crash came before the handler ran
    inbox.close()
    async with FakeTunnelServer() as server:
        daemon = BridgeDaemon(tmp_path, credential(server))
        task = asyncio.ensure_future(daemon.run())
        await until(lambda: server.hellos)
        daemon.stop()
        await asyncio.wait_for(task, 10)
    assert handled == [1] and server.hellos[0]["ackedSeq"] == 1


async def cli(*args: str, timeout: float = 30) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "clients.bridge", *args, cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout)
    return process.returncode, out.decode(), err.decode()


async def test_run_exits_3_with_the_revoke_message(tmp_path):
    async with FakeTunnelServer() as server:
        save_credential(tmp_path, credential(server))
        server.close_on_connect = protocol.CLOSE_REVOKED
        code, out, err = await cli("--home", str(tmp_path), "run")
    assert code == 3, err
    assert "revoked by its owner; pair it again" in err


async def test_run_and_status_without_a_pairing(tmp_path):
    code, _, err = await cli("run", "--home", str(tmp_path))
    assert code == 2 and "not paired" in err
    code, out, _ = await cli("--home", str(tmp_path), "status")
    assert code == 1 and "paired: no" in out


async def test_status_shows_the_pairing_and_the_running_daemon(tmp_path):
    async with FakeTunnelServer() as server:
        save_credential(tmp_path, credential(server))
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "clients.bridge", "--home", str(tmp_path), "run", cwd=ROOT,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
        try:
            await until(lambda: server.connected.is_set(), timeout=20)
            code, out, _ = await cli("--home", str(tmp_path), "status")
            assert code == 0
            assert "paired: yes" in out and "device id: dev-1" in out and f"url: {server.url}" in out
            assert f"daemon: running (pid {process.pid})" in out
            code, _, err = await cli("--home", str(tmp_path), "run")
            assert code == 1 and "already running" in err
        finally:
            process.terminate()
            assert await asyncio.wait_for(process.wait(), 15) == 0  # SIGTERM is a clean stop
    code, out, _ = await cli("--home", str(tmp_path), "status")
    assert "daemon: not running" in out


async def test_pair_saves_a_private_credential(tmp_path):
    with FakePairingServer(token_answers=[pending(), approved()], interval=1) as server:
        started = time.monotonic()
        code, out, err = await cli("--home", str(tmp_path / "h"), "pair", server.url, "--name", "my desk")
        assert code == 0, err
        assert time.monotonic() - started >= 2  # two polls, one interval apart
        assert "code: BCDF-GHJK" in out and "paired as device" in out
        assert server.grant_requests[0]["name"] == "my desk" and server.grant_requests[0]["kind"] == "bridge"
        cred = load_credential(tmp_path / "h")
        assert cred.token == "t" * 43 and cred.url == server.url
        assert stat.S_IMODE((tmp_path / "h" / "credential.json").stat().st_mode) == 0o600
        code, _, err = await cli("--home", str(tmp_path / "h"), "pair", server.url)
        assert code == 2 and "--force" in err
        assert json.loads((tmp_path / "h" / "credential.json").read_text())["token"] == "t" * 43


async def test_pair_denied_saves_nothing(tmp_path):
    with FakePairingServer(token_answers=[(400, {"error": "access_denied"})], interval=1) as server:
        code, _, err = await cli("--home", str(tmp_path), "pair", server.url)
    assert code == 1 and "denied" in err
    assert load_credential(tmp_path) is None


@pytest.mark.parametrize("argv", [["--help"], ["pair", "--help"], ["run", "--help"], ["status", "--help"]])
async def test_help(argv):
    code, out, _ = await cli(*argv)
    assert code == 0 and "--home" in out


def test_pruning_old_items_keeps_the_applied_seq(tmp_path):
    inbox = Inbox(tmp_path / "bridge.sqlite3", "dev-a")
    inbox.record(1, "k", {})
    inbox.record(2, "k", {})
    inbox.mark_handled(1)
    assert inbox.prune(older_than_sec=0) == 1  # 2 is not handled yet: kept
    assert [seq for seq, _, _ in inbox.items()] == [2] and inbox.applied_seq() == 2
    inbox.close()
    assert Inbox(tmp_path / "bridge.sqlite3", "dev-a").applied_seq() == 2


async def test_a_dropped_connection_does_not_cut_a_handler_off(tmp_path, core):
    release = asyncio.Event()
    finished = []

    async def slow(daemon, seq, payload):
        await release.wait()
        finished.append(seq)

    core.register_kind("mobile.answer", slow)
    async with FakeTunnelServer() as server:
        server.items = [(1, "mobile.answer", {})]
        daemon = BridgeDaemon(tmp_path, credential(server))
        task = asyncio.ensure_future(daemon.run())
        await until(lambda: daemon.inbox is not None and daemon.inbox.applied_seq() == 1)
        server.current.transport.abort()  # the line drops while the handler waits
        await until(lambda: len(server.hellos) == 2, message="reconnect")
        release.set()
        await until(lambda: finished == [1])
        await until(lambda: daemon.inbox.unhandled() == [])
        daemon.stop()
        await asyncio.wait_for(task, 10)
    assert server.hellos[1]["ackedSeq"] == 1
