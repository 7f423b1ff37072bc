"""Device web end to end, the hard parts: bounded memory for a 200 MB body on both ends, a slow reader
that stalls only its own stream, a WebSocket echo, many requests at once, tenant isolation."""

from __future__ import annotations

import asyncio
import hashlib
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from clients import protocol
from tests.deviceweb.support import Bridge, Upstream, browser, enable_device_web, rss_kib
from tests.deviceweb.upstream import pattern

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

MIB = 1024 * 1024


def expected_sha256(n: int) -> str:
    digest = hashlib.sha256()
    for piece in pattern(n):
        digest.update(piece)
    return digest.hexdigest()


@pytest.mark.slow
def test_a_200_mb_download_streams_with_bounded_memory_on_both_ends(stack, user, password):
    server, upstream, bridge, _ = stack
    url = f"{bridge.prefix}/{upstream.port}/bytes"
    size = 200 * MIB
    with browser(server, user.username, password, timeout=120) as web:
        assert len(web.get(url, params={"n": 8 * MIB}).content) == 8 * MIB  # warm both processes up
        base = {"daphne": rss_kib(server.popen.pid), "bridge": rss_kib(bridge.popen.pid)}
        peak = dict(base)
        digest, received, started = hashlib.sha256(), 0, time.monotonic()
        with web.stream("GET", url, params={"n": size}) as response:
            assert response.status_code == 200 and response.headers["content-length"] == str(size)
            for chunk in response.iter_bytes(256 * 1024):
                digest.update(chunk)
                received += len(chunk)
                if received % (8 * MIB) < len(chunk):
                    peak["daphne"] = max(peak["daphne"], rss_kib(server.popen.pid))
                    peak["bridge"] = max(peak["bridge"], rss_kib(bridge.popen.pid))
        elapsed = time.monotonic() - started
    assert received == size and digest.hexdigest() == expected_sha256(size)
    growth = {name: (peak[name] - base[name]) / 1024 for name in base}
    print(f"200 MiB in {elapsed:.1f}s ({size / MIB / elapsed:.0f} MiB/s); RSS growth MiB: {growth}", file=sys.stderr)
    assert growth["daphne"] < 64 and growth["bridge"] < 64, growth


def test_a_slow_reader_stalls_its_own_stream_not_the_tunnel(stack, user, password):
    server, upstream, bridge, _ = stack
    size = 100 * MIB
    with browser(server, user.username, password) as web:
        cookie = "; ".join(f"{name}={value}" for name, value in web.cookies.items())
        base = rss_kib(server.popen.pid)
        # A browser that asks for 100 MB and then reads nothing.
        slow = socket.create_connection(("127.0.0.1", server.port))
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        slow.sendall(f"GET {bridge.prefix}/{upstream.port}/bytes?n={size} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
                     f"Cookie: {cookie}\r\nAccept: */*\r\n\r\n".encode())
        try:
            assert slow.recv(16).startswith(b"HTTP/1.1 200")
            # Meanwhile the same tunnel keeps serving other requests promptly.
            peak = base
            for _ in range(20):
                started = time.monotonic()
                response = web.get(f"{bridge.prefix}/{upstream.port}/small")
                assert response.status_code == 200 and response.text == "ok"
                assert time.monotonic() - started < 2
                peak = max(peak, rss_kib(server.popen.pid))
            assert (peak - base) / 1024 < 32, "daphne buffered the stalled stream"
            # The stalled stream then completes, intact.
            digest, received = hashlib.sha256(), 0
            slow.settimeout(60)
            data = b""
            while b"\r\n\r\n" not in data:
                data += slow.recv(65536)
            body = data.split(b"\r\n\r\n", 1)[1]
            while True:
                digest.update(body)
                received += len(body)
                if received >= size:
                    break
                body = slow.recv(1024 * 1024)
                assert body, "the stream broke off"
            assert received == size and digest.hexdigest() == expected_sha256(size)
        finally:
            slow.close()


def test_a_browser_that_leaves_mid_download_ends_only_its_stream(stack, user, password):
    """The device is told (web.reset), its late frames are dropped quietly (not counted as abuse), and
    the tunnel stays up for the next request."""
    from devices.models import Device

    server, upstream, bridge, _ = stack
    connections = Device.objects.get(pk=bridge.device.pk).connection_count
    with browser(server, user.username, password) as web:
        for _ in range(5):
            with web.stream("GET", f"{bridge.prefix}/{upstream.port}/bytes", params={"n": 100 * MIB}) as response:
                assert response.status_code == 200
                got = 0
                for chunk in response.iter_raw(65536):
                    got += len(chunk)
                    if got > 3 * MIB:
                        break  # leave: the connection closes with most of the body unsent
        assert web.get(f"{bridge.prefix}/{upstream.port}/small").text == "ok"
    device = Device.objects.get(pk=bridge.device.pk)
    assert device.is_online and device.connection_count == connections  # the same tunnel all along


