"""The device tunnel (/ws/device) and the owner's live device list (/ws/devices).

Tunnel, per connection:
- authenticates by ``Authorization: Bearer <token>`` (accepted first, then closed 4401/4403 so the
  client can read the code; 4429 while its address sent too many unknown tokens), waits for
  ``hello``, becomes the device's live connection (an older one is closed with 4409): its channel
  name in the device's row is where others reach it (no group: devices.events);
- delivers the durable outbox in seq order with at most ``WINDOW`` unacked items in flight. Items
  enqueued in this process are handed over after commit as ready frames (``devices.live``: no layer
  message, no read back); otherwise it reads the database on hello (when the device is behind), on
  every doorbell (``devices.outbox``) and on the heartbeat sweep, so a lost doorbell delays an item
  by one heartbeat at most; acks are written coalesced;
- runs device -> platform requests through ``devices.rpc.dispatch`` (idempotent per request id);
- closes a silent peer (4408) and sustained abuse (4400).

Channel-layer messages another process or consumer may send to the live connection's channel
(``Device.channel_name``):
- ``{"type": "device.call", call_id, reply_channel, method, params}``: a JSON-RPC request with
  id=call_id; the answer goes to reply_channel as ``{"type": "device.call.reply", call_id,
  response: {"result": ...} | {"error": {...}}}`` (see ``devices.services.adevice_call``). If the
  tunnel closes first, the error has ``data.code = "device_offline"``.
- ``{"type": "device.forward", "frame": str}``: send a raw protocol frame to the device as is
  (``"bytes": bytes`` instead of ``frame``: a binary device-web data frame).
- ``{"type": "device.stream_open", "stream": str, "reply_channel": str, "frame"?: str}``: from now on,
  every notification from the device whose ``params.stream`` equals ``stream`` (and every binary data
  frame of that stream, as ``web.data``/``web.ws_frame`` with ``params.raw``: bytes) is sent to
  reply_channel as ``{"type": "device.stream", "stream", "frame": {...parsed message...}}``; when the
  tunnel closes, reply_channel gets ``{"type": "device.stream.closed", "stream"}``. ``frame``, if any,
  goes to the device next (the stream's web.open). The stream is forgotten by itself after the device's
  last word on it (web.end, web.reset, web.ws_close).
- ``{"type": "device.stream_close", "stream": str, "ack": bool, "reply_channel"?: str}``: forget the
  stream; with ``ack``, send reply_channel a last ``{"type": "device.stream.closed", "stream"}``.
A stream opened in this process (devices.web.streams.LocalLink), or relayed from another process
(devices.web.relay), calls these handlers directly, with a reply "channel" object whose ``put`` takes the
messages: no channel layer on that path. So does a call made in this process or relayed from another
(``devices.services.adevice_call``): its reply_channel is then an object whose ``put`` takes the reply.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import weakref
from typing import Any

from channels.db import database_sync_to_async
from channels.exceptions import ChannelFull
from channels.generic.websocket import AsyncJsonWebsocketConsumer, AsyncWebsocketConsumer
from django.conf import settings
from django.utils import timezone

from ai1net import realtime
from ai1net.consumers import AppEvents, LoopDispatch
from ai1net.db_threads import DatabaseThreads, default_count
from ai1net.exceptions import ApplicationError, RateLimited, ValidationFailed
from ai1net.limits import enforce_storable
from clients import limits, protocol
from devices import events, live, rpc, selectors, services, signals
from devices.access import socket_otp_satisfied
from devices.models import Device
from devices.web import relay

logger = logging.getLogger(__name__)

WINDOW = 256  # unacked deliveries in flight per connection
ABUSE_LIMIT = 20  # malformed frames ...
ABUSE_WINDOW_SEC = 10.0  # ... within this many seconds close the tunnel with 4400
SEEN_WRITE_SEC = 120.0  # last_seen_at is written at most this often while connected

MAX_PROTOCOL_VERSION = 2**31 - 1  # Device.protocol_version's column
SWEEP_CHUNK = 500  # device rows per query of the shared heartbeat sweep

# Background tasks that outlive a consumer (ephemeral expiry): keep references so they run to the end.
_background: set[asyncio.Task] = set()

# This process's tunnels that said hello, by channel name: a device-web stream that finds the device's
# connection here talks to the consumer directly (devices.web.streams.LocalLink).
_web_tunnels: dict[str, DeviceConsumer] = {}
_STREAM_END = frozenset({protocol.WEB_END, protocol.WEB_RESET, protocol.WEB_WS_CLOSE})


def offline_reply(call_id: str) -> dict[str, Any]:
    """A call's reply when its tunnel is closed or not there (``device_offline``)."""
    return {"type": "device.call.reply", "call_id": call_id, "response": {"error": {
        "code": protocol.APPLICATION_ERROR, "message": "the device disconnected", "data": {"code": "device_offline"}}}}


