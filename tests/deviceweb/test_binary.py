"""Binary data frames (clients/protocol.py) and the in-process route's bounded queue, without processes."""

from __future__ import annotations

import asyncio

import pytest

from clients import protocol
from clients.bridge.web import WebForwarder
from devices.web.streams import LocalLink
from tests.deviceweb.support import web_port


def test_a_binary_frame_round_trips_and_malformed_ones_are_refused():
    payload = bytes(range(256)) * 10
    frame = protocol.web_binary(protocol.WEB_BIN_DATA, "s-1_x", 2 ** 32 - 1, payload)
    assert protocol.parse_web_binary(frame) == (protocol.WEB_BIN_DATA, "s-1_x", 2 ** 32 - 1, payload)
    assert protocol.parse_web_binary(memoryview(frame)) == protocol.parse_web_binary(frame)
    for bad in (b"", b"\x01", b"\x01\x00\x00\x00\x00\x00\x00", b"\x03\x01s\x00\x00\x00\x00", b"{\"jsonrpc\"",
                b"\x01\x05ab", b"\x01\x01\xff\x00\x00\x00\x00"):
        with pytest.raises(protocol.ProtocolError):
            protocol.parse_web_binary(bad)
    with pytest.raises(protocol.ProtocolError):
        protocol.parse_web_binary(b"\x01\x01s\x00\x00\x00\x00" + b"x" * protocol.MAX_FRAME_BYTES)
    assert len(protocol.web_binary(protocol.WEB_BIN_DATA, "s" * 255, 0, b"x" * protocol.WEB_BIN_CHUNK_BYTES)) \
        <= protocol.MAX_FRAME_BYTES
    # Windows: a binary stream's frames cost at least 1/64 of its window, as text streams' do of theirs.
    assert protocol.web_frame_cost(10) == protocol.WEB_MIN_FRAME_COST
    assert protocol.web_frame_cost(10, protocol.WEB_BIN_WINDOW_BYTES) == protocol.WEB_BIN_WINDOW_BYTES // 64


class FakeTunnel:
    channel_name = "specific.here!tunnel"
    closing = False

    def __init__(self) -> None:
        self.streams: dict = {}
        self.forwarded: list = []

    async def device_stream_open(self, message: dict) -> None:
        self.streams[message["stream"]] = message["reply_channel"]
        self.forwarded.append(message)

    async def device_forward(self, message: dict) -> None:
        self.forwarded.append(message)


async def test_the_in_process_route_resets_a_device_that_ignores_credit_instead_of_queueing():
    tunnel = FakeTunnel()
    link = LocalLink(tunnel, binary=True)
    await link.open(protocol.WEB_OPEN, {"port": 20001})
    assert tunnel.streams[link.stream] is link and '"binary":true' in tunnel.forwarded[0]["frame"]
    await link.data(0, b"up")
    assert protocol.parse_web_binary(tunnel.forwarded[1]["bytes"]) == (protocol.WEB_BIN_DATA, link.stream, 0, b"up")
    chunk = b"x" * protocol.WEB_BIN_CHUNK_BYTES
    for seq in range(3 * protocol.WEB_BIN_WINDOW_BYTES // len(chunk)):  # three windows, nobody reading
        link.put({"type": "device.stream", "stream": link.stream,
                  "frame": {"method": protocol.WEB_DATA, "params": {"seq": seq, "raw": chunk}}})
    assert len(link.queue) == 1  # what was queued is dropped: memory stays bounded
    message = await link.receive()
    assert message["frame"]["method"] == protocol.WEB_RESET
    assert message["frame"]["params"]["reason"] == protocol.WEB_RESET_FLOW
    await link.close()
    assert link.stream not in tunnel.streams


async def test_the_bridge_sends_binary_frames_under_the_binary_window_and_takes_them():
    port = web_port()
    size = 3 * protocol.WEB_BIN_WINDOW_BYTES + 1000
    uploaded = bytearray()
    done = asyncio.Event()

    async def serve(reader, writer) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        if head.startswith(b"POST"):
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            uploaded.extend(await reader.readexactly(length))
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
            for _ in range(size // 65536):
                writer.write(b"y" * 65536)
                await writer.drain()
            writer.write(b"y" * (size % 65536))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", port)
    text: list[tuple[str, dict]] = []
    frames: list[tuple[int, str, int, bytes]] = []
    progress = asyncio.Event()

    async def notify(method: str, params: dict, generation: int) -> bool:
        text.append((method, params))
        if method == protocol.WEB_END or params.get("end") is True:
            done.set()
        progress.set()
        return True

    async def binary(frame: bytes, generation: int) -> bool:
        frames.append(protocol.parse_web_binary(frame))
        progress.set()
        return True

    forwarder = WebForwarder([port], notify, lambda: 1, binary=binary)
    request = {"method": "GET", "path": "/", "query": "", "headers": [], "body": False, "port": port, "binary": True}
    try:
        forwarder.handle(protocol.WEB_OPEN, dict(request, stream="down"))
        received = 0
        while not done.is_set():
            progress.clear()
            fresh = frames[received:]
            received = len(frames)
            for kind, stream, seq, payload in fresh:
                assert (kind, stream, seq) == (protocol.WEB_BIN_DATA, "down", seq)
                assert len(payload) <= protocol.WEB_BIN_CHUNK_BYTES
            in_flight = sum(protocol.web_frame_cost(len(f[3]), protocol.WEB_BIN_WINDOW_BYTES) for f in frames)
            assert in_flight <= protocol.WEB_BIN_WINDOW_BYTES * (1 + received // 8)  # never past its credit
            for _ in fresh:
                forwarder.handle(protocol.WEB_CREDIT, {"stream": "down", "bytes": protocol.WEB_BIN_CHUNK_BYTES})
            if not done.is_set():
                await asyncio.wait_for(progress.wait(), 10)
        assert [f[2] for f in frames] == list(range(len(frames)))
        assert sum(len(f[3]) for f in frames) == size
        assert not any(m == protocol.WEB_DATA for m, _ in text)  # no base64 text frames at all

        # Upload: binary frames from the platform reach the local server as raw bytes.
        done.clear()
        body = bytes(range(256)) * 8192  # 2 MiB
        forwarder.handle(protocol.WEB_OPEN, dict(request, stream="up", method="POST", body=True,
                                                 headers=[["content-length", str(len(body))]]))
        half = len(body) // 2
        forwarder.handle_binary(protocol.web_binary(protocol.WEB_BIN_DATA, "up", 0, body[:half]))
        forwarder.handle_binary(protocol.web_binary(protocol.WEB_BIN_DATA, "up", 1, body[half:]))
        forwarder.handle(protocol.WEB_END, {"stream": "up"})
        await asyncio.wait_for(done.wait(), 10)
        assert bytes(uploaded) == body
        # ... and its small answer came whole in one web.response (no web.data, no web.end).
        answer = [p for m, p in text if p["stream"] == "up" and m != protocol.WEB_CREDIT]
        assert len(answer) == 1 and answer[0]["end"] is True and answer[0]["body"] == "b2s="
    finally:
        await forwarder.close()
        server.close()
