"""The bridge's connection to a local server (clients.bridge.upstream): frames built in its read buffer carry
exactly the bytes the server sent, and reading pauses once ``capacity`` bytes wait (bounded memory)."""

from __future__ import annotations

import asyncio
import hashlib
import os

import pytest

from clients import protocol
from clients.bridge.upstream import HEAD_ROOM, open_upstream
from tests.deviceweb.support import web_port


async def serve(handler) -> tuple[asyncio.AbstractServer, int]:
    port = web_port()
    return await asyncio.start_server(handler, "127.0.0.1", port), port


async def test_frames_out_of_the_read_buffer_carry_exactly_what_the_server_sent():
    body = os.urandom(5 * 1024 * 1024 + 12345)

    async def sends(reader, writer) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body))
        step = 1
        for offset in range(0, len(body), 70_001):
            writer.write(body[offset:offset + 70_001])  # uneven pieces, some drained, some piled up
            step += 1
            if step % 3 == 0:
                await writer.drain()
        await writer.drain()
        writer.close()

    server, port = await serve(sends)
    connection = await open_upstream(port, capacity=2 * protocol.WEB_BIN_CHUNK_BYTES)
    try:
        connection.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await connection.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        digest, got, seq = hashlib.sha256(), 0, 0
        while True:
            size = await connection.ready(protocol.WEB_BIN_CHUNK_BYTES)
            if not size:
                break
            assert connection.buffered <= 2 * protocol.WEB_BIN_CHUNK_BYTES + len(connection.buf)
            frame = connection.frame(protocol.web_binary_head(protocol.WEB_BIN_DATA, "stream-1", seq), size)
            kind, stream, number, payload = protocol.parse_web_binary(frame)
            assert (kind, stream, number) == (protocol.WEB_BIN_DATA, "stream-1", seq)
            digest.update(payload)
            got += len(payload)
            seq += 1
            if seq % 4 == 0:
                await asyncio.sleep(0)  # let reads land between frames, and buffers move
        assert got == len(body) and digest.digest() == hashlib.sha256(body).digest()
        assert connection.at_eof()
    finally:
        connection.close()
        server.close()


async def test_reading_pauses_once_capacity_bytes_wait():
    capacity = 256 * 1024
    started = asyncio.Event()

    async def floods(reader, writer) -> None:
        started.set()
        try:
            for _ in range(64):  # 16 MiB, far more than the capacity and the socket buffers
                writer.write(b"x" * 262_144)
                await writer.drain()
        except ConnectionError:
            pass
        writer.close()

    server, port = await serve(floods)
    connection = await open_upstream(port, capacity=capacity)
    try:
        await asyncio.wait_for(started.wait(), 10)
        deadline = asyncio.get_running_loop().time() + 10
        while not connection.reading_paused:
            assert asyncio.get_running_loop().time() < deadline, "reading never paused"
            await connection.ready(1)
            await asyncio.sleep(0.01)
        waiting = connection.buffered
        assert capacity <= waiting <= 2 * capacity + HEAD_ROOM
        await asyncio.sleep(0.2)
        assert connection.buffered == waiting  # paused: nothing more is read in
        await connection.read(capacity)
        assert not connection.reading_paused  # room again: reading resumes
    finally:
        connection.close()
        server.close()


async def test_a_server_that_closes_mid_head_is_an_incomplete_read():
    async def half(reader, writer) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-")
        await writer.drain()
        writer.close()

    server, port = await serve(half)
    connection = await open_upstream(port, capacity=65536)
    try:
        with pytest.raises(asyncio.IncompleteReadError) as caught:
            await connection.readuntil(b"\r\n\r\n")
        assert caught.value.partial == b"HTTP/1.1 200 OK\r\nContent-"
    finally:
        connection.close()
        server.close()
