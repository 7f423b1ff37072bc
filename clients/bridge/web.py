"""Device web, the device side: forwards the platform's ``web.*`` streams to 127.0.0.1:<port>.

Only ports the owner exposed (``ai1net-bridge run --expose 20001``, 20000-20999) and only the
loopback address: a ``web.open`` for anything else is refused here and written to the audit log, even
if the platform asked for it. HTTP goes over a plain HTTP/1.1 connection per request (Content-Length,
chunked or read-to-close bodies); WebSocket upgrades use the ``websockets`` client. Bodies move in
chunks of at most WEB_CHUNK_BYTES under the credit window of clients/protocol.py, so memory per
stream stays bounded whatever the body size, and a slow browser stalls only its own stream. A stream
the platform opens with ``"binary": true`` moves its data as binary frames (raw bytes, no base64 or
JSON) in chunks of WEB_BIN_CHUNK_BYTES under the larger WEB_BIN_WINDOW_BYTES.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import re
from typing import Any, Awaitable, Callable, Dict, Iterable, List, Optional, Set, Tuple

from clients import protocol
from clients.bridge.upstream import Upstream, open_upstream

log = logging.getLogger("ai1net.bridge.web")

CONNECT_TIMEOUT = 10.0
IDLE_TIMEOUT = 300.0  # no credit, no data from either side for this long: give the stream up
LIVENESS_TICK = 1.0  # how often a waiting stream checks that its tunnel connection is still the same
LOOPBACK = "127.0.0.1"
FIRST_CHUNK = 32 * 1024
# Connections to a local server are kept for the next request (HTTP/1.1 keep-alive) when the request is one a
# client may send again (idempotent, no body): a connection the server closed while idle is then retried
# once on a new one, as browsers and urllib3 do. At most KEEP_IDLE per port, each for KEEP_IDLE_SEC (below
# the 5 s that common servers keep an idle connection).
KEEP_IDLE = 8
KEEP_IDLE_SEC = 4.0
REPEATABLE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "te", "trailer",
    "transfer-encoding", "upgrade", "host", "expect", "content-length",
})
WS_HANDSHAKE = frozenset({
    "sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions", "sec-websocket-protocol",
    "sec-websocket-accept", "origin",
})
_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_BAD_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_BAD_TARGET = re.compile(r"[\x00-\x20\x7f#]")

Notify = Callable[[str, Dict[str, Any], int], Awaitable[bool]]
SendBinary = Callable[[bytes, int], Awaitable[bool]]


class StreamError(Exception):
    """Ends a stream with ``web.reset {reason, detail}``."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(detail or reason)
        self.reason = reason
        self.detail = detail or reason


class _Gone(Exception):
    """The tunnel connection the stream belonged to is gone: end quietly."""


class _Stale(Exception):
    """A kept connection the local server had closed: it answered nothing (the request goes again)."""


class IdleConnections:
    """Kept connections to the local servers, by (port, read-ahead capacity); the most recently used first."""

    def __init__(self) -> None:
        self.idle: Dict[Tuple[int, int], List[Tuple[Upstream, float]]] = {}

    def take(self, key: Tuple[int, int]) -> Optional[Upstream]:
        self._expire()
        kept = self.idle.get(key)
        while kept:
            connection, _ = kept.pop()
            if not connection.eof and not connection.is_closing() and not connection.buffered:
                return connection  # (bytes that came while it was idle would be read as the next response)
            connection.close()
        return None

    def put(self, key: Tuple[int, int], connection: Upstream) -> None:
        self._expire()
        kept = self.idle.setdefault(key, [])
        # Bytes past the response would be read as the next response's: such a server's connection is not kept.
        if connection.eof or connection.is_closing() or connection.buffered or len(kept) >= KEEP_IDLE:
            connection.close()
            return
        connection.idle()
        kept.append((connection, asyncio.get_running_loop().time()))

    def _expire(self) -> None:
        oldest = asyncio.get_running_loop().time() - KEEP_IDLE_SEC
        for key in list(self.idle):
            kept = self.idle[key]
            while kept and kept[0][1] < oldest:
                kept.pop(0)[0].close()
            if not kept:
                del self.idle[key]

    def close(self) -> None:
        for kept in self.idle.values():
            for connection, _ in kept:
                connection.close()
        self.idle.clear()