async def _echo_through(url: str, origin: str, cookie: str) -> None:
    async with asyncio.timeout(60):
        await _echo(url, origin, cookie)


async def _echo(url: str, origin: str, cookie: str) -> None:
    async with connect(url, additional_headers={"Cookie": cookie}, origin=origin, max_size=4 * MIB,
                       open_timeout=20) as ws:
        await ws.send("hello")
        assert await ws.recv() == "hello"
        blob = bytes(range(256)) * (protocol.WEB_WS_MAX_MESSAGE // 256)  # binary, the largest message relayed
        await ws.send(blob)
        assert await ws.recv() == blob
        # Many messages in a row: more than the credit window, delivered in order.
        for i in range(300):
            await ws.send(f"{i}:" + "x" * 10_000)
        for i in range(300):
            assert (await ws.recv()).startswith(f"{i}:")
    async with connect(url, additional_headers={"Cookie": cookie}, origin=origin, max_size=4 * MIB) as ws:
        await ws.send(b"x" * (protocol.WEB_WS_MAX_MESSAGE + 1))  # too large: closed with 4009 (cf. 1009)
        with pytest.raises(ConnectionClosed) as closed:
            await ws.recv()
        assert closed.value.rcvd.code == 4009
    async with connect(url, additional_headers={"Cookie": cookie}, origin=origin) as ws:
        # A close from the local server reaches the browser with its code.
        await ws.send("close:4001")
        with pytest.raises(ConnectionClosed) as closed:
            await ws.recv()
        assert closed.value.rcvd.code == 4001


def test_a_websocket_echo_through_the_tunnel(stack, user, password):
    server, upstream, bridge, _ = stack
    from asgiref.sync import async_to_sync

    with browser(server, user.username, password) as web:
        cookie = f"sessionid={web.cookies['sessionid']}"
    url = f"ws://127.0.0.1:{server.port}{bridge.prefix}/{upstream.ws_port}/echo?room=1"
    async_to_sync(_echo_through)(url, server.url, cookie)


def test_many_requests_at_once_and_tenant_isolation(stack, tmp_path, user, other_user, password):
    server, upstream_a, bridge_a, _ = stack
    enable_device_web(other_user)
    upstream_b = Upstream(tmp_path, name="upstream-b")
    bridge_b = None
    try:
        bridge_b = Bridge(server, other_user, tmp_path / "home-b", [upstream_b.port], name="desk-b")
        a_url = f"{bridge_a.prefix}/{upstream_a.port}"
        b_url = f"{bridge_b.prefix}/{upstream_b.port}"
        with browser(server, user.username, password) as alice, \
                browser(server, other_user.username, password) as bob:
            hits_b = upstream_b.hits()
            # Alice cannot reach Bob's device, by its id or by naming his port on her own device.
            assert alice.get(f"{b_url}/echo").status_code == 404
            assert alice.get(f"{bridge_a.prefix}/{upstream_b.port}/echo").status_code == 502
            assert upstream_b.hits() == hits_b

            # Both at once, many requests each over their one tunnel: every answer from the right service.
            errors: list[str] = []
            lock = threading.Lock()

            def fetch(args: tuple[str, int]) -> None:
                who, n = args
                session, url, port = (alice, a_url, upstream_a.port) if who == "a" else (bob, b_url, upstream_b.port)
                response = session.get(f"{url}/echo/{who}/{n}", headers={"Accept": "application/json"})
                echoed = response.json()
                host = dict((k.lower(), v) for k, v in echoed["headers"])["host"]
                if response.status_code != 200 or echoed["target"] != f"/echo/{who}/{n}" or host != f"127.0.0.1:{port}":
                    with lock:
                        errors.append(f"{who} {n}: {response.status_code} {echoed}")
                big = session.get(f"{url}/bytes", params={"n": 300_000 + n})
                if len(big.content) != 300_000 + n:
                    with lock:
                        errors.append(f"{who} {n}: {len(big.content)} bytes")

            hits_a = upstream_a.hits()
            with ThreadPoolExecutor(16) as pool:
                list(pool.map(fetch, [(who, n) for n in range(20) for who in "ab"]))
            assert errors == []
            assert upstream_a.hits() - hits_a == 40 and upstream_b.hits() - hits_b == 40
    finally:
        if bridge_b is not None:
            bridge_b.stop()
        upstream_b.stop()
