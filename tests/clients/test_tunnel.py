"""The client tunnel against a fake platform: resume, exactly-once delivery, final closes, heartbeats,
requests in both directions, and calls retried with the same id across a reconnect."""

from __future__ import annotations

import asyncio
import time

import pytest

from clients import protocol
from clients.common.tunnel import (
    FinalCloseError,
    MethodNotFound,
    RemoteError,
    RequestError,
    Tunnel,
    backoff_delay,
    tunnel_url,
)
from tests.clients.fakes import FakeTunnelServer


async def until(condition, timeout: float = 5.0, message: str = ""):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {message or condition}")


class Device:
    """A device that records applied items in memory, as the bridge's inbox does on disk."""

    def __init__(self, applied: int = 0) -> None:
        self.applied = applied
        self.seen: list[int] = []

    def applied_seq(self) -> int:
        return self.applied

    async def on_deliver(self, seq: int, kind: str, payload: dict) -> None:
        self.seen.append(seq)
        self.applied = seq

    def tunnel(self, server: FakeTunnelServer, **kwargs) -> Tunnel:
        kwargs.setdefault("backoff_base", 0.01)
        kwargs.setdefault("backoff_cap", 0.05)
        return Tunnel(server.url, kwargs.pop("token", "good-token"), hello={"kind": "bridge", "version": "t"},
                      applied_seq=self.applied_seq, on_deliver=self.on_deliver, **kwargs)


def start(tunnel: Tunnel) -> asyncio.Task:
    return asyncio.ensure_future(tunnel.run())


async def finish(tunnel: Tunnel, task: asyncio.Task) -> None:
    tunnel.stop()
    await asyncio.wait_for(task, 10)


def test_urls_map_http_to_ws_and_add_the_tunnel_path():
    assert tunnel_url("http://127.0.0.1:8000") == "ws://127.0.0.1:8000/ws/device"
    assert tunnel_url("https://ai1net.example/") == "wss://ai1net.example/ws/device"
    assert tunnel_url("https://ai1net.example/base") == "wss://ai1net.example/base/ws/device"
    with pytest.raises(ValueError):
        tunnel_url("ftp://example")


def test_backoff_is_full_jitter_bounded_by_the_cap():
    assert backoff_delay(0, base=0.5, cap=60, spread=0, rng=lambda: 0.999) == pytest.approx(0.4995)
    assert backoff_delay(3, base=0.5, cap=60, spread=0, rng=lambda: 1.0) == 4.0
    assert backoff_delay(50, base=0.5, cap=60, rng=lambda: 1.0) == 60.0
    assert backoff_delay(50, base=0.5, cap=60, rng=lambda: 0.0) == 0.0
    delays = [backoff_delay(10, base=0.5, cap=60) for _ in range(200)]
    assert all(0 <= d < 60 for d in delays) and len(set(delays)) > 150


def test_backoff_window_is_the_reconnect_spread_then_doubles():
    # A fleet that lost the platform together comes back over the spread (5 s), not within 0.5 s, and
    # none waits long through a restart; a long outage is tried less and less often.
    assert [backoff_delay(n, rng=lambda: 1.0) for n in (0, 3, 6, 7, 8, 9, 10, 50)] == [5, 5, 5, 10, 20, 40, 60, 60]
    assert backoff_delay(0, cap=1, rng=lambda: 1.0) == 1.0  # the cap still rules (tests set it low)
    delays = [backoff_delay(0) for _ in range(2000)]
    assert max(delays) < 5.0 and sum(d < 1.0 for d in delays) < 2000 * 0.3


async def test_hello_resumes_from_the_applied_seq_with_the_token_in_the_header():
    async with FakeTunnelServer() as server:
        server.add_items(5)
        device = Device(applied=2)
        tunnel = device.tunnel(server)
        task = start(tunnel)
        await until(lambda: server.acked == 5, message="ack of 5")
        await finish(tunnel, task)
    assert server.hellos[0]["ackedSeq"] == 2 and server.hellos[0]["protocolVersion"] == protocol.PROTOCOL_VERSION
    assert device.seen == [3, 4, 5]
    assert server.handshakes[0]["path"] == "/ws/device"
    assert server.handshakes[0]["authorization"] == "Bearer good-token"
    assert tunnel.device_id == "dev-1"
    assert server.close_codes[-1] == protocol.CLOSE_NORMAL


