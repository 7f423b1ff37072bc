"""Device web across daphne processes: the stream relay.

Scaled out, a browser's request may land on daphne B while the device's tunnel is held by daphne A. Through
the channel layer every frame of the stream would cross Redis, whose own rate (measured by bench/deviceweb.py:
61-105 MiB/s of 1 MiB messages, 440-1,100 small messages/s in one process) then bounds the stream. Instead,
each process that holds tunnels listens on a TCP port of its own (``DEVICE_WEB_RELAY_BIND``, port
``DEVICE_WEB_RELAY_PORT``, 0: any), started with its first tunnel's hello, and writes where others reach it
(``host:port``) into the device's row in the hello's own UPDATE (``Device.relay``). B's stream for that device
dials A's relay (``RelayLink``) and sends the same messages ``LocalLink`` hands to the tunnel consumer in
A's own process; the relay hands them to the consumer, and the consumer's frames for the stream come back
through a per-stream ``_Sink`` (its ``put``, as LocalLink's). The gates ran on B before any of this.

Wire (TCP, one connection per pair of processes, kept and shared by every stream between them: a connect
and handshake cost 0.54 ms of CPU, an open answered on a kept connection 0.11 ms, both ends in one process
on the development machine; TCP keepalive notices a peer the network lost. Not encrypted, as the Redis
connection is not: between hosts, keep it on a private network):

- handshake, both ways authenticated with a key derived from SECRET_KEY (``salted_hmac``): A sends
  ``MAGIC`` + a 16-byte nonce; B answers ``MAGIC`` + HMAC("dial", A's nonce) + its own nonce; A checks it
  (constant time) and answers HMAC("answer", B's nonce), which B checks before it sends anything else.
  Anything else, or too late (``HANDSHAKE_SEC``), and the connection is closed at once.
- then messages both ways: two 4-byte big-endian lengths (header 1 .. ``MAX_MESSAGE_BYTES``, header + payload
  at most that; anything else closes the connection before reading on), the header, a msgpack map with a
  ``type`` and a ``stream``, and the payload: the data bytes of the message (``bytes`` of a forward, ``raw`` of
  a data frame; the map says which with ``_p``), sent and read as they are, not copied into the msgpack:
  B -> A ``device.stream_open`` {tunnel: channel name, binary, frame?}, ``device.forward`` {frame: str |
  bytes: bytes, credit?: int}, ``device.stream_close``; A -> B ``relay.opened`` or ``relay.not_here`` (the
  first answer to an open), then the consumer's ``device.stream`` / ``device.stream.closed`` messages.
  And, outside any stream (``stream`` ""), B -> A ``devices.outbox`` {tunnel, frames?}: an outbox doorbell
  for a tunnel of A's (``send_to_tunnel``; the enqueue read the relay's address with the live channel under
  the device row's lock), handed to that consumer as the layer's doorbell would be, and dropped, unanswered,
  when the tunnel is no longer A's (its device's next hello reads the outbox). A doorbell that cannot be
  sent this way goes through the layer. The durable items are in the database either way.
  And B -> A ``device.call`` {tunnel, call_id, method, params}: a platform -> device call (``call``, from
  ``devices.services.adevice_call``: a probe's remote hands), handed to the consumer with a reply target
  that writes its ``device.call.reply`` {call_id, response} back to B; a tunnel no longer A's answers at
  once as a closed tunnel does (``device_offline``). A call B cannot send this way goes through the layer;
  one sent when the connection is lost ends with DeviceOffline (the device may have run it: never resent).
  A device's message that A cannot send on (it does not encode, or encoded it is past ``MAX_MESSAGE_BYTES``:
  msgpack spends 9 bytes on a float JSON wrote in 4) is refused in place, a call's reply as an error and a
  stream's frame as a reset of that stream: B would close the connection, and every stream on it, otherwise.

A tunnel that is not (or no longer) held by A's process gets ``relay.not_here``, and B sends the stream
through the channel layer (``TunnelLink``) instead; so does a relay B cannot reach or authenticate with
(a stale address: the process died, the port is someone else's). A connection lost after the open was
sent ends the stream with the usual DeviceOffline answer (the device may have seen the open; it is never
sent twice).

Flow control keeps its meaning: the device may have at most a window of data in flight per stream; A's
sink counts what it passed on minus the credit B returned through it and resets a stream whose device
sends past that (never buffers it), and B's link bounds its queue as LocalLink does. B waits for the
socket to drain (the transport's pause/resume) when A reads slowly.

The device-web WebSocket path (devices.web.ws) takes the same links as HTTP (``streams.link_to``).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
import socket
import struct
import threading
from typing import Any

import msgpack
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.conf import settings
from django.utils.crypto import salted_hmac

from clients import protocol
from clients.common import loopback
from devices import events
from devices.web import streams

logger = logging.getLogger(__name__)

MAGIC = b"ai1net-relay/1\n"
NONCE_BYTES = 16
TAG_BYTES = 32  # HMAC-SHA256
_KEY_SALT = "ai1net.devices.web.relay"
_LENGTHS = struct.Struct(">II")  # a message's msgpack header, then its payload
# The largest message: a device's text frame (a web.response with its headers, a base64 web.data) parsed,
# or a binary data frame, with room for the envelope.
MAX_MESSAGE_BYTES = protocol.MAX_FRAME_BYTES + 64 * 1024
MAX_STREAM_ID = 64
HANDSHAKE_SEC = 5.0
CONNECT_SEC = 3.0
OPEN_SEC = 10.0  # the relay answers an open at once; longer means the other process is stuck
SEPARATE_PAYLOAD = 64 * 1024  # a larger payload is written apart from its head, not joined to it
READ_LIMIT = protocol.WEB_BIN_CHUNK_BYTES + 64 * 1024  # the relay's reader: a whole upload frame before pausing
SCRATCH_BYTES = 256 * 1024  # the dialler's read buffer; larger messages get one of their own
OPENED, NOT_HERE = "relay.opened", "relay.not_here"
DOORBELL = events.OUTBOX_DOORBELL  # from another process (send_to_tunnel)
CALL, CALL_REPLY = "device.call", "device.call.reply"  # a platform -> device call and its reply (call)
MAX_CALL_ID = 64
_STREAM_END = frozenset({protocol.WEB_END, protocol.WEB_RESET, protocol.WEB_WS_CLOSE})


class RelayError(Exception):
    """The peer broke the relay protocol (or did not authenticate): the connection is closed."""


class RelayUnavailable(Exception):
    """No relay to talk to at that address (refused, timed out, not authenticated, not a relay)."""


class CallLost(Exception):
    """The connection to the relay closed after a call was sent on it: the device may have run it."""


def enabled(layer: Any) -> bool:
    """Whether streams may use relays: scaled out only (a channel layer that reaches other processes),
    and not when every stream is sent through the layer on purpose (``DEVICE_WEB_IN_PROCESS=0``)."""
    return (settings.DEVICE_WEB_RELAY and settings.DEVICE_WEB_IN_PROCESS and layer is not None
            and not isinstance(layer, InMemoryChannelLayer))


def _tag(label: bytes, nonce: bytes) -> bytes:
    return salted_hmac(_KEY_SALT, label + nonce, algorithm="sha256").digest()


def encode(message: dict[str, Any]) -> tuple[bytes, bytes]:
    """(head, payload) of one message: the lengths and the msgpack map, and the data bytes it carries
    (``bytes``, or a data frame's ``frame.params.raw``) sent after it as they are, never copied into it."""
    payload = b""
    if isinstance(message.get("bytes"), bytes):
        message = dict(message, _p=1)
        payload = message.pop("bytes")
    else:
        frame = message.get("frame")
        params = frame.get("params") if isinstance(frame, dict) else None
        if isinstance(params, dict) and isinstance(params.get("raw"), bytes):
            params = dict(params)
            payload = params.pop("raw")
            message = dict(message, frame=dict(frame, params=params), _p=2)
    header = msgpack.packb(message, use_bin_type=True)
    return _LENGTHS.pack(len(header), len(payload)) + header, payload


def pack(message: dict[str, Any]) -> bytes:
    head, payload = encode(message)
    return head + payload


def lengths(head: bytes | memoryview) -> tuple[int, int]:
    """The header's and the payload's length from a message's first bytes; RelayError when out of bounds
    (checked before anything is read or allocated for them)."""
    header, payload = _LENGTHS.unpack_from(head)
    if not 0 < header <= MAX_MESSAGE_BYTES or payload > MAX_MESSAGE_BYTES - header:
        raise RelayError(f"message lengths {header} + {payload} out of bounds")
    return header, payload


def decode(header: bytes | memoryview, payload: bytes) -> dict[str, Any]:
    """A message from its msgpack map and payload; RelayError for anything that is not a relay message."""
    try:
        message = msgpack.unpackb(header, raw=False)
    except Exception as exc:  # msgpack raises several kinds for garbage
        raise RelayError(f"not msgpack: {exc}") from None
    if (not isinstance(message, dict) or not isinstance(message.get("type"), str)
            or not isinstance(message.get("stream"), str) or len(message["stream"]) > MAX_STREAM_ID):
        raise RelayError("not a relay message")
    where = message.pop("_p", None)
    if where == 1:
        message["bytes"] = payload
    elif where == 2 and isinstance(message.get("frame"), dict) and isinstance(message["frame"].get("params"), dict):
        message["frame"]["params"]["raw"] = payload
    elif where is not None or payload:
        raise RelayError("a payload with nowhere to go")
    return message


async def read_message(reader: asyncio.StreamReader) -> dict[str, Any]:
    """The next message from a stream reader (the relay's side)."""
    header, payload = lengths(await reader.readexactly(_LENGTHS.size))
    body = await reader.readexactly(header + payload)
    view = memoryview(body)
    return decode(view[:header], bytes(view[header:]) if payload else b"")


def _last_word(message: dict[str, Any]) -> bool:
    """The device's (or the tunnel's) last message on a stream: the tunnel consumer forgets it after this."""
    if message.get("type") == "device.stream.closed":
        return True
    if message.get("type") != "device.stream":
        return False  # the relay's own answers
    frame = message.get("frame") or {}
    return frame.get("method") in _STREAM_END or (frame.get("params") or {}).get("end") is True


def _tune(transport: asyncio.BaseTransport) -> None:
    """A relay connection, either end: sent without pacing between processes on one host (clients.common.loopback),
    and, kept between hosts, noticed within about a minute when the network drops it silently (TCP keepalive)."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return
    loopback.unpaced(sock)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)):
            if hasattr(socket, name):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
    except OSError:
        logger.debug("no TCP keepalive on the relay connection", exc_info=True)


def _write(transport: asyncio.WriteTransport, message: dict[str, Any]) -> None:
    _write_encoded(transport, *encode(message))


def _write_encoded(transport: asyncio.WriteTransport, head: bytes, payload: bytes) -> None:
    if len(payload) > SEPARATE_PAYLOAD:
        transport.write(head)
        transport.write(payload)  # sent from where it is when the socket takes it at once
    else:
        transport.write(head + payload)


# --- A: the process that holds the tunnel -----------------------------------------------------------------

_servers: dict[asyncio.AbstractEventLoop, asyncio.Task] = {}
_background: set[asyncio.Task] = set()


async def serve() -> str:
    """This process's relay address ("host:port") for its tunnels' rows, the relay started on first use
    (one per event loop); "" when it cannot listen (the streams then take the channel layer)."""
    loop = asyncio.get_running_loop()
    task = _servers.get(loop)
    if task is None:
        _forget_closed_loops(_servers)
        task = _servers[loop] = loop.create_task(_start())
    return await asyncio.shield(task)


def _forget_closed_loops(per_loop: dict[asyncio.AbstractEventLoop, Any]) -> None:
    """Drop the entries of loops that have closed (a test's, a worker thread's): their tasks hold them."""
    for loop in [loop for loop in per_loop if loop.is_closed()]:
        del per_loop[loop]


async def _start() -> str:
    try:
        server = await asyncio.start_server(_serve, settings.DEVICE_WEB_RELAY_BIND, settings.DEVICE_WEB_RELAY_PORT,
                                            limit=READ_LIMIT)
    except OSError:
        logger.exception("the device-web stream relay cannot listen on %s:%s; cross-process streams take the "
                         "channel layer", settings.DEVICE_WEB_RELAY_BIND, settings.DEVICE_WEB_RELAY_PORT)
        return ""
    serving = asyncio.ensure_future(server.serve_forever())
    _background.add(serving)
    serving.add_done_callback(_background.discard)
    port = server.sockets[0].getsockname()[1]
    host = settings.DEVICE_WEB_RELAY_HOST
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    served = _Served(writer)
    _tune(writer.transport)
    try:
        async with asyncio.timeout(HANDSHAKE_SEC):
            await _answer_handshake(reader, writer)
        while True:
            await served.handle(await read_message(reader))
    except (RelayError, asyncio.IncompleteReadError, ConnectionError, TimeoutError) as exc:
        logger.debug("relay connection from %s ended: %r", writer.get_extra_info("peername"), exc)
    except asyncio.CancelledError:  # the loop is shutting down: asyncio's callback would log it as an error
        pass
    except Exception:
        logger.exception("relay connection from %s failed", writer.get_extra_info("peername"))
    finally:
        served.closed = True
        writer.close()
        await served.lost()


async def _answer_handshake(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    nonce = secrets.token_bytes(NONCE_BYTES)
    writer.write(MAGIC + nonce)
    answer = await reader.readexactly(len(MAGIC) + TAG_BYTES + NONCE_BYTES)
    magic, tag, theirs = answer[:len(MAGIC)], answer[len(MAGIC):-NONCE_BYTES], answer[-NONCE_BYTES:]
    if not (hmac.compare_digest(magic, MAGIC) & hmac.compare_digest(tag, _tag(b"dial", nonce))):
        raise RelayError("bad handshake")
    writer.write(_tag(b"answer", theirs))


class _Served:
    """One dialling process's connection to this relay: its streams, each on a tunnel of this process."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.streams: dict[str, tuple[Any, _Sink]] = {}
        self.closed = False

    def send(self, message: dict[str, Any]) -> None:
        if self.closed or self.writer.is_closing():
            return
        try:
            head, payload = encode(message)
        except (TypeError, ValueError, OverflowError):  # msgpack: an integer past 64 bits, say
            head, payload = b"", b""
        if not head or len(head) - _LENGTHS.size + len(payload) > MAX_MESSAGE_BYTES:
            # What a device sent, re-encoded, may not fit a relay message (msgpack spends 9 bytes on a float
            # JSON wrote in 4) or not encode at all: the dialler would close the connection, and every stream
            # on it with this one. The device's message is refused instead, as its own stream or call fails.
            logger.warning("a %s from a device cannot be relayed; refused", message.get("type"))
            head, payload = encode(_refused(message))
        _write_encoded(self.writer.transport, head, payload)

    async def handle(self, message: dict[str, Any]) -> None:
        kind, stream = message["type"], message["stream"]
        if kind == DOORBELL:
            await _ring(message)
            return
        if kind == CALL:
            await self._call(message)
            return
        if kind not in ("device.stream_open", "device.forward", "device.stream_close"):
            raise RelayError(f"unknown message type {kind!r}")
        if kind == "device.stream_open":
            await self._open(stream, message)
            return
        entry = self.streams.get(stream)
        if entry is None:
            return  # a stream that ended meanwhile (the device's last word crossed this message)
        tunnel, sink = entry
        if kind == "device.forward":
            forward: dict[str, Any] = {"type": "device.forward"}
            if isinstance(message.get("bytes"), bytes):
                forward["bytes"] = message["bytes"]
            elif isinstance(message.get("frame"), str):
                forward["frame"] = message["frame"]
            else:
                raise RelayError("device.forward without a frame")
            if tunnel.closing:
                self._end(stream, {"type": "device.stream.closed", "stream": stream})
                return
            credit = message.get("credit")
            if isinstance(credit, int) and not isinstance(credit, bool) and credit > 0:
                sink.returned(credit)
            await tunnel.device_forward(forward)
        elif kind == "device.stream_close":
            self.streams.pop(stream, None)
            await tunnel.device_stream_close({"type": "device.stream_close", "stream": stream, "ack": False})

    async def _open(self, stream: str, message: dict[str, Any]) -> None:
        from devices.consumers import local_tunnel

        channel, frame = message.get("tunnel"), message.get("frame")
        tunnel = local_tunnel(channel) if isinstance(channel, str) else None
        if tunnel is None or not tunnel.hello_done or stream in self.streams or stream in tunnel.streams:
            self.send({"type": NOT_HERE, "stream": stream})
            return
        sink = _Sink(self, tunnel, stream, binary=message.get("binary") is True)
        self.streams[stream] = (tunnel, sink)
        self.send({"type": OPENED, "stream": stream})  # before anything the device may answer
        await tunnel.device_stream_open({"type": "device.stream_open", "stream": stream, "reply_channel": sink,
                                         "frame": frame if isinstance(frame, str) else None})

    async def _call(self, message: dict[str, Any]) -> None:
        """A platform -> device call from the dialling process (``call``) for a tunnel of this one; its reply
        goes back on this connection. A tunnel not (or no longer) here answers as a closed tunnel does."""
        from devices.consumers import local_tunnel, offline_reply

        channel, call_id, method, params = (message.get(key) for key in ("tunnel", "call_id", "method", "params"))
        if not (isinstance(channel, str) and isinstance(call_id, str) and 0 < len(call_id) <= MAX_CALL_ID
                and isinstance(method, str) and isinstance(params, dict)):
            raise RelayError("a call needs a tunnel, a call_id, a method and params")
        reply = _CallReply(self)
        tunnel = local_tunnel(channel)
        if tunnel is None:
            reply.put(offline_reply(call_id))
            return
        await tunnel.device_call({"type": "device.call", "call_id": call_id, "reply_channel": reply,
                                  "method": method, "params": params})

    def _end(self, stream: str, message: dict[str, Any]) -> None:
        self.streams.pop(stream, None)
        self.send(message)

    async def lost(self) -> None:
        """The dialling process went away: its streams are cancelled on their tunnels."""
        streams_left, self.streams = self.streams, {}
        for stream, (tunnel, _sink) in streams_left.items():
            tunnel.streams.pop(stream, None)
            if not tunnel.closing:
                await tunnel.device_forward({"type": "device.forward", "frame": protocol.notification(
                    protocol.WEB_RESET, {"stream": stream, "reason": protocol.WEB_RESET_CANCELLED, "detail": ""})})


class _CallReply:
    """Where the tunnel consumer puts a relayed call's reply: written back to the dialling process."""

    def __init__(self, served: _Served) -> None:
        self.served = served

    def put(self, message: dict[str, Any]) -> None:
        self.served.send({**message, "stream": ""})


def _refused(message: dict[str, Any]) -> dict[str, Any]:
    """What the dialler gets in place of a device's message that cannot be relayed: an error for a call's
    reply, a reset of the stream for a stream's frame."""
    if message.get("type") == CALL_REPLY:
        return {"type": CALL_REPLY, "stream": "", "call_id": str(message.get("call_id")), "response": {"error": {
            "code": protocol.APPLICATION_ERROR, "message": "the device's answer cannot be relayed",
            "data": {"code": "device_error"}}}}
    return {"type": "device.stream", "stream": str(message.get("stream")), "frame": {
        "jsonrpc": "2.0", "method": protocol.WEB_RESET,
        "params": {"reason": protocol.WEB_RESET_UPSTREAM_ERROR, "detail": "the device's frame cannot be relayed"}}}


async def _ring(message: dict[str, Any]) -> None:
    """An outbox doorbell from another process for a tunnel of this one (``send_to_tunnel``)."""
    from devices.consumers import local_tunnel

    channel, frames = message.get("tunnel"), message.get("frames")
    if not isinstance(channel, str):
        raise RelayError("a doorbell without a tunnel")
    doorbell: dict[str, Any] = {"type": DOORBELL}
    if frames is not None:
        if not isinstance(frames, list) or not all(
                isinstance(item, list) and len(item) == 2 and isinstance(item[0], int) and isinstance(item[1], str)
                for item in frames):
            raise RelayError("a doorbell's frames are not [[seq, frame], ...]")
        doorbell["frames"] = frames
    tunnel = local_tunnel(channel)
    if tunnel is None:
        return  # that connection closed: the device's next hello reads the outbox, as after a lost doorbell
    await tunnel.devices_outbox(doorbell)


class _Sink:
    """Where the tunnel consumer puts one relayed stream's messages (its ``_to_stream``): written to the
    dialling process at once. Counts the stream's data passed on minus the credit returned through the relay;
    a device past its window gets the stream reset (on both sides), never buffered."""

    def __init__(self, served: _Served, tunnel: Any, stream: str, *, binary: bool) -> None:
        self.served, self.tunnel, self.stream = served, tunnel, stream
        self.window = protocol.web_window(binary)
        self.chunk = protocol.web_chunk(binary)
        self.in_flight = 0
        self.overflow = False

    def returned(self, amount: int) -> None:
        self.in_flight = max(0, self.in_flight - amount)

    def put(self, message: dict[str, Any]) -> None:
        if self.overflow:
            return
        params = (message.get("frame") or {}).get("params") or {}
        raw, text = params.get("raw"), params.get("data")
        # Exactly what the reader will count when it returns credit (decoded length: no drift over a long
        # stream of base64 frames).
        size = len(raw) if isinstance(raw, bytes) else (
            len(text) * 3 // 4 - text[-2:].count("=") if isinstance(text, str) else -1)
        if size >= 0:
            self.in_flight += protocol.web_frame_cost(size, self.window)
            if self.in_flight > self.window + self.chunk:
                self._overflowed()
                return
        if _last_word(message):
            self.served.streams.pop(self.stream, None)
        self.served.send(message)

    def _overflowed(self) -> None:
        self.overflow = True
        self.served.streams.pop(self.stream, None)
        self.tunnel.streams.pop(self.stream, None)
        reset = {"reason": protocol.WEB_RESET_FLOW, "detail": "the device sent more than its credit"}
        self.served.send({"type": "device.stream", "stream": self.stream,
                          "frame": {"jsonrpc": "2.0", "method": protocol.WEB_RESET, "params": reset}})
        if not self.tunnel.closing:
            task = asyncio.ensure_future(self.tunnel.device_forward({"type": "device.forward", "frame":
                                         protocol.notification(protocol.WEB_RESET, dict(reset, stream=self.stream))}))
            _background.add(task)
            task.add_done_callback(_background.discard)


# --- B: the process that got the request ----------------------------------------------------------------

_pools: dict[asyncio.AbstractEventLoop, dict[str, Any]] = {}


def close_connections() -> None:
    """Close every connection this process keeps to other processes' relays (their streams end as on a
    lost connection); the next stream or doorbell dials again."""
    for pool in list(_pools.values()):
        for connection in list(pool.values()):
            if isinstance(connection, Connection):
                connection.close()
        pool.clear()


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise RelayUnavailable(f"not a relay address: {address!r}")
    return host.strip("[]"), int(port)


async def dial(address: str) -> Connection:
    """A connection to the relay at ``address``: the one this process keeps, or a new one (concurrent
    callers share one dial). RelayUnavailable when there is none to be had."""
    loop = asyncio.get_running_loop()
    if loop not in _pools:
        _forget_closed_loops(_pools)
    pool = _pools.setdefault(loop, {})
    entry = pool.get(address)
    if isinstance(entry, Connection):
        if not entry.closed:
            return entry
        entry = None
    if entry is None:
        entry = pool[address] = loop.create_task(Connection.open(address))
    try:
        connection = await asyncio.shield(entry)
    except (OSError, TimeoutError, asyncio.IncompleteReadError, RelayError, RelayUnavailable) as exc:
        if pool.get(address) is entry:
            del pool[address]
        raise RelayUnavailable(f"relay {address}: {exc!r}") from None
    if pool.get(address) is entry:
        pool[address] = connection
    return connection


class Connection(asyncio.BufferedProtocol):
    """This process's connection to another process's relay, shared by every stream to it. After the
    handshake it reads the transport itself (a buffered protocol): messages are parsed where they were
    received, and a large one is received straight into a buffer of its own, so its payload is copied once
    (into the ``bytes`` the stream hands on), not three times as through a StreamReader and msgpack."""

    def __init__(self, address: str, transport: asyncio.Transport) -> None:
        self.address, self.transport = address, transport
        self.links: dict[str, RelayLink] = {}
        self.calls: dict[str, asyncio.Future] = {}  # call_id -> its reply, for calls sent on this connection
        self.closed = False
        self.loop = asyncio.get_running_loop()
        self.scratch = bytearray(SCRATCH_BYTES)
        self.start = self.end = 0  # unparsed bytes: scratch[start:end]
        self.big: bytearray | None = None  # a message larger than the scratch, being received
        self.big_filled = 0
        self.big_header = 0
        self.writable: asyncio.Future | None = None  # set while the transport asks us to pause writing
        self.handshake_writer: asyncio.StreamWriter | None = None

    @classmethod
    async def open(cls, address: str) -> Connection:
        host, port = _split(address)
        async with asyncio.timeout(CONNECT_SEC + HANDSHAKE_SEC):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                hello = await reader.readexactly(len(MAGIC) + NONCE_BYTES)
                if not hmac.compare_digest(hello[:len(MAGIC)], MAGIC):
                    raise RelayError("not a relay")
                nonce = secrets.token_bytes(NONCE_BYTES)
                writer.write(MAGIC + _tag(b"dial", hello[len(MAGIC):]) + nonce)
                if not hmac.compare_digest(await reader.readexactly(TAG_BYTES), _tag(b"answer", nonce)):
                    raise RelayError("the relay did not authenticate")
            except BaseException:
                writer.close()
                raise
        # The relay sends nothing more before our first message: the stream reader holds no bytes of ours.
        _tune(writer.transport)
        connection = cls(address, writer.transport)
        connection.handshake_writer = writer  # kept: a StreamWriter closes its transport when collected
        writer.transport.set_protocol(connection)
        return connection

    # reading (asyncio.BufferedProtocol)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.big is not None:
            return memoryview(self.big)[self.big_filled:]
        if self.end == len(self.scratch):  # full of a partial message: move it to the front
            left = self.end - self.start
            self.scratch[:left] = self.scratch[self.start:self.end]
            self.start, self.end = 0, left
        return memoryview(self.scratch)[self.end:]

    def buffer_updated(self, nbytes: int) -> None:
        try:
            if self.big is not None:
                self.big_filled += nbytes
                if self.big_filled == len(self.big):
                    big, self.big = self.big, None
                    view = memoryview(big)
                    self._deliver(decode(view[:self.big_header], bytes(view[self.big_header:])))
                return
            self.end += nbytes
            self._parse()
        except RelayError as exc:
            logger.warning("relay %s broke the protocol: %s", self.address, exc)
            self.transport.abort()
            self.close()

    def _parse(self) -> None:
        scratch, size = self.scratch, _LENGTHS.size
        while self.end - self.start >= size:
            header, payload = lengths(memoryview(scratch)[self.start:self.start + size])
            total = size + header + payload
            have = self.end - self.start
            if have >= total:
                at = self.start + size
                view = memoryview(scratch)
                message = decode(view[at:at + header], bytes(view[at + header:at + header + payload]) if payload
                                 else b"")
                self.start += total
                self._deliver(message)
                continue
            if total > len(scratch):  # receive the rest straight into a buffer of its own
                self.big = bytearray(header + payload)
                got = have - size
                self.big[:got] = scratch[self.start + size:self.end]
                self.big_filled, self.big_header = got, header
                self.start = self.end = 0
                return
            break
        if self.start == self.end:
            self.start = self.end = 0

    def _deliver(self, message: dict[str, Any]) -> None:
        if message["type"] == CALL_REPLY and not message["stream"]:
            waiting = self.calls.pop(message.get("call_id"), None)
            if waiting is not None and not waiting.done():
                waiting.set_result(message)
            return
        link = self.links.get(message["stream"])
        if link is not None:
            link.put(message)

    def connection_lost(self, exc: Exception | None) -> None:
        logger.debug("relay connection to %s ended: %r", self.address, exc)
        self.close()
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)

    def eof_received(self) -> bool:
        return False  # close

    # writing

    def pause_writing(self) -> None:
        if self.writable is None or self.writable.done():
            self.writable = self.loop.create_future()

    def resume_writing(self) -> None:
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.transport.close()
        pool = _pools.get(self.loop, {})
        if pool.get(self.address) is self:
            del pool[self.address]
        links, self.links = self.links, {}
        for link in links.values():
            link.put({"type": "device.stream.closed", "stream": link.stream})
        calls, self.calls = self.calls, {}
        for waiting in calls.values():
            if not waiting.done():
                waiting.set_exception(CallLost(f"the connection to relay {self.address} closed"))

    async def send(self, message: dict[str, Any]) -> None:
        if self.closed or self.transport.is_closing():
            raise streams.LinkLost("the relay connection closed")
        _write(self.transport, message)
        if self.writable is not None and not self.writable.done():
            await self.writable  # the socket's buffer is full: wait until it drained
            if self.closed:
                raise streams.LinkLost("the relay connection closed")


async def send_to_tunnel(address: str, channel: str, message: dict[str, Any]) -> bool:
    """An outbox doorbell (``devices.events``) for the tunnel ``channel``, held by the process whose relay is
    at ``address``, sent on the kept connection to that relay (ai1net.realtime's ``direct_sender``): a
    socket hop instead of the channel layer's trip through Redis. False (the caller takes the layer) for
    any other message, when relays are off, or when the relay cannot be reached."""
    if message.get("type") != DOORBELL or not enabled(get_channel_layer()):
        return False
    relayed: dict[str, Any] = {"type": DOORBELL, "stream": "", "tunnel": channel}
    if message.get("frames"):
        relayed["frames"] = message["frames"]
    try:
        connection = await dial(address)
        await connection.send(relayed)
    except (RelayUnavailable, streams.LinkLost) as exc:
        logger.info("doorbell to %s through the channel layer: %s", channel, exc)
        return False
    return True


async def call(address: str, channel: str, call: dict[str, Any]) -> dict[str, Any] | None:
    """A platform -> device call (``devices.services.adevice_call``'s ``device.call`` message, without a reply
    channel) for the tunnel ``channel``, held by the process whose relay is at ``address``, on the kept
    connection to that relay; its ``device.call.reply``. None (the caller takes the layer) when relays are
    off, when this is not a loop that keeps connections (the main thread's: a worker's short-lived loop
    would leave its connection behind), or when the relay cannot be reached. CallLost when the connection
    closes after the call was sent."""
    if not enabled(get_channel_layer()) or threading.current_thread() is not threading.main_thread():
        return None
    try:
        connection = await dial(address)
    except RelayUnavailable as exc:
        logger.info("call to %s through the channel layer: %s", channel, exc)
        return None
    call_id = call["call_id"]
    reply = connection.calls[call_id] = connection.loop.create_future()
    try:
        await connection.send({**call, "stream": "", "tunnel": channel})
        return await reply
    except streams.LinkLost as exc:
        raise CallLost(str(exc)) from None
    finally:
        if connection.calls.get(call_id) is reply:
            del connection.calls[call_id]


class RelayLink(streams.QueueLink):
    """One stream to a tunnel held by another daphne process, through that process's relay; through the
    channel layer (as ``TunnelLink``) when the relay cannot take it."""

    def __init__(self, tunnel_channel: str, address: str, layer: Any, *, binary: bool = False,
                 reply_channel: str | None = None) -> None:
        super().__init__(tunnel_channel, binary=binary)
        self.address = address
        self.layer = layer
        self.layer_reply = reply_channel  # where the layer brings the device's frames, if it must (else a new one)
        self.connection: Connection | None = None
        self.via_layer = False

    async def open(self, method: str | None = None, params: dict[str, Any] | None = None) -> None:
        message: dict[str, Any] = {"type": "device.stream_open", "stream": self.stream, "tunnel": self.tunnel,
                                   "binary": self.binary}
        if method is not None:
            message["frame"] = self.open_frame(method, params)
        try:
            connection = self.connection = await dial(self.address)
            connection.links[self.stream] = self
            await connection.send(message)
        except (RelayUnavailable, streams.LinkLost) as exc:  # nothing reached the tunnel
            logger.info("stream to %s through the channel layer: %s", self.tunnel, exc)
            await self._open_via_layer(method, params)
            return
        try:
            async with asyncio.timeout(OPEN_SEC):  # not wait_for: see devices.web.http.HttpStream._download
                answer = await super().receive()
        except TimeoutError:
            connection.links.pop(self.stream, None)
            raise streams.LinkLost("the relay did not answer") from None
        if answer.get("type") == OPENED:
            self.opened = True
            return
        connection.links.pop(self.stream, None)
        if answer.get("type") == NOT_HERE:
            logger.info("tunnel %s is not at relay %s: through the channel layer", self.tunnel, self.address)
            await self._open_via_layer(method, params)
            return
        raise streams.LinkLost("the relay connection closed")

    async def _open_via_layer(self, method: str | None, params: dict[str, Any] | None) -> None:
        self.via_layer = True
        self.connection = None
        self.reply = self.layer_reply or await self.layer.new_channel()
        await streams.TunnelLink.open(self, method, params)

    async def _send(self, message: dict[str, Any]) -> None:
        if self.via_layer:
            await streams.TunnelLink._send(self, message)
            return
        if self.connection is None:
            raise streams.LinkLost("the stream is not open")
        message["stream"] = self.stream
        await self.connection.send(message)

    def put(self, message: dict[str, Any]) -> None:
        if self.connection is not None and _last_word(message):
            self.connection.links.pop(self.stream, None)
        super().put(message)
        if self.overflow and self.connection is not None and self.opened:
            self.opened = False  # a relay past its window: forget the stream there too
            self.connection.links.pop(self.stream, None)
            task = asyncio.ensure_future(self._forget(protocol.WEB_RESET_FLOW))
            _background.add(task)
            task.add_done_callback(_background.discard)

    async def receive(self) -> dict[str, Any]:
        if self.via_layer:
            return await streams.TunnelLink.receive(self)
        return await super().receive()

    async def close(self, reset_reason: str | None = None, *, drain: bool = False) -> None:
        if self.via_layer:
            await streams.TunnelLink.close(self, reset_reason, drain=drain)
            return
        if not self.opened:
            return
        self.opened = False
        if self.connection is not None:
            self.connection.links.pop(self.stream, None)
        await self._forget(reset_reason)
        self.queue.clear()

    async def _forget(self, reset_reason: str | None) -> None:
        try:
            if reset_reason:
                await self.frame(protocol.WEB_RESET, {"reason": reset_reason, "detail": ""})
            await self._send({"type": "device.stream_close"})
        except streams.LinkLost:
            pass