def local_tunnel(channel_name: str) -> DeviceConsumer | None:
    """The live tunnel consumer ``channel_name`` when it runs in this process and this event loop."""
    tunnel = _web_tunnels.get(channel_name) if channel_name else None
    if tunnel is None or tunnel.closing or tunnel.loop is not asyncio.get_running_loop():
        return None
    return tunnel

# The tunnel's own ORM calls (token lookup, hello, presence, the heartbeat sweep, the signals) are
# self-contained, one transaction each, and touch no thread-local state across calls: they run in a
# few threads of their own (ai1net.db_threads) instead of queueing on Django's single thread-sensitive
# thread with every other consumer and view. Each thread keeps its own database connection (SQLite; a
# Postgres pool slot while in use). The hop itself is cheaper than Channels' own: a reconnect storm has 50
# of them in flight.
_tunnel_db = DatabaseThreads(default_count(), "tunnel-db")
_db = _tunnel_db.to_async


# A device's requests (a hook's event, a question) go to a thread of their own the same way, rather than to
# Channels' database_sync_to_async, whose hop is dearer and whose one thread-sensitive thread every consumer
# of the process shares. bench/tunnel.py's deliver rows (the enqueue made as a device's request), three
# interleaved rounds: the deliver frame at the device after p50 0.74-0.75 ms against 0.83-0.88, and a bare
# echo consumer's round trip beside them p50 0.38-0.39 ms against 0.45-0.46. One thread, as before: a
# process's device requests still run one at a time and hold one connection of the pool at most.
device_request_hop = DatabaseThreads(1, "device-request-db").to_async


def _bearer(scope: dict[str, Any]) -> str:
    for name, value in scope.get("headers", []):
        if name.lower() == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" else ""
    return ""


def _number(value: float) -> float | int:
    return int(value) if float(value).is_integer() else value


def _ephemeral_dead(device: Device) -> bool:
    if not device.ephemeral or device.channel_name or device.disconnected_at is None:
        return False
    return (timezone.now() - device.disconnected_at).total_seconds() > settings.DEVICE_EPHEMERAL_GRACE_SEC


async def _expire_ephemeral_later(device_id: Any) -> None:
    await asyncio.sleep(settings.DEVICE_EPHEMERAL_GRACE_SEC + 0.2)
    try:
        await database_sync_to_async(services.device_expire_ephemeral)(device_id=device_id)
    except Exception:
        logger.exception("expiring ephemeral device %s failed", device_id)


def _send_signal(signal: Any, **kwargs: Any) -> None:
    for receiver, result in signal.send_robust(sender=Device, **kwargs):
        if isinstance(result, Exception):
            logger.error("receiver %r of %s failed", receiver, signal, exc_info=result)