async def test_redelivered_items_are_acked_but_applied_once_across_reconnects():
    async with FakeTunnelServer() as server:
        server.add_items(3)
        device = Device()
        tunnel = device.tunnel(server)
        task = start(tunnel)
        await until(lambda: server.acked == 3)
        # The platform resends old items (as after a lost ack), then drops the line without a close frame.
        server.acked = 1
        await server.deliver_new()
        await until(lambda: server.acked == 3)
        server.current.transport.abort()
        await until(lambda: tunnel.connections == 2, message="reconnect")
        assert server.hellos[-1]["ackedSeq"] == 3
        server.add_items(2)
        await server.deliver_new()
        await until(lambda: server.acked == 5)
        await finish(tunnel, task)
    assert device.seen == [1, 2, 3, 4, 5]


async def test_a_failing_on_deliver_is_not_acked_and_comes_again():
    async with FakeTunnelServer() as server:
        server.add_items(3)
        device = Device()
        failures = []

        async def flaky(seq, kind, payload):
            if seq == 2 and not failures:
                failures.append(seq)
                raise OSError("disk full")
            await Device.on_deliver(device, seq, kind, payload)

        tunnel = device.tunnel(server)
        tunnel.on_deliver = flaky
        task = start(tunnel)
        await until(lambda: server.acked == 3)
        await finish(tunnel, task)
    assert failures == [2] and device.seen == [1, 2, 3] and len(server.hellos) == 2


@pytest.mark.parametrize("code", [protocol.CLOSE_UNAUTHORIZED, protocol.CLOSE_REVOKED])
async def test_4401_and_4403_are_final(code):
    async with FakeTunnelServer() as server:
        server.close_on_connect = code
        tunnel = Device().tunnel(server)
        with pytest.raises(FinalCloseError) as info:
            await asyncio.wait_for(tunnel.run(), 10)
    assert info.value.code == code
    assert len(server.handshakes) == 1  # no retry
    if code == protocol.CLOSE_REVOKED:
        assert "revoked by its owner" in str(info.value)


async def test_a_wrong_token_is_final():
    async with FakeTunnelServer() as server:
        tunnel = Device().tunnel(server, token="stale")
        with pytest.raises(FinalCloseError) as info:
            await asyncio.wait_for(tunnel.run(), 10)
    assert info.value.code == protocol.CLOSE_UNAUTHORIZED and "pair this device again" in str(info.value)


async def test_other_close_codes_reconnect_with_backoff():
    async with FakeTunnelServer() as server:
        server.close_on_connect = protocol.CLOSE_PROTOCOL_ABUSE
        tunnel = Device().tunnel(server)
        task = start(tunnel)
        await until(lambda: len(server.handshakes) >= 3, message="retries")
        server.close_on_connect = None
        await until(lambda: tunnel.connected.is_set())
        await finish(tunnel, task)


async def test_a_platform_that_closes_after_the_upgrade_keeps_the_websocket(monkeypatch):
    # 1011 while the platform's Redis restarts: the WebSocket gets through, so no fall back to long
    # polling (which would keep the bridge off the WebSocket for ws_retry_sec, 60 s by default).
    fallbacks = []

    async def no_longpoll(self) -> bool:
        fallbacks.append(self.ws_url)
        return False

    monkeypatch.setattr(Tunnel, "_longpoll_mode", no_longpoll)
    async with FakeTunnelServer() as server:
        server.close_on_connect = 1011
        tunnel = Device().tunnel(server, longpoll=True)
        task = start(tunnel)
        await until(lambda: len(server.handshakes) >= 5, message="retries")
        server.close_on_connect = None
        await until(lambda: tunnel.connected.is_set())
        await finish(tunnel, task)
    assert fallbacks == []


async def test_heartbeats_are_sent_and_a_silent_platform_is_dropped():
    async with FakeTunnelServer(heartbeat_sec=0.2) as server:
        server.silent = True  # the fake never sends heartbeats of its own
        tunnel = Device().tunnel(server)
        task = start(tunnel)
        await until(lambda: server.heartbeats >= 2, message="heartbeats")
        await until(lambda: len(server.hellos) >= 2, timeout=5, message="reconnect after silence")
        await finish(tunnel, task)
    assert server.close_codes[0] == protocol.CLOSE_HEARTBEAT_TIMEOUT


