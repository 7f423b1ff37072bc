"""Slow start of a device-web response (clients/protocol.py): a small first credit, the body's first bytes in
the head's frame, the rest of the window granted once the head is out. Both ends, without processes; and the
platform's stream ending when it is cancelled as a frame arrives."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import uuid
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

from clients import protocol
from clients.bridge.web import WebForwarder
from devices.web import http as web_http
from devices.web import streams
from tests.deviceweb.support import web_port

WINDOW = protocol.WEB_BIN_WINDOW_BYTES
FIRST = protocol.web_first_credit(WINDOW)
BODY = bytes(range(256)) * 4096 * 4  # 4 MiB, half the window: enough to show what waits for credit


def cost(payload: bytes) -> int:
    return protocol.web_frame_cost(len(payload), WINDOW)


class Platform:
    """What the forwarder sends the platform: text notifications and binary data frames."""

    def __init__(self) -> None:
        self.text: list[tuple[str, dict]] = []
        self.data: list[tuple[int, str, int, bytes]] = []
        self.progress = asyncio.Event()

    async def notify(self, method: str, params: dict, generation: int) -> bool:
        self.text.append((method, params))
        self.progress.set()
        return True

    async def binary(self, frame: bytes, generation: int) -> bool:
        self.data.append(protocol.parse_web_binary(bytes(frame)))
        self.progress.set()
        return True

    def response(self, stream: str) -> dict | None:
        return next((p for m, p in self.text if m == protocol.WEB_RESPONSE and p["stream"] == stream), None)

    def ended(self, stream: str) -> bool:
        return any(m == protocol.WEB_END and p["stream"] == stream for m, p in self.text)

    async def until(self, condition: Any) -> None:
        while not condition():
            self.progress.clear()
            await asyncio.wait_for(self.progress.wait(), 10)


@contextlib.asynccontextmanager
async def bridge_before(serve: Any) -> AsyncIterator[tuple[Platform, WebForwarder, dict]]:
    """A local server on a device-web port answering with ``serve``, and the bridge's forwarder to it: (what it
    sends the platform, the forwarder, a GET to that port without its stream id)."""
    port = web_port()
    server = await asyncio.start_server(serve, "127.0.0.1", port)
    platform = Platform()
    forwarder = WebForwarder([port], platform.notify, lambda: 1, binary=platform.binary)
    try:
        yield platform, forwarder, {"method": "GET", "path": "/", "query": "", "headers": [], "body": False,
                                    "port": port, "binary": True}
    finally:
        await forwarder.close()
        server.close()


async def test_the_bridge_starts_small_sends_the_first_bytes_with_the_head_and_the_rest_after_the_grant():
    async def serve(reader, writer) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BODY))
        for start in range(0, len(BODY), 65536):
            writer.write(BODY[start:start + 65536])
            await writer.drain()
        writer.close()

    async with bridge_before(serve) as (platform, forwarder, request):
        forwarder.handle(protocol.WEB_OPEN, dict(request, stream="s", first_credit=FIRST))
        await platform.until(lambda: platform.response("s") is not None)
        head = platform.response("s")
        first_bytes = base64.b64decode(head["body"])
        assert "end" not in head and 0 < len(first_bytes) <= protocol.WEB_FIRST_BODY_BYTES
        assert BODY.startswith(first_bytes)

        # Before any credit comes back: no more than the first credit on the wire, and no more than the first
        # credit's worth read ahead from the local server (without the limit it reads ahead two chunks, 2 MiB).
        await asyncio.sleep(0.3)
        assert cost(first_bytes) + sum(cost(f[3]) for f in platform.data) <= FIRST
        stream = forwarder.streams["s"]
        assert stream.held_back is not None and stream.held_back.buffered <= 2 * protocol.WEB_SLOW_START_READ_AHEAD

        # The grant: the rest of the window. The body goes on under the window as usual, seq from 0.
        forwarder.handle(protocol.WEB_CREDIT, {"stream": "s", "bytes": WINDOW - FIRST})
        assert stream.held_back is None
        credited = 0
        while not platform.ended("s"):
            for frame in platform.data[credited:]:
                forwarder.handle(protocol.WEB_CREDIT, {"stream": "s", "bytes": cost(frame[3])})
            credited = len(platform.data)
            await platform.until(lambda seen=credited: platform.ended("s") or len(platform.data) > seen)
        assert [f[2] for f in platform.data] == list(range(len(platform.data)))
        assert first_bytes + b"".join(f[3] for f in platform.data) == BODY

        # A platform that offers no slow start (an older one) gets the head alone and the whole window at once.
        platform.data.clear()
        forwarder.handle(protocol.WEB_OPEN, dict(request, stream="old"))
        await platform.until(lambda: platform.ended("old") or len(platform.data) * protocol.WEB_BIN_CHUNK_BYTES
                             >= len(BODY))
        assert "body" not in platform.response("old")
        assert sum(cost(f[3]) for f in platform.data) > FIRST

        # A first credit too small for one frame: the head goes alone (it does not wait for credit).
        forwarder.handle(protocol.WEB_OPEN, dict(request, stream="tiny", first_credit=1))
        await platform.until(lambda: platform.response("tiny") is not None)
        assert "body" not in platform.response("tiny")


async def test_a_local_server_that_answers_at_once_is_read_no_further_than_the_head_and_the_read_ahead():
    """The whole response is on the socket before the bridge reads its head: reading up to the head stops at
    the longest head plus the slow start's read-ahead (it once read on to the connection's capacity, 2 MiB,
    before the head was parsed), and a head longer than that limit is refused, not waited on forever."""
    responses = [b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY,
                 b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * (2 * protocol.WEB_MAX_HEAD_BYTES) + b"\r\n\r\n"]

    async def serve(reader, writer) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(responses.pop(0))  # at once: the kernel holds what the bridge has not read yet
        await asyncio.sleep(5)
        writer.close()

    async with bridge_before(serve) as (platform, forwarder, request):
        forwarder.handle(protocol.WEB_OPEN, dict(request, stream="s", first_credit=FIRST))
        await platform.until(lambda: platform.response("s") is not None)
        await asyncio.sleep(0.3)
        first_bytes = base64.b64decode(platform.response("s")["body"])
        held = forwarder.streams["s"].held_back
        assert held is not None and 0 < held.buffered
        assert len(first_bytes) + held.buffered <= protocol.WEB_MAX_HEAD_BYTES + protocol.WEB_SLOW_START_READ_AHEAD

        forwarder.handle(protocol.WEB_OPEN, dict(request, stream="long", first_credit=FIRST))
        await platform.until(lambda: any(m == protocol.WEB_RESET and p["stream"] == "long" for m, p in platform.text))
        reset = next(p for m, p in platform.text if m == protocol.WEB_RESET and p["stream"] == "long")
        assert reset["reason"] == protocol.WEB_RESET_UPSTREAM_ERROR


class FakeLink:
    """The platform's link to the device's tunnel, scripted: what the stream sends, what the device answers."""

    window, chunk, binary = WINDOW, protocol.WEB_BIN_CHUNK_BYTES, True

    def __init__(self) -> None:
        self.stream = "s1"
        self.sent: list[tuple[str, dict]] = []
        self.replies: asyncio.Queue = asyncio.Queue()

    async def open(self, method: str, params: dict) -> None:
        self.sent.append((method, params))

    async def frame(self, method: str, params: dict) -> None:
        self.sent.append((method, params))

    async def receive(self) -> dict:
        return await self.replies.get()

    async def close(self, reset_reason: str | None = None, *, drain: bool = False) -> None:
        pass

    def reply(self, method: str, **params: Any) -> None:
        self.replies.put_nowait({"type": "device.stream", "stream": self.stream,
                                 "frame": {"method": method, "params": dict(params, stream=self.stream)}})


async def _browser_sees(monkeypatch, capabilities: list[str], answer: Any) -> tuple[FakeLink, list[dict]]:
    """One GET through devices.web.http.HttpStream to a device with ``capabilities``; ``answer(link)`` plays
    the device. (the link, what went to the browser)."""
    link = FakeLink()

    async def link_to(device: Any) -> FakeLink:
        return link

    monkeypatch.setattr(streams, "link_to", link_to)
    browser: list[dict] = []
    requests = [{"type": "http.request", "body": b"", "more_body": False}]
    disconnected = asyncio.Event()

    async def receive() -> dict:
        if requests:
            return requests.pop()
        await disconnected.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        browser.append(message)

    device = SimpleNamespace(pk=uuid.uuid4(), capabilities=capabilities)
    scope = {"type": "http", "method": "GET", "path": "/d/x/20001/big", "raw_path": b"/d/x/20001/big",
             "query_string": b"", "headers": [(b"host", b"testserver")], "client": ("127.0.0.1", 5)}
    answer(link)
    await asyncio.wait_for(web_http.HttpStream(scope, receive, send, device, 20001).run(), 10)
    disconnected.set()
    return link, browser


async def test_the_platform_offers_slow_start_writes_the_first_bytes_with_the_head_then_grants_the_window(monkeypatch):
    def device(link: FakeLink) -> None:
        link.reply(protocol.WEB_RESPONSE, status=200, reason="OK", headers=[["Content-Length", "11"]],
                   body=base64.b64encode(b"hello").decode())
        link.reply(protocol.WEB_DATA, seq=0, raw=b" world")
        link.reply(protocol.WEB_END)

    capabilities = [protocol.WEB_BINARY_CAPABILITY, protocol.WEB_SLOW_START_CAPABILITY]
    link, browser = await _browser_sees(monkeypatch, capabilities, device)
    assert link.sent[0][0] == protocol.WEB_OPEN
    assert link.sent[0][1]["first_credit"] == FIRST
    assert browser[0]["type"] == "http.response.start" and browser[0]["status"] == 200
    assert [m["body"] for m in browser[1:]] == [b"hello", b" world", b""]  # the first bytes with the head
    assert browser[-1]["more_body"] is False
    assert (protocol.WEB_CREDIT, {"bytes": WINDOW - FIRST}) in link.sent

    # A device without the capability (an older bridge): no first credit offered, none granted.
    def old_device(link: FakeLink) -> None:
        link.reply(protocol.WEB_RESPONSE, status=200, reason="OK", headers=[["Content-Length", "5"]])
        link.reply(protocol.WEB_DATA, seq=0, raw=b"hello")
        link.reply(protocol.WEB_END)

    link, browser = await _browser_sees(monkeypatch, [protocol.WEB_BINARY_CAPABILITY], old_device)
    assert "first_credit" not in link.sent[0][1]
    assert not [m for m, _ in link.sent if m == protocol.WEB_CREDIT]
    assert b"".join(m.get("body", b"") for m in browser[1:]) == b"hello"


async def test_first_bytes_past_the_credit_or_not_base64_reset_the_stream(monkeypatch):
    def greedy(link: FakeLink) -> None:  # more than a whole window with the head: flow control
        link.reply(protocol.WEB_RESPONSE, status=200, reason="OK", headers=[],
                   body=base64.b64encode(b"x" * (WINDOW + 1)).decode())

    capabilities = [protocol.WEB_BINARY_CAPABILITY, protocol.WEB_SLOW_START_CAPABILITY]
    link, browser = await _browser_sees(monkeypatch, capabilities, greedy)
    assert browser[0]["status"] == 502 and b"more data than credit" in browser[1]["body"]

    def garbled(link: FakeLink) -> None:
        link.reply(protocol.WEB_RESPONSE, status=200, reason="OK", headers=[], body="not base64!")

    link, browser = await _browser_sees(monkeypatch, capabilities, garbled)
    assert browser[0]["status"] == 502 and b"not base64" in browser[1]["body"]


async def test_a_download_cancelled_in_the_turn_a_frame_arrives_still_ends():
    """The browser left: the stream cancels its download. asyncio.wait_for (Python 3.11) handed the download the
    frame that arrived in the same turn and lost the cancellation: it lived on until its first-byte timeout."""
    link = FakeLink()
    device = SimpleNamespace(pk=uuid.uuid4(), capabilities=[])
    stream = web_http.HttpStream({"type": "http", "method": "GET", "path": "/"}, None, None, device, 20001)
    stream.link, stream.receipts, stream.credit = link, streams.Receipts(WINDOW), streams.Credit(WINDOW)
    download = asyncio.ensure_future(stream._download())
    await asyncio.sleep(0)  # the download waits for the device's next frame ...
    link.reply(protocol.WEB_CREDIT, bytes=1)  # ... which arrives in the same turn as the cancellation
    download.cancel()
    await asyncio.wait([download], timeout=5)
    assert download.cancelled()