def clean_headers(raw: Any, *, drop: Iterable[str] = ()) -> List[Tuple[str, str]]:
    """Validated [name, value] pairs without hop-by-hop headers; raises StreamError on bad input."""
    if not isinstance(raw, list) or len(raw) > protocol.WEB_MAX_HEADERS:
        raise StreamError(protocol.WEB_RESET_BAD_REQUEST, "headers must be a list of at most "
                          f"{protocol.WEB_MAX_HEADERS} [name, value] pairs")
    dropped = set(HOP_BY_HOP) | {d.lower() for d in drop}
    headers: List[Tuple[str, str]] = []
    size = 0
    for pair in raw:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2 or not all(isinstance(x, str) for x in pair):
            raise StreamError(protocol.WEB_RESET_BAD_REQUEST, "a header must be [name, value]")
        name, value = pair
        if not _TOKEN.match(name) or _BAD_VALUE.search(value):
            raise StreamError(protocol.WEB_RESET_BAD_REQUEST, f"bad header {name!r}")
        size += len(name) + len(value) + 4
        if name.lower() not in dropped:
            headers.append((name, value))
    if size > protocol.WEB_MAX_HEAD_BYTES:
        raise StreamError(protocol.WEB_RESET_BAD_REQUEST, "headers too large")
    return headers


def _target(params: Dict[str, Any]) -> str:
    path, query = params.get("path"), params.get("query") or ""
    if not isinstance(path, str) or not path.startswith("/") or _BAD_TARGET.search(path):
        raise StreamError(protocol.WEB_RESET_BAD_REQUEST, "path must start with / and hold no spaces or controls")
    if not isinstance(query, str) or _BAD_TARGET.search(query):
        raise StreamError(protocol.WEB_RESET_BAD_REQUEST, "bad query string")
    target = path + ("?" + query if query else "")
    if len(target) > protocol.WEB_MAX_HEAD_BYTES // 2:
        raise StreamError(protocol.WEB_RESET_BAD_REQUEST, "URL too long")
    return target