async def test_a_platform_that_talks_keeps_the_tunnel():
    async with FakeTunnelServer(heartbeat_sec=0.2) as server:
        tunnel = Device().tunnel(server)
        task = start(tunnel)
        await until(lambda: tunnel.connected.is_set())
        deadline = time.monotonic() + 1.5  # > 3 x heartbeat
        while time.monotonic() < deadline:
            await server.current.send(protocol.notification(protocol.HEARTBEAT))
            await asyncio.sleep(0.1)
        assert len(server.hellos) == 1
        await finish(tunnel, task)


async def test_call_is_resent_with_the_same_id_after_a_reconnect():
    async with FakeTunnelServer() as server:
        def drop_first(ws, message):
            if len(server.requests) == 1:
                ws.transport.abort()  # lost before the answer
                return None
            return protocol.result(message["id"], {"ok": message["params"]["n"]})

        server.on_request = drop_first
        tunnel = Device().tunnel(server)
        task = start(tunnel)
        await until(lambda: tunnel.connected.is_set())
        assert await tunnel.call("mobile.question", {"n": 7}, timeout=10) == {"ok": 7}
        await finish(tunnel, task)
    assert len(server.requests) == 2 and server.requests[0]["id"] == server.requests[1]["id"]


async def test_call_waits_for_the_tunnel_and_surfaces_remote_errors():
    async with FakeTunnelServer() as server:
        server.on_request = lambda ws, m: protocol.error(m["id"], protocol.APPLICATION_ERROR, "off",
                                                        {"code": "mobile_reply_off", "detail": "off"})
        tunnel = Device().tunnel(server)
        call = asyncio.ensure_future(tunnel.call("mobile.question", {}, timeout=10))  # before connecting
        task = start(tunnel)
        with pytest.raises(RemoteError) as info:
            await call
        assert info.value.app_code == "mobile_reply_off" and info.value.code == protocol.APPLICATION_ERROR
        with pytest.raises(asyncio.TimeoutError):
            server.on_request = lambda ws, m: None
            await tunnel.call("never.answered", {}, timeout=0.2)
        with pytest.raises(ValueError, match="larger than"):
            await tunnel.call("too.big", {"blob": "x" * protocol.MAX_FRAME_BYTES}, timeout=1)
        await finish(tunnel, task)


async def test_platform_requests_are_answered_and_errors_mapped():
    async def on_request(method, params):
        if method == "probe.read":
            return {"text": params["path"]}
        if method == "probe.denied":
            raise RequestError("outside the allow-list", data={"code": "path_denied"})
        if method == "probe.crash":
            raise ZeroDivisionError("boom")
        raise MethodNotFound(method)

    async with FakeTunnelServer() as server:
        tunnel = Device().tunnel(server, on_request=on_request)
        task = start(tunnel)
        await until(lambda: tunnel.connected.is_set())
        for n, method in enumerate(["probe.read", "probe.denied", "probe.crash", "probe.nope"]):
            await server.request(method, {"path": "/etc/hosts"}, f"r{n}")
        await until(lambda: len(server.responses) == 4)
        await finish(tunnel, task)
    answers = {r["id"]: r for r in server.responses}
    assert answers["r0"]["result"] == {"text": "/etc/hosts"}
    assert answers["r1"]["error"]["code"] == protocol.APPLICATION_ERROR
    assert answers["r1"]["error"]["data"] == {"code": "path_denied"}
    assert answers["r2"]["error"]["code"] == protocol.INTERNAL_ERROR and "boom" in answers["r2"]["error"]["message"]
    assert answers["r3"]["error"]["code"] == protocol.METHOD_NOT_FOUND


async def test_unreachable_platform_keeps_retrying_until_stopped():
    device = Device()
    tunnel = Tunnel("http://127.0.0.1:9", "x", hello={}, applied_seq=device.applied_seq,
                    on_deliver=device.on_deliver, backoff_base=0.01, backoff_cap=0.02)
    task = start(tunnel)
    await asyncio.sleep(0.2)
    assert not task.done()
    await finish(tunnel, task)
