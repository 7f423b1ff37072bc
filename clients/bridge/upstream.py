"""A device-web connection to the local server: an asyncio buffered protocol with the few calls of
asyncio's StreamReader and StreamWriter that clients.bridge.web makes, plus ``frame``.

A body read through a StreamReader was copied three times in Python before it reached the tunnel: from
the socket's bytes into the reader's buffer, out of it into a chunk, and into the binary frame with its
head. Here the socket reads straight into one buffer that keeps room in front of the data, and ``frame``
writes a binary frame's head into that room and hands out head and payload as one memoryview, no copy.
The view is valid until the event loop runs again: the caller sends it at once (websockets masks a frame
into its own buffer within ``send``, before it first waits).

Reading pauses once ``capacity`` bytes wait in the buffer (as a StreamReader pauses at twice its limit); the
buffer starts at 64 KiB and grows while data waits, to at most twice ``capacity``: a stream holds at most that
much of a local server's response whatever the body size. ``limit_reading`` pauses it earlier for a while (a
slow-start stream before its first credit comes back, see clients/protocol.py).
"""

from __future__ import annotations

import asyncio
from typing import Any, Optional

from clients import protocol
from clients.common import loopback

HEAD_ROOM = protocol.WEB_BIN_MAX_HEAD
FIRST_SIZE = 64 * 1024  # a buffer starts this small and doubles while data waits in it (small responses stay small)
IDLE_SIZE = 256 * 1024  # a kept connection gives back a buffer larger than this


