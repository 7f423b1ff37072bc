"""The bridge's side of device web on its own, against a platform that asks for what it must not get:
the device forwards only to 127.0.0.1 and only to the ports its owner exposed."""

from __future__ import annotations

import asyncio
import base64
import json
import sys
import uuid

import pytest
from websockets.asyncio.server import serve

from clients import protocol
from clients.bridge.web import HttpStream, WebForwarder
from clients.common.credentials import Credential, save_credential
from tests.deviceweb.support import client_env, web_port
from tests.e2e_support import Process

TOKEN = "test-token"


class TrickedPlatform:
    """A tunnel endpoint that says hello and then sends whatever web.* frames the test crafts."""

    def __init__(self) -> None:
        self.frames: asyncio.Queue = asyncio.Queue()
        self.ws = None
        self.hello: dict = {}
        self.connected = asyncio.Event()

    async def handle(self, ws) -> None:
        if ws.request.headers.get("Authorization") != f"Bearer {TOKEN}":
            await ws.close(protocol.CLOSE_UNAUTHORIZED)
            return
        hello = protocol.parse(await ws.recv())
        self.hello = hello["params"]
        await ws.send(protocol.result(hello["id"], {"deviceId": "d1", "heartbeatSec": 20, "protocolVersion": 1,
                                                    "resendFrom": 1}))
        self.ws = ws
        self.connected.set()
        async for text in ws:
            message = protocol.parse(text)
            if message.get("method", "").startswith("web."):
                await self.frames.put(message)

    async def open(self, frame: str, **params) -> str:
        stream = uuid.uuid4().hex
        await self.ws.send(protocol.notification(frame, dict(params, stream=stream)))
        return stream

    async def next_for(self, stream: str, timeout: float = 10) -> dict:
        while True:
            message = await asyncio.wait_for(self.frames.get(), timeout)
            if message["params"].get("stream") == stream:
                return message


async def listener(port: int, seen: list) -> asyncio.AbstractServer:
    async def on_connect(reader, writer) -> None:
        seen.append(port)
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello")
        await writer.drain()
        writer.close()

    return await asyncio.start_server(on_connect, "127.0.0.1", port)


@pytest.mark.e2e
async def test_a_real_bridge_refuses_an_undeclared_port_even_when_the_platform_asks(tmp_path):
    exposed = web_port()
    other = web_port(avoid={exposed})
    seen: list[int] = []
    servers = [await listener(exposed, seen), await listener(other, seen)]
    platform = TrickedPlatform()
    async with serve(platform.handle, "127.0.0.1", 0, max_size=protocol.MAX_FRAME_BYTES) as tunnel_server:
        url = f"http://127.0.0.1:{tunnel_server.sockets[0].getsockname()[1]}"
        home = tmp_path / "home"
        save_credential(home, Credential(url=url, device_id="d1", token=TOKEN, kind="bridge", name="desk"))
        bridge = Process([sys.executable, "-m", "clients.bridge", "--home", str(home), "run", "--expose", str(exposed)],
                         tmp_path / "bridge.log", env=client_env())
        try:
            await asyncio.wait_for(platform.connected.wait(), 30)
            assert platform.hello["ports"] == [exposed] and "device_web" in platform.hello["capabilities"]
            request = {"method": "GET", "path": "/", "query": "", "headers": [], "body": False}

            stream = await platform.open(protocol.WEB_OPEN, port=other, **request)
            reset = await platform.next_for(stream)
            assert reset["method"] == protocol.WEB_RESET
            assert reset["params"]["reason"] == protocol.WEB_RESET_PORT_NOT_EXPOSED
            stream = await platform.open(protocol.WEB_WS_OPEN, port=other, path="/", query="", headers=[])
            assert (await platform.next_for(stream))["params"]["reason"] == protocol.WEB_RESET_PORT_NOT_EXPOSED
            stream = await platform.open(protocol.WEB_OPEN, port=22, **request)  # not even in 20000-20999
            assert (await platform.next_for(stream))["params"]["reason"] == protocol.WEB_RESET_PORT_NOT_EXPOSED
            # Request smuggling through the path or a header is refused too.
            stream = await platform.open(protocol.WEB_OPEN, **dict(request, port=exposed, path="/ HTTP/1.1\r\nX: y"))
            assert (await platform.next_for(stream))["params"]["reason"] == protocol.WEB_RESET_BAD_REQUEST
            stream = await platform.open(protocol.WEB_OPEN, **dict(request, port=exposed,
                                                                   headers=[["X-A", "1\r\nHost: evil"]]))
            assert (await platform.next_for(stream))["params"]["reason"] == protocol.WEB_RESET_BAD_REQUEST
            assert seen == []  # nothing reached either local server

            stream = await platform.open(protocol.WEB_OPEN, port=exposed, **request)
            response = await platform.next_for(stream)
            assert response["method"] == protocol.WEB_RESPONSE and response["params"]["status"] == 200
            data = await platform.next_for(stream)
            assert base64.b64decode(data["params"]["data"]) == b"hello"
            assert (await platform.next_for(stream))["method"] == protocol.WEB_END
            assert seen == [exposed]

            audit = [json.loads(line) for line in (home / "audit.jsonl").read_text().splitlines()]
            refused = [entry for entry in audit if entry["event"] == "web.refused"]
            assert [entry["port"] for entry in refused] == [other, other, 22]
        finally:
            bridge.stop()
            for server in servers:
                server.close()