def _validate_hello(params: dict[str, Any], device: Device) -> dict[str, Any]:
    version = params.get("protocolVersion")
    # Bounded by its column (a 32-bit integer): 2**63 crashed the consumer's write (found by the fuzzer).
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= MAX_PROTOCOL_VERSION:
        raise ValueError(f"protocolVersion must be an integer from 1 to {MAX_PROTOCOL_VERSION}")
    if params.get("kind") not in (None, device.kind):
        raise ValueError(f"this token belongs to a {device.kind}, not a {params.get('kind')}")
    acked = params.get("ackedSeq", 0)
    if not isinstance(acked, int) or isinstance(acked, bool) or not 0 <= acked <= protocol.MAX_SEQ:
        raise ValueError(f"ackedSeq must be an integer from 0 to {protocol.MAX_SEQ}")
    capabilities = params.get("capabilities") or []
    roots = params.get("roots") or []
    ports = params.get("ports") or []
    if not isinstance(capabilities, list) or not all(isinstance(c, str) for c in capabilities):
        raise ValueError("capabilities must be a list of strings")
    if not isinstance(roots, list) or not all(isinstance(r, str) for r in roots):
        raise ValueError("roots must be a list of strings")
    if not isinstance(ports, list) or not all(isinstance(p, int) and not isinstance(p, bool) for p in ports):
        raise ValueError("ports must be a list of integers")
    version_text = str(params.get("version", ""))
    # Sizes declared in clients.limits; LimitExceeded is a ValueError: -32602 naming field and limit.
    limits.check("hello.capabilities", capabilities, "capabilities")
    limits.check("hello.roots", roots, "roots")
    limits.check("hello.ports", ports, "ports")
    for i, capability in enumerate(capabilities):
        limits.check("hello.capability", capability, f"capabilities[{i}]")
    for i, root in enumerate(roots):
        limits.check("hello.root", root, f"roots[{i}]")
    limits.check("hello.version", version_text, "version")
    try:  # stored with the device: PostgreSQL refused a NUL here, and the consumer died of it
        enforce_storable({"version": version_text, "capabilities": capabilities, "roots": roots}, "hello")
    except ValidationFailed as exc:
        raise ValueError(exc.detail) from None
    return {"protocolVersion": version, "kind": device.kind, "version": version_text,
            "capabilities": capabilities, "ports": ports, "roots": roots, "ackedSeq": acked}


class _TunnelSweep:
    """The database side of every tunnel's heartbeat in this process (one per event loop).

    Each beat it reads (status, next_seq, channel) of all connected devices in one query per SWEEP_CHUNK rows
    and writes last_seen_at of those due in one UPDATE per chunk; a tunnel whose device was revoked
    closes with 4403, one that a newer connection replaced with 4409 (if that message was lost), one
    with items a lost doorbell left behind pumps. Before, every tunnel read its
    row on its own beat: 15,000 idle tunnels at a 20 s beat were 750 reads/s (and 250 writes/s).
    """

    _by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _TunnelSweep] = weakref.WeakKeyDictionary()

    def __init__(self) -> None:
        self.tunnels: set[DeviceConsumer] = set()
        self.task: asyncio.Task | None = None

    @classmethod
    def join(cls, tunnel: DeviceConsumer) -> None:
        loop = asyncio.get_running_loop()
        sweep = cls._by_loop.get(loop)
        if sweep is None:
            sweep = cls._by_loop[loop] = cls()
        sweep.tunnels.add(tunnel)
        if sweep.task is None or sweep.task.done():
            sweep.task = loop.create_task(sweep.run())

    @classmethod
    def leave(cls, tunnel: DeviceConsumer) -> None:
        sweep = cls._by_loop.get(asyncio.get_running_loop())
        if sweep is not None:
            sweep.tunnels.discard(tunnel)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while self.tunnels:  # ends with the last tunnel; the next join starts it again
            beat = settings.DEVICE_HEARTBEAT_SEC
            await asyncio.sleep(beat)
            tunnels = [t for t in self.tunnels if t.hello_done and not t.closing]
            if not tunnels:
                continue
            now = loop.time()
            due = [t for t in tunnels if now - t.last_seen_write >= min(SEEN_WRITE_SEC, beat * 3)]
            try:
                states = await _db(selectors.devices_tick_state)(device_ids=[t.device.pk for t in tunnels],
                                                                 chunk=SWEEP_CHUNK)
                if due:
                    await _db(services.devices_seen)(
                        connections=[(t.device.pk, t.channel_name) for t in due], chunk=SWEEP_CHUNK)
                    for tunnel in due:
                        tunnel.last_seen_write = now
            except Exception:
                logger.exception("tunnel heartbeat sweep failed")
                continue
            for tunnel in tunnels:
                status, next_seq, channel = states.get(tunnel.device.pk, (None, 0, ""))
                replaced = bool(channel) and channel != tunnel.channel_name
                if status != Device.Status.ACTIVE or replaced or next_seq - 1 > tunnel.last_sent:
                    task = loop.create_task(tunnel._swept(status, next_seq, replaced))
                    _background.add(task)
                    task.add_done_callback(_background.discard)