class Upstream(asyncio.BufferedProtocol):
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.buf = bytearray(HEAD_ROOM + FIRST_SIZE)
        self.start = self.end = HEAD_ROOM  # the data waiting: buf[start:end]; start >= HEAD_ROOM always
        self.transport: Optional[asyncio.Transport] = None
        self.eof = False
        self.error: Optional[BaseException] = None
        self.reading_paused = False
        self.read_limit: Optional[int] = None  # pause at this many waiting bytes instead of ``capacity``
        self.writing_paused = False
        self._waiter: Optional[asyncio.Future] = None
        self._drain_waiter: Optional[asyncio.Future] = None

    # --- asyncio's side --------------------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        loopback.unpaced(transport.get_extra_info("socket"))  # a request's body to the local service: no pacing

    def get_buffer(self, sizehint: int) -> memoryview:
        free = len(self.buf) - self.end
        if free < len(self.buf) // 4:
            waiting = self.end - self.start
            size = len(self.buf)
            limit = HEAD_ROOM + 2 * self.capacity
            while HEAD_ROOM + waiting + size // 4 > size and size < limit:
                size = min(size * 2, limit)
            if size != len(self.buf) or self.start - HEAD_ROOM < waiting:
                # A new buffer (larger, or the data would overlap itself moved to the front); the old one may
                # still be out in a frame not yet sent, so it is left as it is.
                buf = bytearray(size)
                buf[HEAD_ROOM:HEAD_ROOM + waiting] = memoryview(self.buf)[self.start:self.end]
                self.buf = buf
            else:  # to the front, over bytes already taken (no overlap)
                self.buf[HEAD_ROOM:HEAD_ROOM + waiting] = memoryview(self.buf)[self.start:self.end]
            self.start, self.end = HEAD_ROOM, HEAD_ROOM + waiting
        if self.read_limit is not None:  # one read never takes more than the limit leaves room for
            return memoryview(self.buf)[self.end:self.end + max(1, self._pause_at() - (self.end - self.start))]
        return memoryview(self.buf)[self.end:]

    def buffer_updated(self, nbytes: int) -> None:
        self.end += nbytes
        self._pause_if_full()
        self._wake()

    def _pause_if_full(self) -> None:
        if self.end - self.start >= self._pause_at() and not self.reading_paused and self.transport is not None:
            self.reading_paused = True
            self.transport.pause_reading()

    def _pause_at(self) -> int:
        return self.capacity if self.read_limit is None else min(self.read_limit, self.capacity)

    def limit_reading(self, size: Optional[int]) -> None:
        """Read ahead at most ``size`` bytes from now on (None: up to ``capacity`` again)."""
        self.read_limit = size
        self._pause_if_full()
        self._resume_if_room()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return False  # close the transport

    def connection_lost(self, exc: Optional[BaseException]) -> None:
        self.eof = True
        if exc is not None:
            self.error = exc
        self._wake()
        waiter, self._drain_waiter = self._drain_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(ConnectionResetError("the local server closed the connection"))

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        waiter, self._drain_waiter = self._drain_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # --- reading ---------------------------------------------------------------------------------
    @property
    def buffered(self) -> int:
        return self.end - self.start

    def at_eof(self) -> bool:
        return self.eof and not self.buffered

    def _take(self, size: int) -> None:
        self.start += size
        if self.start == self.end:
            self.start = self.end = HEAD_ROOM
        self._resume_if_room()

    def _resume_if_room(self) -> None:
        if self.reading_paused and self.end - self.start < self._pause_at() and self.transport is not None:
            self.reading_paused = False
            self.transport.resume_reading()

    def _bytes(self, size: int) -> bytes:
        data = bytes(self.buf[self.start:self.start + size])
        self._take(size)
        return data

    async def _more(self) -> None:
        """Wait for more data or the end; raises what broke the connection once nothing more comes."""
        if self.eof:
            if self.error is not None:
                raise self.error
            return
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    async def readuntil(self, separator: bytes = b"\n") -> bytes:
        while True:
            found = self.buf.find(separator, self.start, self.end)
            if found >= 0:
                return self._bytes(found + len(separator) - self.start)
            if self.buffered >= self._pause_at():  # nothing more is read until some is taken
                raise asyncio.LimitOverrunError("separator not found within the limit", self.buffered)
            if self.eof:
                await self._more()  # raises the connection's error, if any
                raise asyncio.IncompleteReadError(self._bytes(self.buffered), None)
            await self._more()

    async def readline(self) -> bytes:
        """As StreamReader.readline: at the end, what is left (without its newline); ValueError past the limit."""
        try:
            return await self.readuntil(b"\n")
        except asyncio.IncompleteReadError as exc:
            return exc.partial
        except asyncio.LimitOverrunError as exc:
            raise ValueError(str(exc)) from None

    async def readexactly(self, size: int) -> bytes:
        if size > self.capacity:
            raise ValueError(f"cannot wait for {size} bytes, more than the buffer holds ({self.capacity})")
        while self.buffered < size:
            if self.eof:
                await self._more()
                raise asyncio.IncompleteReadError(self._bytes(self.buffered), size)
            await self._more()
        return self._bytes(size)

    async def ready(self, size: int) -> int:
        """Wait until data waits: how much of it the next read may take (at most ``size``); 0 at the end."""
        while not self.buffered:
            if self.eof:
                await self._more()
                return 0
            await self._more()
        return min(size, self.buffered)

    async def read(self, size: int) -> bytes:
        return self._bytes(await self.ready(size))

    def frame(self, head: bytes, size: int) -> memoryview:
        """``head`` and the next ``size`` waiting bytes (``size`` <= ``buffered``) as one buffer, no copy. Valid
        until the event loop runs again: send it at once."""
        assert len(head) <= HEAD_ROOM and 0 < size <= self.buffered
        begin = self.start - len(head)
        self.buf[begin:self.start] = head
        view = memoryview(self.buf)[begin:self.start + size]
        self._take(size)
        return view

    # --- writing ---------------------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    async def drain(self) -> None:
        if self.error is not None or self.transport is None or self.transport.is_closing():
            await asyncio.sleep(0)  # as StreamWriter.drain: let connection_lost run first
            if self.eof:
                raise ConnectionResetError("the local server closed the connection")
        if self.writing_paused:
            self._drain_waiter = asyncio.get_running_loop().create_future()
            await self._drain_waiter

    def is_closing(self) -> bool:
        return self.transport is None or self.transport.is_closing()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def idle(self) -> None:
        """Kept for a next request (nothing waits in it): give back a large buffer."""
        if len(self.buf) > HEAD_ROOM + IDLE_SIZE and not self.buffered:
            self.buf = bytearray(HEAD_ROOM + FIRST_SIZE)
            self.start = self.end = HEAD_ROOM


async def open_upstream(port: int, capacity: int, host: str = "127.0.0.1") -> Upstream:
    _, connection = await asyncio.get_running_loop().create_connection(lambda: Upstream(capacity), host, port)
    return connection