class WebForwarder:
    """All device-web streams of one bridge. ``handle`` is called by the tunnel's reader for every
    ``web.*`` notification (it never blocks); each stream runs in its own task."""

    def __init__(self, ports: Iterable[int], notify: Notify, generation: Callable[[], int],
                 audit: Optional[Any] = None, binary: Optional[SendBinary] = None) -> None:
        self.ports: Set[int] = {p for p in ports if protocol.web_port_allowed(p)}
        self._notify = notify
        self.send_binary = binary  # None: this tunnel sends text frames only
        self.generation = generation
        self.audit = audit
        self.streams: Dict[str, _Stream] = {}
        self.connections = IdleConnections()
        self.refused = 0  # for status and tests

    def handle(self, method: str, params: Dict[str, Any]) -> None:
        stream_id = params.get("stream")
        if not isinstance(stream_id, str) or not stream_id or len(stream_id) > 100:
            log.warning("ignoring %s without a stream id", method)
            return
        if method in (protocol.WEB_OPEN, protocol.WEB_WS_OPEN):
            if stream_id in self.streams:
                return  # a duplicate open; the first one runs
            cls = HttpStream if method == protocol.WEB_OPEN else WsStream
            stream = cls(self, stream_id, params)
            self.streams[stream_id] = stream
            stream.task = asyncio.ensure_future(stream.run())
            return
        stream = self.streams.get(stream_id)
        if stream is not None:
            stream.deliver(method, params)
        # else: a late frame of a stream that already ended

    def handle_binary(self, frame: bytes) -> None:
        """A binary data frame from the platform (called by the tunnel's reader; never blocks)."""
        try:
            kind, stream_id, seq, payload = protocol.parse_web_binary(frame)
        except protocol.ProtocolError as exc:
            log.warning("ignoring a binary frame: %s", exc.message)
            return
        stream = self.streams.get(stream_id)
        if stream is not None:
            method = protocol.WEB_DATA if kind == protocol.WEB_BIN_DATA else protocol.WEB_WS_FRAME
            stream.deliver(method, {"stream": stream_id, "seq": seq, "raw": payload})

    async def notify(self, method: str, params: Dict[str, Any], generation: int) -> bool:
        return await self._notify(method, params, generation)

    def refuse(self, stream_id: str, port: Any, reason: str) -> None:
        self.refused += 1
        log.warning("device web: refused port %r (%s)", port, reason)
        if self.audit is not None:
            self.audit.write("web.refused", stream=stream_id, port=port, reason=reason)

    def forget(self, stream_id: str) -> None:
        self.streams.pop(stream_id, None)

    async def close(self) -> None:
        tasks = [s.task for s in self.streams.values() if s.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.streams.clear()
        self.connections.close()


class _Stream:
    def __init__(self, forwarder: WebForwarder, stream_id: str, params: Dict[str, Any]) -> None:
        self.fw = forwarder
        self.id = stream_id
        self.params = params
        self.generation = forwarder.generation()
        self.task: Optional[asyncio.Future] = None
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.inbox_cost = 0  # credit the platform has used and we have not returned yet
        self.binary = params.get("binary") is True and forwarder.send_binary is not None
        self.window = protocol.web_window(self.binary)
        self.chunk = protocol.web_chunk(self.binary)
        self.ramp = FIRST_CHUNK  # the first frames of a body are small (its first byte goes out at once)
        self.credit = self.window  # what we may still send
        first = params.get("first_credit")
        # Slow start (clients/protocol.py): the platform grants the rest of the window once the head is out.
        self.slow_start = isinstance(first, int) and not isinstance(first, bool) and 0 < first < self.window
        if self.slow_start:
            self.credit = first
        self.held_back: Optional[Upstream] = None  # reading ahead limited until credit comes back
        self.credit_changed = asyncio.Event()
        self.send_seq = 0
        self.recv_seq = 0
        self.unreturned = 0
        self.reset_by_platform = False
        self.upload_error: Optional[BaseException] = None

    # --- frames from the platform (called by the tunnel reader; never blocks) ---------------
    def deliver(self, method: str, params: Dict[str, Any]) -> None:
        if method == protocol.WEB_CREDIT:
            amount = params.get("bytes")
            if isinstance(amount, int) and not isinstance(amount, bool) and 0 < amount <= self.window:
                self.credit = min(self.credit + amount, self.window)
                self.credit_changed.set()
                self.read_ahead()
            return
        if method == protocol.WEB_RESET:
            self.reset_by_platform = True
            if self.task is not None:
                self.task.cancel()
            return
        estimate = 0
        if method in (protocol.WEB_DATA, protocol.WEB_WS_FRAME):
            raw = params.get("raw")
            if isinstance(raw, bytes):
                estimate = protocol.web_frame_cost(len(raw), self.window)
            else:
                payload = params.get("data") or params.get("text") or ""
                size = len(payload) * 3 // 4 if isinstance(payload, str) else 0
                estimate = protocol.web_frame_cost(size, self.window)
            self.inbox_cost += estimate
            if self.inbox_cost > self.window + self.chunk:
                self.inbox.put_nowait(("overflow", {}, 0))
                return
        self.inbox.put_nowait((method, params, estimate))

    def read_ahead(self) -> None:
        """Let the local server's connection read ahead as far as it may again."""
        connection, self.held_back = self.held_back, None
        if connection is not None:
            connection.limit_reading(None)

    # --- helpers for the stream task ---------------------------------------------------------
    async def send(self, method: str, params: Dict[str, Any]) -> None:
        params = dict(params, stream=self.id)
        if not await self.fw.notify(method, params, self.generation):
            raise _Gone()

    def alive(self) -> bool:
        return self.fw.generation() == self.generation

    async def _wait(self, awaitable_factory: Callable[[], Awaitable[Any]], what: str) -> Any:
        """Wait for something from the platform or the local server, checking the tunnel connection every tick.

        One future for the whole wait, watched with ``asyncio.wait``: ``asyncio.wait_for`` (before Python 3.12)
        returns the result of a future that completes in the same turn of the loop as a cancellation of the
        caller, and the cancellation is lost. A stream the platform reset or the daemon closed at that instant
        then went on waiting, for credit that never came, for IDLE_TIMEOUT."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + IDLE_TIMEOUT
        waiting = asyncio.ensure_future(awaitable_factory())
        try:
            while True:
                if not self.alive():
                    raise _Gone()
                left = deadline - loop.time()
                if left <= 0:
                    raise StreamError(protocol.WEB_RESET_TIMEOUT, f"no {what} for {IDLE_TIMEOUT:g}s")
                done, _ = await asyncio.wait({waiting}, timeout=min(LIVENESS_TICK, left))
                if done:
                    return waiting.result()
        finally:
            if not waiting.done():
                waiting.cancel()
            elif not waiting.cancelled():
                waiting.exception()  # retrieved, however the wait ended (no "never retrieved" log)

    async def next_frame(self) -> Tuple[str, Dict[str, Any]]:
        method, params, estimate = await self._wait(self.inbox.get, "data from the platform")
        self.inbox_cost -= estimate
        if method == "overflow":
            raise StreamError(protocol.WEB_RESET_FLOW, "the platform sent more than its credit")
        if method in (protocol.WEB_DATA, protocol.WEB_WS_FRAME):
            if params.get("seq") != self.recv_seq:
                raise StreamError(protocol.WEB_RESET_FLOW, f"expected frame {self.recv_seq}, got {params.get('seq')}")
            self.recv_seq += 1
        return method, params

    @staticmethod
    def decode(params: Dict[str, Any]) -> bytes:
        if isinstance(params.get("raw"), bytes):
            return params["raw"]
        try:
            return base64.b64decode(params.get("data") or "", validate=True)
        except (ValueError, TypeError):
            raise StreamError(protocol.WEB_RESET_BAD_REQUEST, "data is not base64") from None

    async def consumed(self, size: int) -> None:
        """We handed ``size`` bytes on: return the credit in batches of a quarter window."""
        self.unreturned += protocol.web_frame_cost(size, self.window)
        if self.unreturned >= self.window // 4:
            amount, self.unreturned = self.unreturned, 0
            await self.send(protocol.WEB_CREDIT, {"bytes": amount})

    def next_size(self) -> int:
        """How much the next data frame may carry: FIRST_CHUNK, doubling frame by frame up to the chunk."""
        size, self.ramp = min(self.ramp, self.chunk), min(self.ramp * 2, self.chunk)
        return size

    async def take_credit(self, size: int) -> None:
        cost = protocol.web_frame_cost(size, self.window)
        while self.credit < cost:
            self.credit_changed.clear()
            await self._wait(self.credit_changed.wait, "credit from the platform")
        self.credit -= cost

    async def send_data(self, data: bytes, kind: int = protocol.WEB_BIN_DATA) -> None:
        await self.take_credit(len(data))
        if self.binary:
            assert self.fw.send_binary is not None
            if not await self.fw.send_binary(protocol.web_binary(kind, self.id, self.send_seq, data), self.generation):
                raise _Gone()
            self.send_seq += 1
        else:
            await self.send_text_data(data, kind)

    async def send_text_data(self, data: bytes, kind: int = protocol.WEB_BIN_DATA) -> None:
        """One data frame as base64 in JSON text (a stream without binary frames), its credit taken."""
        method = protocol.WEB_DATA if kind == protocol.WEB_BIN_DATA else protocol.WEB_WS_FRAME
        await self.send(method, {"seq": self.send_seq, "data": base64.b64encode(data).decode("ascii")})
        self.send_seq += 1

    def port(self) -> int:
        port = self.params.get("port")
        if not protocol.web_port_allowed(port) or port not in self.fw.ports:
            self.fw.refuse(self.id, port, "not exposed")
            raise StreamError(protocol.WEB_RESET_PORT_NOT_EXPOSED,
                              f"port {port} is not exposed on this device (ai1net-bridge run --expose PORT)")
        return port

    async def run(self) -> None:
        try:
            await self.serve()
        except StreamError as exc:
            await self._reset(exc.reason, exc.detail)
        except (_Gone, asyncio.CancelledError):
            pass
        except Exception as exc:  # a bug must end this stream only
            log.exception("device web stream %s failed", self.id)
            await self._reset(protocol.WEB_RESET_UPSTREAM_ERROR, f"{type(exc).__name__}: {exc}")
        finally:
            self.fw.forget(self.id)

    async def _reset(self, reason: str, detail: str) -> None:
        if self.reset_by_platform:
            return
        try:
            await self.send(protocol.WEB_RESET, {"reason": reason, "detail": detail[:500]})
        except _Gone:
            pass

    async def serve(self) -> None:
        raise NotImplementedError


class HttpStream(_Stream):
    async def serve(self) -> None:
        port = self.port()
        method = self.params.get("method")
        if not isinstance(method, str) or not _TOKEN.match(method) or len(method) > 20:
            raise StreamError(protocol.WEB_RESET_BAD_REQUEST, "bad method")
        target = _target(self.params)
        headers = clean_headers(self.params.get("headers") or [])
        length = _content_length(self.params.get("headers") or [])
        has_body = bool(self.params.get("body"))
        repeatable = method in REPEATABLE_METHODS and not has_body
        key = (port, 2 * self.chunk)
        head = [f"{method} {target} HTTP/1.1", f"Host: {LOOPBACK}:{port}"]
        if not repeatable:
            head.append("Connection: close")
        head += [f"{name}: {value}" for name, value in headers]
        chunked = has_body and length is None
        if length is not None:
            head.append(f"Content-Length: {length}")
        elif chunked:
            head.append("Transfer-Encoding: chunked")
        request_head = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1")
        kept = self.fw.connections.take(key) if repeatable else None
        while True:
            connection = kept or await self._connect(port, key[1])
            keep = False
            try:
                keep = await self._exchange(connection, request_head, method, has_body=has_body,
                                            chunked=chunked, stale_ok=kept is not None)
                return
            except _Stale:
                kept = None  # the request again, on a new connection
            finally:
                if keep:
                    self.fw.connections.put(key, connection)
                else:
                    connection.close()

    async def _connect(self, port: int, capacity: int) -> Upstream:
        try:
            # Up to two chunks are read ahead: a fast local server fills whole frames.
            return await asyncio.wait_for(open_upstream(port, capacity, LOOPBACK), CONNECT_TIMEOUT)
        except (OSError, asyncio.TimeoutError) as exc:
            raise StreamError(protocol.WEB_RESET_UNREACHABLE,
                              f"nothing answers on {LOOPBACK}:{port} ({exc.__class__.__name__})") from None

    async def _exchange(self, connection: Upstream, request_head: bytes, method: str, *, has_body: bool,
                        chunked: bool, stale_ok: bool) -> bool:
        """One request and its response; True when the connection may serve the next request."""
        reader = connection  # read as a StreamReader, written as a StreamWriter
        uploader: Optional[asyncio.Future] = None
        try:
            if self.slow_start:  # until the head is read: the head and no more than the slow start's read-ahead
                connection.limit_reading(protocol.WEB_MAX_HEAD_BYTES + protocol.WEB_SLOW_START_READ_AHEAD)
                self.held_back = connection
            connection.write(request_head)
            uploader = asyncio.ensure_future(self._upload(connection, chunked=chunked, expect=has_body))
            uploader.add_done_callback(self._upload_done)
            try:
                status, reason, response_headers, keep = await self._read_head(reader, stale_ok=stale_ok)
                framing = _framing(method, status, response_headers)
                keep = keep and framing[0] != "close"
                dropped = HOP_BY_HOP - {"content-length"} if framing[0] != "chunked" else HOP_BY_HOP
                head = {"status": status, "reason": reason,
                        "headers": [[n, v] for n, v in response_headers if n.lower() not in dropped]}
                if self.binary and (framing[0] == "none" or (
                        framing[0] == "length" and framing[1] <= protocol.WEB_INLINE_BODY_BYTES)):
                    # A small (or no) body rides in the head's frame: one frame instead of three.
                    body = await self._read_exactly(reader, framing[1]) if framing[0] == "length" else b""
                    await self.send(protocol.WEB_RESPONSE, dict(head, end=True,
                                                                body=base64.b64encode(body).decode("ascii")))
                    return keep
                if self.slow_start and framing[0] in ("length", "close"):
                    framing = await self._first_bytes(reader, framing, head)
                else:
                    self.read_ahead()
                await self.send(protocol.WEB_RESPONSE, head)
                await self._download(reader, framing)
            except asyncio.CancelledError:
                if self.upload_error is not None:  # a broken upload (seq gap, overflow) ends the stream
                    raise self.upload_error from None
                raise
            await self.send(protocol.WEB_END, {})
            return keep
        finally:
            self.read_ahead()  # a kept connection serves the next stream in full
            if uploader is not None:
                uploader.cancel()
                await asyncio.gather(uploader, return_exceptions=True)

    async def _first_bytes(self, reader: Upstream, framing: Tuple[str, int], head: Dict[str, Any]
                           ) -> Tuple[str, int]:
        """Slow start: the body bytes already here ride in ``head`` (at most WEB_FIRST_BODY_BYTES, no wait), and
        reading ahead stops at WEB_SLOW_START_READ_AHEAD until the platform returns credit. The framing of the rest
        of the body."""
        kind, remaining = framing
        size = min(reader.buffered, protocol.WEB_FIRST_BODY_BYTES)
        if kind == "length":
            size = min(size, remaining)
        reader.limit_reading(protocol.WEB_SLOW_START_READ_AHEAD)  # no credit can have come back before the head
        self.held_back = reader
        if size > 0 and self.credit >= protocol.web_frame_cost(size, self.window):  # else the head goes alone
            await self.take_credit(size)
            head["body"] = base64.b64encode(await reader.read(size)).decode("ascii")
        return kind, remaining - size if kind == "length" else remaining

    def _upload_done(self, task: asyncio.Future) -> None:
        if task.cancelled() or task.exception() is None:
            return
        self.upload_error = task.exception()
        if self.task is not None:
            self.task.cancel()

    async def _upload(self, writer: Upstream, *, chunked: bool, expect: bool) -> None:
        try:
            await self._send_body(writer, chunked=chunked, expect=expect)
        except ConnectionError:
            pass  # the local server stopped reading (it may have answered already): its response decides

    async def _send_body(self, writer: Upstream, *, chunked: bool, expect: bool) -> None:
        if not expect:
            await writer.drain()
            return
        while True:
            method, params = await self.next_frame()
            if method == protocol.WEB_DATA:
                data = self.decode(params)
                if data:
                    writer.write(b"%x\r\n%s\r\n" % (len(data), data) if chunked else data)
                    await writer.drain()
                await self.consumed(len(data))
            elif method == protocol.WEB_END:
                if chunked:
                    writer.write(b"0\r\n\r\n")
                await writer.drain()
                return

    async def _read_head(self, reader: Upstream, *, stale_ok: bool = False
                         ) -> Tuple[int, str, List[Tuple[str, str]], bool]:
        """(status, reason, headers, whether the server keeps the connection) of the response."""
        while True:  # skip interim 1xx responses (100 Continue, 103 Early Hints)
            try:
                raw = await self._wait(lambda: reader.readuntil(b"\r\n\r\n"), "response from the local server")
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError) as exc:
                if stale_ok and (isinstance(exc, ConnectionError) or (
                        isinstance(exc, asyncio.IncompleteReadError) and not exc.partial)):
                    raise _Stale() from None
                raise StreamError(protocol.WEB_RESET_UPSTREAM_ERROR,
                                  f"the local server closed or sent a bad response head ({exc.__class__.__name__})"
                                  ) from None
            if len(raw) > protocol.WEB_MAX_HEAD_BYTES:
                raise StreamError(protocol.WEB_RESET_UPSTREAM_ERROR, "response head too large")
            lines = raw.decode("latin-1").split("\r\n")
            parts = lines[0].split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
                raise StreamError(protocol.WEB_RESET_UPSTREAM_ERROR, f"bad status line {lines[0][:100]!r}")
            status = int(parts[1])
            headers = []
            for line in lines[1:]:
                if not line:
                    continue
                name, sep, value = line.partition(":")
                if not sep or not _TOKEN.match(name.strip()):
                    raise StreamError(protocol.WEB_RESET_UPSTREAM_ERROR, f"bad header line {line[:100]!r}")
                headers.append((name.strip(), value.strip()))
            if len(headers) > protocol.WEB_MAX_HEADERS:
                raise StreamError(protocol.WEB_RESET_UPSTREAM_ERROR, "too many response headers")
            if 100 <= status < 200 and status != 101:
                stale_ok = False  # it answered
                continue
            if not 200 <= status <= 599:
                raise StreamError(protocol.WEB_RESET_UPSTREAM_ERROR, f"unexpected status {status}")
            close = any(n.lower() == "connection" and "close" in v.lower() for n, v in headers)
            keep = parts[0] == "HTTP/1.1" and not close
            return status, parts[2] if len(parts) > 2 else "", headers, keep

    async def _read_exactly(self, reader: Upstream, size: int) -> bytes:
        try:
            return await self._wait(lambda: reader.readexactly(size), "data from the local server")
        except (asyncio.IncompleteReadError, ConnectionError):
            raise StreamError(protocol.WEB_RESET_UPSTREAM_ERROR, "the local server ended the body early") from None

    async def _forward(self, reader: Upstream, size: int) -> int:
        """The next bytes of the body, at most ``size``, to the platform as one data frame: how many (0 at the
        end of what the local server sends). A binary stream's frame goes out of the connection's buffer."""
        try:
            size = await self._wait(lambda: reader.ready(size), "data from the local server")
        except ConnectionError as exc:
            raise StreamError(protocol.WEB_RESET_UPSTREAM_ERROR, f"the local server broke off ({exc})") from None
        if not size:
            return 0
        await self.take_credit(size)
        if not self.binary:
            await self.send_text_data(await reader.read(size))
            return size
        assert self.fw.send_binary is not None
        frame = reader.frame(protocol.web_binary_head(protocol.WEB_BIN_DATA, self.id, self.send_seq), size)
        if not await self.fw.send_binary(frame, self.generation):  # sent (masked into a new buffer) at once
            raise _Gone()
        self.send_seq += 1
        return size

    async def _download(self, reader: Upstream, framing: Tuple[str, int]) -> None:
        kind, remaining = framing
        if kind == "none":
            return
        if kind == "length":
            while remaining > 0:
                sent = await self._forward(reader, min(remaining, self.next_size()))
                if not sent:
                    raise StreamError(protocol.WEB_RESET_UPSTREAM_ERROR, "the local server ended the body early")
                remaining -= sent
            return
        if kind == "close":
            while await self._forward(reader, self.next_size()):
                pass
            return
        # chunked: forward each chunk's bytes as they arrive (server-sent events stay prompt)
        while True:
            line = await self._line(reader)
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise StreamError(protocol.WEB_RESET_UPSTREAM_ERROR, "bad chunk size") from None
            if size == 0:
                while (await self._line(reader)).strip():
                    pass  # trailers are dropped
                return
            while size > 0:
                sent = await self._forward(reader, min(size, self.next_size()))
                if not sent:
                    raise StreamError(protocol.WEB_RESET_UPSTREAM_ERROR, "the local server ended a chunk early")
                size -= sent
            await self._line(reader)

    async def _line(self, reader: Upstream) -> bytes:
        try:
            line = await self._wait(reader.readline, "data from the local server")
        except (ValueError, ConnectionError) as exc:
            raise StreamError(protocol.WEB_RESET_UPSTREAM_ERROR, f"bad chunked body ({exc})") from None
        if not line.endswith(b"\n"):
            raise StreamError(protocol.WEB_RESET_UPSTREAM_ERROR, "the local server ended a chunked body early")
        return line


def _content_length(raw: Any) -> Optional[int]:
    for pair in raw if isinstance(raw, list) else []:
        if isinstance(pair, (list, tuple)) and len(pair) == 2 and str(pair[0]).lower() == "content-length":
            value = str(pair[1]).strip()
            if not value.isdigit():
                raise StreamError(protocol.WEB_RESET_BAD_REQUEST, "bad Content-Length")
            return int(value)
    return None


def _framing(method: str, status: int, headers: List[Tuple[str, str]]) -> Tuple[str, int]:
    """How the response body is delimited: ("none"|"length"|"chunked"|"close", length)."""
    if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        return "none", 0
    values = {name.lower(): value for name, value in headers}
    if "chunked" in values.get("transfer-encoding", "").lower():
        return "chunked", 0
    if "content-length" in values:
        value = values["content-length"].strip()
        if not value.isdigit():
            raise StreamError(protocol.WEB_RESET_UPSTREAM_ERROR, "bad Content-Length from the local server")
        return "length", int(value)
    return "close", 0


class WsStream(_Stream):
    async def serve(self) -> None:
        from websockets.asyncio.client import connect
        from websockets.exceptions import ConnectionClosed, InvalidHandshake

        port = self.port()
        target = _target(self.params)
        headers = clean_headers(self.params.get("headers") or [], drop=WS_HANDSHAKE)
        subprotocols = [s for s in self.params.get("subprotocols") or [] if isinstance(s, str) and _TOKEN.match(s)]
        try:
            ws = await connect(
                f"ws://{LOOPBACK}:{port}{target}", additional_headers=headers, subprotocols=subprotocols or None,
                max_size=protocol.WEB_WS_MAX_MESSAGE, open_timeout=CONNECT_TIMEOUT, ping_interval=None,
                compression=None, user_agent_header=None,
            )
        except (OSError, asyncio.TimeoutError, InvalidHandshake) as exc:
            raise StreamError(protocol.WEB_RESET_UNREACHABLE,
                              f"no WebSocket on {LOOPBACK}:{port}{target} ({exc.__class__.__name__}: {exc})") from None
        try:
            await self.send(protocol.WEB_WS_ACCEPT, {"subprotocol": ws.subprotocol})
            up = asyncio.ensure_future(self._up(ws))
            down = asyncio.ensure_future(self._down(ws, ConnectionClosed))
            try:
                done, _ = await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    task.result()  # re-raise StreamError / _Gone
            finally:
                for task in (up, down):
                    task.cancel()
                await asyncio.gather(up, down, return_exceptions=True)
        finally:
            await ws.close()

    async def _up(self, ws: Any) -> None:
        while True:
            method, params = await self.next_frame()
            if method == protocol.WEB_WS_FRAME:
                if isinstance(params.get("text"), str):
                    payload: Any = params["text"]
                    size = len(payload.encode("utf-8"))
                else:
                    payload = self.decode(params)
                    size = len(payload)
                await ws.send(payload)
                await self.consumed(size)
            elif method == protocol.WEB_WS_CLOSE:
                code = params.get("code")
                code = code if isinstance(code, int) and (code == 1000 or 3000 <= code <= 4999) else 1000
                await ws.close(code, str(params.get("reason") or "")[:120])
                return

    async def _down(self, ws: Any, closed: Any) -> None:
        try:
            while True:
                message = await ws.recv()
                if not isinstance(message, str):
                    await self.send_data(message, protocol.WEB_BIN_WS)
                    continue
                await self.take_credit(len(message.encode("utf-8")))
                await self.send(protocol.WEB_WS_FRAME, {"text": message, "seq": self.send_seq})
                self.send_seq += 1
        except closed:
            code = ws.close_code if ws.close_code is not None else 1006
            await self.send(protocol.WEB_WS_CLOSE, {"code": code, "reason": ws.close_reason or ""})


def binary_frames() -> bool:
    """Whether this bridge offers binary data frames (``AI1NET_WEB_BINARY=0``: behave as a bridge from
    before them, text frames only; for tests of the fallback)."""
    return os.environ.get("AI1NET_WEB_BINARY", "1") != "0"


def install(core: Any) -> None:
    """Plug into the bridge daemon (clients.bridge.daemon): one forwarder per daemon run."""

    async def startup(daemon: Any) -> None:
        from clients.memory import keep_freed_memory

        keep_freed_memory()  # body chunks pass through buffers of up to 1 MiB (see clients/memory.py)
        tunnel = daemon.tunnel
        audit = getattr(daemon, "audit", None)
        if audit is None:
            from clients.bridge.audit import AuditLog

            audit = AuditLog(daemon.home / "audit.jsonl")
        binary = binary_frames()
        daemon.web = WebForwarder(
            getattr(daemon, "expose", []),
            lambda method, params, generation: tunnel.notify(method, params, generation=generation),
            lambda: tunnel.sessions,
            audit,
            binary=(lambda frame, generation: tunnel.send_binary(frame, generation=generation)) if binary else None,
        )
        if binary:
            tunnel.on_binary = daemon.web.handle_binary
        if daemon.web.ports:
            log.info("device web: exposing %s on %s", ", ".join(map(str, sorted(daemon.web.ports))), LOOPBACK)

    def handler(method: str) -> Callable[[Any, Dict[str, Any]], None]:
        def handle(daemon: Any, params: Dict[str, Any]) -> None:
            web = getattr(daemon, "web", None)
            if web is not None:
                web.handle(method, params)

        return handle

    core.on_startup(startup)
    for method in (protocol.WEB_OPEN, protocol.WEB_DATA, protocol.WEB_END, protocol.WEB_RESET, protocol.WEB_CREDIT,
                   protocol.WEB_WS_OPEN, protocol.WEB_WS_FRAME, protocol.WEB_WS_CLOSE):
        core.register_notification(method, handler(method))
    core.add_capability("device_web")
    core.add_capability(protocol.WEB_SLOW_START_CAPABILITY)
    if binary_frames():
        core.add_capability(protocol.WEB_BINARY_CAPABILITY)


def _install() -> None:
    from clients.bridge import daemon as core

    install(core)


_install()