async def test_credit_bounds_what_the_device_sends_and_a_slow_platform_stalls_one_stream():
    """Without credit back, a stream stops at the window; another stream on the same tunnel goes on."""
    port = web_port()
    size = 5 * protocol.WEB_WINDOW_BYTES

    async def big(reader, writer) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
        for _ in range(size // 65536):
            writer.write(b"x" * 65536)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(big, "127.0.0.1", port)
    sent: list[tuple[str, dict]] = []
    progress = asyncio.Event()

    async def notify(method: str, params: dict, generation: int) -> bool:
        sent.append((method, params))
        progress.set()
        return True

    forwarder = WebForwarder([port], notify, lambda: 1)
    request = {"method": "GET", "path": "/", "query": "", "headers": [], "body": False, "port": port}
    try:
        forwarder.handle(protocol.WEB_OPEN, dict(request, stream="slow"))
        forwarder.handle(protocol.WEB_OPEN, dict(request, stream="fast"))

        def data_bytes(stream: str) -> int:
            return sum(len(base64.b64decode(p["data"])) for m, p in sent if m == protocol.WEB_DATA and p["stream"] == stream)

        async def until(condition) -> None:
            while not condition():
                progress.clear()
                await asyncio.wait_for(progress.wait(), 10)

        # The "fast" stream gets credit for each frame as it arrives; "slow" never does.
        credited = 0
        while not any(m == protocol.WEB_END and p["stream"] == "fast" for m, p in sent):
            fast = [p for m, p in sent if m == protocol.WEB_DATA and p["stream"] == "fast"]
            for params in fast[credited:]:
                cost = protocol.web_frame_cost(len(base64.b64decode(params["data"])))
                forwarder.handle(protocol.WEB_CREDIT, {"stream": "fast", "bytes": cost})
            if len(fast) == credited:
                progress.clear()
                await asyncio.wait_for(progress.wait(), 10)
            credited = len(fast)
        await until(lambda: any(m == protocol.WEB_END and p["stream"] == "fast" for m, p in sent))
        assert data_bytes("fast") == size

        def slow_cost() -> int:
            return sum(protocol.web_frame_cost(len(base64.b64decode(p["data"])))
                       for m, p in sent if m == protocol.WEB_DATA and p["stream"] == "slow")

        # "slow" used up its window and stopped there, without an end: it waits for credit.
        await until(lambda: slow_cost() > protocol.WEB_WINDOW_BYTES - protocol.WEB_CHUNK_BYTES)
        assert slow_cost() <= protocol.WEB_WINDOW_BYTES < size
        assert not any(m == protocol.WEB_END and p["stream"] == "slow" for m, p in sent)
    finally:
        await forwarder.close()
        server.close()


async def test_a_platform_that_ignores_credit_gets_its_stream_reset_not_the_memory_filled():
    port = web_port()
    connected = asyncio.Event()

    async def never_reads(reader, writer) -> None:
        connected.set()
        await asyncio.sleep(30)
        writer.close()

    server = await asyncio.start_server(never_reads, "127.0.0.1", port)
    sent: list[tuple[str, dict]] = []
    got_reset = asyncio.Event()

    async def notify(method: str, params: dict, generation: int) -> bool:
        sent.append((method, params))
        if method == protocol.WEB_RESET:
            got_reset.set()
        return True

    forwarder = WebForwarder([port], notify, lambda: 1)
    try:
        forwarder.handle(protocol.WEB_OPEN, {"stream": "s", "method": "POST", "path": "/", "query": "", "port": port,
                                             "headers": [["content-length", str(8 * protocol.WEB_WINDOW_BYTES)]],
                                             "body": True})
        await asyncio.wait_for(connected.wait(), 10)
        chunk = base64.b64encode(b"x" * protocol.WEB_CHUNK_BYTES).decode()
        frames = 2 * protocol.WEB_WINDOW_BYTES // protocol.WEB_CHUNK_BYTES  # twice the window, all at once
        for seq in range(frames):
            forwarder.handle(protocol.WEB_DATA, {"stream": "s", "seq": seq, "data": chunk})
        await asyncio.wait_for(got_reset.wait(), 10)
        reset = [p for m, p in sent if m == protocol.WEB_RESET][0]
        assert reset["reason"] == protocol.WEB_RESET_FLOW
        assert "s" not in forwarder.streams  # the stream and its queue are gone
    finally:
        await forwarder.close()
        server.close()


def recording_forwarder(port: int) -> tuple[WebForwarder, list[tuple[str, dict]]]:
    """A forwarder to ``port`` and the list of (method, params) it sends the platform."""
    sent: list[tuple[str, dict]] = []

    async def notify(method: str, params: dict, generation: int) -> bool:
        sent.append((method, params))
        return True

    return WebForwarder([port], notify, lambda: 1), sent


async def _get(forwarder: WebForwarder, sent: list, port: int, stream: str, method: str = "GET") -> dict:
    """One request through the forwarder (text frames); the device's last frame of the stream."""
    forwarder.handle(protocol.WEB_OPEN, {"stream": stream, "method": method, "path": "/", "query": "", "port": port,
                                         "headers": [], "body": False})
    deadline = asyncio.get_running_loop().time() + 10
    while True:
        last = [(m, p) for m, p in sent if p.get("stream") == stream and m in (protocol.WEB_END, protocol.WEB_RESET)]
        if last:
            return {"method": last[0][0], "params": last[0][1],
                    "body": b"".join(base64.b64decode(p["data"]) for m, p in sent
                                     if m == protocol.WEB_DATA and p["stream"] == stream)}
        assert asyncio.get_running_loop().time() < deadline, "no end of the stream"
        await asyncio.sleep(0.01)


async def test_a_local_server_that_keeps_connections_serves_the_next_request_on_the_same_one():
    """GETs reuse a kept connection; a POST, and a response that says close, do not; a kept connection the
    server closed meanwhile costs nothing but a new one (the GET goes again)."""
    port = web_port()
    connections: list[int] = []
    requests: list[bytes] = []
    close_next = {"flag": False}

    async def keep_alive(reader, writer) -> None:
        connections.append(1)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                requests.append(head)
                if close_next["flag"]:  # answers nothing: a connection closed while it was idle
                    close_next["flag"] = False
                    writer.close()
                    return
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(keep_alive, "127.0.0.1", port)
    forwarder, sent = recording_forwarder(port)
    try:
        for i in range(3):
            end = await _get(forwarder, sent, port, f"g{i}")
            assert end["method"] == protocol.WEB_END and end["body"] == b"hello"
        assert len(connections) == 1 and len(requests) == 3
        assert all(b"connection: close" not in r.lower() for r in requests)

        close_next["flag"] = True  # the kept connection dies with the next request on it
        end = await _get(forwarder, sent, port, "retried")
        assert end["method"] == protocol.WEB_END and end["body"] == b"hello"
        assert len(connections) == 2 and len(requests) == 5  # the request went twice, answered once

        end = await _get(forwarder, sent, port, "post", method="POST")  # not repeatable: its own connection
        assert end["method"] == protocol.WEB_END
        assert len(connections) == 3 and b"connection: close" in requests[-1].lower()
    finally:
        await forwarder.close()
        server.close()


async def test_a_response_that_says_close_is_not_kept():
    port = web_port()
    seen: list[int] = []
    server = await listener(port, seen)  # answers "Connection: close" and closes
    forwarder, sent = recording_forwarder(port)
    try:
        for i in range(2):
            end = await _get(forwarder, sent, port, f"s{i}")
            assert end["method"] == protocol.WEB_END and end["body"] == b"hello"
        assert len(seen) == 2
        assert not forwarder.connections.idle
    finally:
        await forwarder.close()
        server.close()


async def test_a_stream_cancelled_in_the_turn_its_wait_ends_still_ends():
    """asyncio.wait_for (before 3.12) lost such a cancellation: the stream went on, waiting for credit for
    IDLE_TIMEOUT (five minutes) after the platform had reset it."""
    async def at_once() -> str:  # as reader.ready() when data waits already
        return "here"

    forwarder, _ = recording_forwarder(web_port())
    stream = HttpStream(forwarder, "s", {"port": 0})
    waiting = asyncio.ensure_future(stream._wait(at_once, "anything"))
    await asyncio.sleep(0)  # the stream waits; what it waits for ends in the next turn of the loop ...
    waiting.cancel()  # ... the same turn as this cancellation
    await asyncio.gather(waiting, return_exceptions=True)
    assert waiting.cancelled()