class DeviceConsumer(LoopDispatch, AsyncWebsocketConsumer):
    device: Device | None = None

    async def connect(self) -> None:
        loop = asyncio.get_running_loop()
        self.loop = loop
        self.closing = False
        self.hello_done = False
        self.connected_at = loop.time()
        self.last_received = loop.time()
        self.last_seen_write = loop.time()
        self.abuse: collections.deque[float] = collections.deque()
        self.last_sent = self.acked = self.acked_flushed = 0
        self.maybe_more = False
        self.pumping = False
        self.pump_again = False
        self.wake_pending = False  # a doorbell came before hello was done
        self.handed_early: list[tuple[int, str]] = []  # ... or items handed over (devices.live)
        self.outgoing: collections.deque[str] = collections.deque()  # deliver frames, in seq order
        self.sender: asyncio.Task | None = None
        self.ack_task: asyncio.Task | None = None
        self.ticker: asyncio.Task | None = None
        self.tasks: set[asyncio.Task] = set()
        self.calls: dict[str, Any] = {}  # platform -> device request id -> reply channel (or object: put)
        self.streams: dict[str, str] = {}  # stream id -> reply channel
        if settings.DEVICE_WS_DISABLED:
            await self.close()  # refuse the handshake (403), as a proxy that blocks WebSockets would
            return
        await self.accept()
        # Before the hello makes this connection the device's live one: an item enqueued in this
        # process from then on is handed straight to it (devices.live).
        live.add(self.channel_name, self)
        try:
            device = await _db(services.device_authenticate)(raw_token=_bearer(self.scope),
                                                             ip=(self.scope.get("client") or [None])[0])
        except RateLimited:
            await self._close(protocol.CLOSE_RATE_LIMITED)
            return
        if device is None:
            await self._close(protocol.CLOSE_UNAUTHORIZED)
            return
        if device.status == Device.Status.ACTIVE and _ephemeral_dead(device):
            await database_sync_to_async(services.device_expire_ephemeral)(device_id=device.pk)
            device.status = Device.Status.REVOKED
        if device.status != Device.Status.ACTIVE:
            await self._close(protocol.CLOSE_REVOKED)
            return
        self.device = device
        self.ticker = asyncio.create_task(self._tick())

    async def _close(self, code: int) -> None:
        if self.closing:
            return
        self.closing = True
        await self.close(code=code, reason=protocol.CLOSE_REASONS.get(code))

    # --- frames from the device ---------------------------------------------------------------

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.closing or self.device is None:
            return
        self.last_received = self.loop.time()
        if bytes_data is not None and self.hello_done and bytes_data[:1] in (b"\x01", b"\x02"):
            await self._on_web_binary(bytes_data)  # device web data (clients/protocol.py)
            return
        if text_data is not None and len(text_data) > limits.LIMITS["frame"].max:
            await self.send(protocol.error(None, protocol.INVALID_REQUEST, "frame too large"))
            await self._close(protocol.CLOSE_PROTOCOL_ABUSE)
            return
        try:
            message = protocol.parse(text_data if text_data is not None else (bytes_data or b""))
        except protocol.ProtocolError as exc:
            await self._bad_frame(exc.request_id, exc.code, exc.message)
            return
        if protocol.is_response(message):
            await self._on_response(message)
            return
        method, params, request_id = message["method"], message["params"], message.get("id")
        if method == protocol.HELLO:
            await self._on_hello(request_id, params)
        elif not self.hello_done:
            await self._bad_frame(request_id, protocol.INVALID_REQUEST, "send hello first")
        elif method == protocol.ACK:
            await self._on_ack(params)
        elif method == protocol.HEARTBEAT:
            pass
        elif request_id is None:
            await self._on_notification(method, params)
        else:
            task = asyncio.create_task(self._on_request(request_id, method, params))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _bad_frame(self, request_id: Any, code: int, message: str) -> None:
        now = self.loop.time()
        self.abuse.append(now)
        while self.abuse and self.abuse[0] < now - ABUSE_WINDOW_SEC:
            self.abuse.popleft()
        if len(self.abuse) >= ABUSE_LIMIT:
            await self._close(protocol.CLOSE_PROTOCOL_ABUSE)
            return
        await self.send(protocol.error(request_id, code, message))

    async def _on_hello(self, request_id: Any, params: dict[str, Any]) -> None:
        if request_id is None:
            await self._bad_frame(None, protocol.INVALID_REQUEST, "hello is a request: give it an id")
            return
        if self.hello_done:
            await self._bad_frame(request_id, protocol.INVALID_REQUEST, "hello was already said")
            return
        try:
            hello = _validate_hello(params, self.device)
        except ValueError as exc:
            await self._bad_frame(request_id, protocol.INVALID_PARAMS, str(exc))
            return
        # A doorbell rung after the hello's write comes to this channel (the enqueue reads the live
        # channel under the device row's lock); one rung before it is covered by the read below.
        # Scaled out, other processes reach this tunnel's streams through this process's relay (written
        # with the channel name); started with the first hello.
        relay_address = await relay.serve() if relay.enabled(self.channel_layer) else ""
        try:
            device, older = await self._hello_write(hello, params, relay_address)
        except ApplicationError:
            await self._close(protocol.CLOSE_REVOKED)
            return
        except Device.DoesNotExist:
            await self._close(protocol.CLOSE_UNAUTHORIZED)
            return
        self.device = device
        if older:
            try:
                await self.channel_layer.send(older, {"type": events.REPLACED})
            except ChannelFull:
                # The older connection's process is gone (a restart): channels-redis keeps one list per
                # process, and 1,000 reconnects filled it. A live older connection that missed this
                # learns it from the sweep (its device's channel is no longer its own).
                logger.info("replaced connection %s of %s is not listening", older, device.pk)
        self.hello_done = True
        _web_tunnels[self.channel_name] = self
        self.last_sent = self.acked = self.acked_flushed = hello["ackedSeq"]
        self.last_seen_write = self.loop.time()
        _TunnelSweep.join(self)
        await self.send(protocol.result(request_id, {
            "deviceId": str(device.pk),
            "heartbeatSec": _number(settings.DEVICE_HEARTBEAT_SEC),
            "protocolVersion": protocol.PROTOCOL_VERSION,
            "resendFrom": hello["ackedSeq"] + 1,
        }))
        # The hello's write saw next_seq as it is: read the outbox only when the device is behind it,
        # or when something rang while the hello was on its way.
        early, self.handed_early = self.handed_early, []
        if self.wake_pending or device.next_seq - 1 > hello["ackedSeq"]:
            self.wake_pending = False
            self._background(self._pump())
        elif early:  # e.g. what a device_connected receiver enqueued: sent as handed, or read if it must be
            self.outbox_handed(sorted(early))

    async def _on_ack(self, params: dict[str, Any]) -> None:
        seq = params.get("seq")
        if not isinstance(seq, int) or isinstance(seq, bool) or not 0 <= seq <= protocol.MAX_SEQ:
            await self._bad_frame(None, protocol.INVALID_PARAMS,
                                  f"ack needs {{seq: integer from 0 to {protocol.MAX_SEQ}}}")
            return
        if seq <= self.acked:
            return
        self.acked = seq
        if self.ack_task is None or self.ack_task.done():
            self.ack_task = asyncio.create_task(self._flush_acks())
        if self.maybe_more and self.last_sent - self.acked <= WINDOW // 2:
            await self._pump()

    async def _flush_acks(self) -> None:
        # Coalesced: however many acks arrived meanwhile, one write covers them all.
        while self.acked > self.acked_flushed:
            seq = self.acked
            try:
                await _db(services.outbox_ack)(device_id=self.device.pk, seq=seq, after=self.acked_flushed)
            except Exception:
                logger.exception("recording ack %s of %s failed", seq, self.device.pk)
                return
            self.acked_flushed = seq

    async def _on_request(self, request_id: Any, method: str, params: dict[str, Any]) -> None:
        try:
            # The request's doorbells (a question's phone event ...) leave with its result: one wake-up.
            dispatch = realtime.collecting(device_request_hop, rpc.dispatch)
            response = await dispatch(self.device, request_id, method, params)
        except Exception:  # e.g. the database is unreachable: the device retries with the same id
            logger.exception("device request %s failed", method)
            response = {"error": {"code": protocol.INTERNAL_ERROR, "message": "internal error"}}
        if "error" in response:
            err = response["error"]
            frame = protocol.error(request_id, err["code"], err["message"], err.get("data"))
        else:
            frame = protocol.result(request_id, response["result"])
        await self._send_safely(frame)

    async def _on_notification(self, method: str, params: dict[str, Any]) -> None:
        stream = params.get("stream")
        if isinstance(stream, str) and stream in self.streams:
            last = method in _STREAM_END or params.get("end") is True  # the device's last word on it
            target = self.streams.pop(stream) if last else self.streams[stream]
            await self._to_stream(target, stream, {"jsonrpc": "2.0", "method": method, "params": params})
            return
        if isinstance(stream, str) and method.startswith("web."):
            return  # a late frame of a device-web stream the platform already ended: not abuse
        await self._bad_frame(None, protocol.METHOD_NOT_FOUND, f"unknown notification {method!r}")

    async def _on_web_binary(self, frame: bytes) -> None:
        try:
            kind, stream, seq, payload = protocol.parse_web_binary(frame)
        except protocol.ProtocolError as exc:
            await self._bad_frame(None, exc.code, exc.message)
            return
        target = self.streams.get(stream)
        if target is None:
            return  # a late frame of a stream the platform already ended
        method = protocol.WEB_DATA if kind == protocol.WEB_BIN_DATA else protocol.WEB_WS_FRAME
        await self._to_stream(target, stream, {"jsonrpc": "2.0", "method": method,
                                               "params": {"stream": stream, "seq": seq, "raw": payload}})

    async def _to_stream(self, target: Any, stream: str, frame: dict[str, Any] | None) -> None:
        """A device-web stream's message to its reader: a frame, or (None) the end of the stream."""
        message = {"type": "device.stream", "stream": stream, "frame": frame} if frame is not None else {
            "type": "device.stream.closed", "stream": stream}
        if not isinstance(target, str):
            target.put(message)  # a stream in this process (LocalLink)
            return
        try:
            await self.channel_layer.send(target, message)
        except ChannelFull:  # the receiver sees the seq gap (or times out) and resets its stream
            logger.warning("stream %s of %s is full; frame dropped", stream, self.device.pk)

    async def _on_response(self, message: dict[str, Any]) -> None:
        reply_channel = self.calls.pop(str(message["id"]), None)
        if reply_channel is None:
            return  # a late answer to a call that gave up, or noise
        response = {"error": message["error"]} if "error" in message else {"result": message.get("result")}
        await self._call_reply(reply_channel, {"type": "device.call.reply", "call_id": str(message["id"]),
                                               "response": response})

    async def _call_reply(self, target: Any, reply: dict[str, Any]) -> None:
        """A call's reply to its caller: a channel name (the layer), or a waiter in this process or a relay's
        sink (``put``)."""
        if isinstance(target, str):
            await self.channel_layer.send(target, reply)
        else:
            target.put(reply)

    # --- outbox -------------------------------------------------------------------------------

    async def _pump(self) -> None:
        """Send unacked items after last_sent, in order, keeping at most WINDOW in flight."""
        if self.pumping:
            self.pump_again = True
            return
        self.pumping = True
        try:
            while not self.closing:
                self.pump_again = False
                room = WINDOW - max(0, self.last_sent - self.acked)
                if room > 0:
                    frames = await _db(selectors.outbox_frames_after)(
                        device_id=self.device.pk, after_seq=self.last_sent, limit=room
                    )
                    self._queue_frames(frames)
                    self.maybe_more = len(frames) == room
                    if self.maybe_more and self.last_sent - self.acked < WINDOW:
                        continue  # acks arrived while sending
                if not self.pump_again:
                    break
        finally:
            self.pumping = False

    def outbox_handed(self, frames: list[tuple[int, str]]) -> None:
        """Items enqueued in this process, committed, as (seq, deliver frame) (devices.live). Sent as
        they are when they follow what was sent and fit the window; else the outbox is read."""
        if self.closing:
            return
        if not self.hello_done:
            self.handed_early.extend(frames)  # committed: the hello sends them (or reads the outbox)
            return
        fresh = [(seq, frame) for seq, frame in frames if seq > self.last_sent]
        if not fresh:
            return
        if self.pumping or fresh[0][0] != self.last_sent + 1 or fresh[-1][0] - self.acked > WINDOW:
            self._background(self._pump())
            return
        self._queue_frames(fresh)

    def _queue_frames(self, frames: list[tuple[int, str]]) -> None:
        """Send deliver frames after those queued before, skipping any already sent."""
        for seq, frame in frames:
            if seq > self.last_sent:
                self.last_sent = seq
                self.outgoing.append(frame)
        if self.outgoing and (self.sender is None or self.sender.done()):
            self.sender = asyncio.create_task(self._send_outgoing())

    async def _send_outgoing(self) -> None:
        while self.outgoing and not self.closing:
            await self._send_safely(self.outgoing.popleft())

    def _background(self, coroutine: Any) -> None:
        task = asyncio.create_task(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    # --- heartbeat ----------------------------------------------------------------------------

    async def _tick(self) -> None:
        beat = settings.DEVICE_HEARTBEAT_SEC
        try:
            while not self.closing:
                await asyncio.sleep(beat)
                now = self.loop.time()
                if now - self.last_received > protocol.HEARTBEAT_MISSES * beat:
                    await self._close(protocol.CLOSE_HEARTBEAT_TIMEOUT)
                    return
                if not self.hello_done:
                    if now - self.connected_at > protocol.HEARTBEAT_MISSES * beat:
                        await self._close(protocol.CLOSE_PROTOCOL_ABUSE)
                        return
                    continue
                await self._send_safely(protocol.notification(protocol.HEARTBEAT))
                # The database side of the beat (revocation, lost doorbells, last seen) is the
                # process-wide sweep's: one query per beat for every tunnel (_TunnelSweep).
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("tunnel heartbeat of %s failed", getattr(self.device, "pk", None))

    async def _swept(self, status: str | None, next_seq: int, replaced: bool = False) -> None:
        """The sweep read this device's row: close a revoked or replaced tunnel (its message may have
        been lost), send what a lost doorbell left."""
        if self.closing or not self.hello_done:
            return
        if status != Device.Status.ACTIVE:
            await self._close(protocol.CLOSE_REVOKED)
        elif replaced:
            await self._close(protocol.CLOSE_REPLACED)
        elif next_seq - 1 > self.last_sent:
            await self._pump()

    async def _send_safely(self, frame: str) -> None:
        if self.closing:
            return
        try:
            await self.send(frame)
        except Exception:  # the socket went away meanwhile
            logger.debug("send on a closed tunnel", exc_info=True)

    async def _signal(self, signal: Any, **kwargs: Any) -> None:
        await _db(_send_signal)(signal, **kwargs)

    def _hello_write(self, hello: dict[str, Any], params: dict[str, Any], relay_address: str = "") -> asyncio.Future:
        """``services.device_hello``, then the ``device_connected`` receivers, in one trip to a database
        thread: the future settles as soon as the hello is written; the receivers run after it there."""
        loop, known, channel_name = self.loop, self.device, self.channel_name
        written: asyncio.Future = loop.create_future()

        def settle(result: Any, error: BaseException | None) -> None:
            if written.done():
                return
            if error is not None:
                written.set_exception(error)
            else:
                written.set_result(result)

        def write_then_signal() -> None:
            try:
                result = services.device_hello(device_id=known.pk, channel_name=channel_name, hello=hello,
                                               known=known, relay=relay_address)
            except Exception as exc:
                loop.call_soon_threadsafe(settle, None, exc)
                return
            loop.call_soon_threadsafe(settle, result, None)
            # A copy for the receivers: what they do to it (an enqueue moves its next_seq) must not reach
            # the hello, which reads the device on the loop meanwhile (it read the outbox for nothing).
            _send_signal(signals.device_connected, device=result[0].copied(), hello=params)

        self._background(_db(write_then_signal)())
        return written

    # --- channel-layer messages ---------------------------------------------------------------

    async def devices_outbox(self, message: dict[str, Any]) -> None:
        frames = message.get("frames")
        if frames and self.hello_done:
            # The ringer's committed items: sent as they are if they follow what was sent (as a
            # hand-over in this process), else the outbox is read.
            self.outbox_handed([(int(seq), frame) for seq, frame in frames])
        elif self.hello_done:
            await self._pump()
        else:
            self.wake_pending = True

    async def devices_close(self, message: dict[str, Any]) -> None:
        await self._close(int(message.get("code") or protocol.CLOSE_REVOKED))

    async def devices_replaced(self, message: dict[str, Any]) -> None:
        await self._close(protocol.CLOSE_REPLACED)

    async def device_call(self, message: dict[str, Any]) -> None:
        call_id, reply_channel = str(message["call_id"]), message["reply_channel"]
        if self.closing or not self.hello_done:
            await self._offline_reply(call_id, reply_channel)
            return
        self.calls[call_id] = reply_channel
        await self._send_safely(protocol.request(message["method"], message.get("params") or {}, call_id))

    async def device_forward(self, message: dict[str, Any]) -> None:
        if not self.hello_done or self.closing:
            return
        if "bytes" in message:
            try:
                await self.send(bytes_data=message["bytes"])
            except Exception:  # the socket went away meanwhile
                logger.debug("send on a closed tunnel", exc_info=True)
            return
        await self._send_safely(message["frame"])

    async def device_stream_open(self, message: dict[str, Any]) -> None:
        self.streams[str(message["stream"])] = message["reply_channel"]
        if message.get("frame"):
            await self.device_forward({"type": "device.forward", "frame": message["frame"]})

    async def device_stream_close(self, message: dict[str, Any]) -> None:
        reply_channel = self.streams.pop(str(message["stream"]), None) or message.get("reply_channel")
        if reply_channel is not None and message.get("ack"):
            # The last message of the stream: its reader drains up to here, so nothing is left behind
            # in a channel nobody reads (channels-redis would keep it in the process's buffer).
            await self._to_stream(reply_channel, str(message["stream"]), None)

    async def _offline_reply(self, call_id: str, reply_channel: Any) -> None:
        await self._call_reply(reply_channel, offline_reply(call_id))

    # --- end ----------------------------------------------------------------------------------

    async def disconnect(self, code: int) -> None:
        self.closing = True
        if _web_tunnels.get(self.channel_name) is self:
            del _web_tunnels[self.channel_name]
        live.discard(self.channel_name, self)
        _TunnelSweep.leave(self)
        # Let go of the ticker: cancelled, it keeps its CancelledError, whose traceback holds this consumer (a
        # reference cycle that only the cyclic collector would free; ai1net.connection_cycles).
        ticker, self.ticker = self.ticker, None
        if ticker is not None:
            ticker.cancel()
        if self.device is None or not self.hello_done:
            return
        for call_id, reply_channel in list(self.calls.items()):
            await self._offline_reply(call_id, reply_channel)
        self.calls.clear()
        for stream, reply_channel in list(self.streams.items()):
            await self._to_stream(reply_channel, stream, None)
        self.streams.clear()
        if self.ack_task is not None:
            await asyncio.gather(self.ack_task, return_exceptions=True)
        await self._flush_acks()
        device = await _db(services.device_disconnected)(
            device_id=self.device.pk, channel_name=self.channel_name, known=self.device
        )
        if device is None:
            return  # replaced: the newer connection owns presence
        await self._signal(signals.device_disconnected, device=device)
        if device.ephemeral and device.status == Device.Status.ACTIVE:
            task = asyncio.create_task(_expire_ephemeral_later(device.pk))
            _background.add(task)
            task.add_done_callback(_background.discard)


class DevicesPageConsumer(AppEvents, LoopDispatch, AsyncJsonWebsocketConsumer):
    """/ws/devices: pushes ``devices.presence.changed`` for the logged-in user's devices (they come as app
    events, AppEvents)."""

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or not await database_sync_to_async(socket_otp_satisfied)(
            user, self.scope.get("session")
        ):
            await self.close(code=4401)
            return
        self.groups = [events.user_group(user.pk)]
        await self.channel_layer.group_add(self.groups[0], self.channel_name)
        await self.accept()

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        pass  # the page only listens

    async def devices_presence_changed(self, message: dict[str, Any]) -> None:
        # What a process of the version before sends (presence as a message of its own type).
        await self.send_json(message)
