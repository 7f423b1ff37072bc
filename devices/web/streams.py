"""What the HTTP and WebSocket paths of device web share: the link to the device's tunnel consumer,
credit flow control, header filtering and the plain error pages.

Frames to the device go straight to the channel of its live tunnel connection (``Device.channel_name``)
with ``layer.send``: unlike ``group_send``, a full channel raises instead of dropping, so we wait and
retry. Frames from the device reach our own channel through the tunnel consumer's stream table
(``device.stream_open``; see devices/consumers.py).

When the device's tunnel lives in this very process (always in the embedded setup; with several daphne
processes, when the request lands on the one the device dialled), a stream (HTTP or WebSocket) takes
``LocalLink`` instead: the same messages, handed to the tunnel consumer's handlers and back through an in-memory
queue, never through the channel layer (whose every message costs a copy, and with Redis a round trip
and ~2.6 ms of CPU). When another daphne process holds the tunnel, a stream goes to that process's
stream relay (``devices.web.relay.RelayLink``: one TCP connection between the two processes carries the
same messages), and through the channel layer only when that relay cannot take it. Streams of a device
with the ``web.binary`` capability move their data as binary frames (clients/protocol.py) and use the
larger binary window.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import html
import json
import re
import secrets
from typing import Any
from urllib.parse import quote

from channels.exceptions import ChannelFull
from channels.layers import get_channel_layer
from django.conf import settings
from django.shortcuts import resolve_url

from ai1net import hosts
from ai1net.exceptions import ApplicationError
from clients import protocol

_PREFIX = re.compile(rb"^/d/[^/]+/[^/]+")
FULL_RETRY_SEC = 0.02  # a full tunnel channel: back off this long, doubling ...
FULL_GIVE_UP_SEC = 10.0  # ... and give the stream up after this long
DRAIN_SEC = 5.0  # how long a finished stream reads its channel for the tunnel's last word

HOP_BY_HOP = frozenset({
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"proxy-connection", b"te",
    b"trailer", b"transfer-encoding", b"upgrade",
})
# The platform's own view of the request: replaced or meaningless on the device.
INTERNAL = frozenset({b"host", b"expect", b"forwarded", b"x-real-ip", b"daphne-root-path"})
WS_HANDSHAKE = frozenset({
    b"sec-websocket-key", b"sec-websocket-version", b"sec-websocket-extensions", b"sec-websocket-protocol",
    b"origin",
})


class LinkLost(Exception):
    """The tunnel connection is gone or does not take our frames."""


class TunnelLink:
    """One stream's way to the device: frames out via the tunnel consumer's channel, frames back on our
    own reply channel. ``binary``: the device takes binary data frames (and the larger window)."""

    via_layer = True  # the device's frames come through the channel layer (False: to ``put``)

    def __init__(self, layer: Any, tunnel_channel: str, reply_channel: Any, *, binary: bool = False) -> None:
        self.layer = layer
        self.tunnel = tunnel_channel
        self.reply = reply_channel
        self.stream = secrets.token_urlsafe(18)
        self.opened = False
        self.binary = binary
        self.window = protocol.web_window(binary)
        self.chunk = protocol.web_chunk(binary)

    async def _send(self, message: dict[str, Any]) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + FULL_GIVE_UP_SEC
        delay = FULL_RETRY_SEC
        while True:
            try:
                await self.layer.send(self.tunnel, message)
                return
            except ChannelFull:
                if loop.time() + delay > deadline:
                    raise LinkLost("the device's tunnel is congested") from None
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.5)

    async def open(self, method: str | None = None, params: dict[str, Any] | None = None) -> None:
        """Register the stream on the tunnel and, in the same message, send its first frame (web.open)."""
        message: dict[str, Any] = {"type": "device.stream_open", "stream": self.stream, "reply_channel": self.reply}
        if method is not None:
            message["frame"] = self.open_frame(method, params)
        await self._send(message)
        self.opened = True

    def open_frame(self, method: str, params: dict[str, Any] | None) -> str:
        if self.binary:
            params = dict(params or {}, binary=True)
        return protocol.notification(method, dict(params or {}, stream=self.stream))

    async def frame(self, method: str, params: dict[str, Any]) -> None:
        message = {"type": "device.forward", "frame": protocol.notification(method, dict(params, stream=self.stream))}
        if method == protocol.WEB_CREDIT:
            message["credit"] = params.get("bytes")  # for a relay on the way (devices.web.relay): what we freed
        await self._send(message)

    async def data(self, seq: int, payload: bytes, kind: int = protocol.WEB_BIN_DATA) -> None:
        """One chunk of body (or one binary WebSocket message): a binary frame, or base64 in JSON text."""
        if self.binary:
            await self._send({"type": "device.forward", "bytes": protocol.web_binary(kind, self.stream, seq, payload)})
            return
        method = protocol.WEB_DATA if kind == protocol.WEB_BIN_DATA else protocol.WEB_WS_FRAME
        await self.frame(method, {"seq": seq, "data": base64.b64encode(payload).decode("ascii")})

    async def receive(self) -> dict[str, Any]:
        """The next message for this stream: ``{"type": "device.stream", "stream", "frame"}`` or
        ``{"type": "device.stream.closed", "stream"}``."""
        return await self.layer.receive(self.reply)

    async def close(self, reset_reason: str | None = None, *, drain: bool = False) -> None:
        """Forget the stream on the tunnel; with a reason, tell the device to abort it first. With
        ``drain``, read our reply channel up to the tunnel's last word on the stream, so frames still
        in flight do not stay behind in the layer (the caller owns the channel and reads it only here)."""
        if not self.opened:
            return
        self.opened = False
        try:
            if reset_reason:
                await self.frame(protocol.WEB_RESET, {"reason": reset_reason, "detail": ""})
            await self._send({"type": "device.stream_close", "stream": self.stream, "ack": drain,
                              "reply_channel": self.reply})
        except LinkLost:
            return
        if drain:
            try:
                async with asyncio.timeout(DRAIN_SEC):
                    while True:
                        message = await self.receive()
                        if message.get("type") == "device.stream.closed":
                            return
            except TimeoutError:
                pass


class QueueLink(TunnelLink):
    """A stream whose messages from the tunnel come to ``put`` (no channel layer) and wait in a queue for
    ``receive``. The queue is bounded like a channel: a device that sends past its credit gets the stream
    reset, never our memory filled."""

    via_layer = False

    def __init__(self, tunnel_channel: str, *, binary: bool = False) -> None:
        super().__init__(None, tunnel_channel, self, binary=binary)
        self.queue: collections.deque[dict[str, Any]] = collections.deque()
        self.ready = asyncio.Event()
        self.queued = 0  # credit cost of the data frames in the queue
        self.overflow = False

    def put(self, message: dict[str, Any]) -> None:
        """Called by the tunnel consumer (sync, on the event loop) for every message of this stream."""
        if self.overflow:
            return
        params = (message.get("frame") or {}).get("params") or {}
        raw, text = params.get("raw"), params.get("data")
        size = len(raw) if isinstance(raw, bytes) else len(text) * 3 // 4 if isinstance(text, str) else -1
        if size >= 0:
            message["cost"] = cost = protocol.web_frame_cost(size, self.window)
            self.queued += cost
            if self.queued > self.window + self.chunk:
                self.overflow = True
                self.queue.clear()
                message = {"type": "device.stream", "stream": self.stream, "frame": {
                    "method": protocol.WEB_RESET,
                    "params": {"reason": protocol.WEB_RESET_FLOW, "detail": "the device sent more than its credit"}}}
        self.queue.append(message)
        self.ready.set()

    async def receive(self) -> dict[str, Any]:
        while not self.queue:
            self.ready.clear()
            await self.ready.wait()
        message = self.queue.popleft()
        self.queued -= message.get("cost", 0)
        return message


class LocalLink(QueueLink):
    """A stream whose device tunnel is a consumer in this process: the same messages, handed to the
    consumer's handlers directly, and the consumer hands the device's frames to ``put`` (no channel
    layer, no copy)."""

    def __init__(self, tunnel: Any, *, binary: bool = False) -> None:
        super().__init__(tunnel.channel_name, binary=binary)
        self.consumer = tunnel

    async def _send(self, message: dict[str, Any]) -> None:
        if self.consumer.closing:
            raise LinkLost("the device's tunnel closed")
        handler = getattr(self.consumer, message["type"].replace(".", "_"))
        await handler(message)

    async def close(self, reset_reason: str | None = None, *, drain: bool = False) -> None:
        if not self.opened:
            return
        self.opened = False
        self.consumer.streams.pop(self.stream, None)
        if reset_reason and not self.consumer.closing:
            try:
                await self.frame(protocol.WEB_RESET, {"reason": reset_reason, "detail": ""})
            except LinkLost:
                pass
        self.queue.clear()


async def link_to(device: Any, reply_channel: str | None = None) -> TunnelLink:
    """One stream's way (an HTTP request's, a WebSocket's) to ``device``'s live tunnel: in-process when the
    tunnel consumer runs here (``DEVICE_WEB_IN_PROCESS``, on by default); else straight to the stream relay of
    the daphne process that holds it (``Device.relay``, scaled out: devices.web.relay), which falls back to the
    channel layer when that relay cannot take the stream; else through the channel layer. Through the layer,
    the device's frames come to ``reply_channel`` (a consumer's own channel, read by its dispatch) or to a new
    channel that ``receive`` reads."""
    from devices.consumers import local_tunnel
    from devices.web import relay

    binary = protocol.WEB_BINARY_CAPABILITY in (device.capabilities or [])
    tunnel = local_tunnel(device.channel_name) if settings.DEVICE_WEB_IN_PROCESS else None
    if tunnel is not None:
        return LocalLink(tunnel, binary=binary)
    layer = get_channel_layer()
    if getattr(device, "relay", "") and relay.enabled(layer):
        return relay.RelayLink(device.channel_name, device.relay, layer, binary=binary, reply_channel=reply_channel)
    # No custom prefix: channels-redis reads every process-local channel from one list per prefix.
    return TunnelLink(layer, device.channel_name, reply_channel or await layer.new_channel(), binary=binary)


class Credit:
    """What we may still send on one stream (the device returns credit as it hands data on)."""

    def __init__(self, window: int = protocol.WEB_WINDOW_BYTES) -> None:
        self.window = window
        self.available = window
        self.changed = asyncio.Event()

    def add(self, amount: Any) -> bool:
        if isinstance(amount, bool) or not isinstance(amount, int) or not 0 < amount <= self.window:
            return False
        self.available = min(self.available + amount, self.window)
        self.changed.set()
        return True

    def cost(self, size: int) -> int:
        return protocol.web_frame_cost(size, self.window)

    async def take(self, size: int, timeout: float) -> None:
        cost = self.cost(size)
        while self.available < cost:
            self.changed.clear()
            async with asyncio.timeout(timeout):  # not wait_for: see devices.web.http.HttpStream._download
                await self.changed.wait()
        self.available -= cost


class Receipts:
    """Credit we owe the device for data we handed on; returned in quarter-window batches."""

    def __init__(self, window: int = protocol.WEB_WINDOW_BYTES) -> None:
        self.window = window
        self.owed = 0
        self.in_flight = 0  # what the device has sent and we have not handed on yet

    def received(self, size: int) -> bool:
        """False when the device sent more than its window (it ignores flow control)."""
        self.in_flight += protocol.web_frame_cost(size, self.window)
        return self.in_flight <= self.window

    def handed_on(self, size: int) -> int:
        cost = protocol.web_frame_cost(size, self.window)
        self.in_flight -= cost
        self.owed += cost
        if self.owed >= self.window // 4:
            owed, self.owed = self.owed, 0
            return owed
        return 0


def prefix_of(device_id: Any, port: Any) -> str:
    return f"/d/{device_id}/{port}"


def strip_prefix(raw_path: bytes) -> str:
    """/d/<device>/<port>/rest (as the browser sent it, still percent-encoded) -> /rest."""
    return _PREFIX.sub(b"", raw_path, count=1).decode("latin-1") or "/"


def header_value(scope: dict[str, Any], name: bytes) -> str:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin-1")
    return ""


def platform_cookie_names() -> set[str]:
    """The platform's own cookies: never sent to a device, never set by one."""
    return {settings.SESSION_COOKIE_NAME, settings.CSRF_COOKIE_NAME, settings.KNOWN_BROWSER_COOKIE_NAME}


def _platform_cookies_removed(value: bytes) -> bytes | None:
    mine = {name.encode() for name in platform_cookie_names()}
    kept = [part.strip() for part in value.split(b";")
            if part.strip() and part.strip().split(b"=", 1)[0].strip() not in mine]
    return b"; ".join(kept) if kept else None


def forward_headers(scope: dict[str, Any], prefix: str, *, websocket: bool = False) -> list[list[str]]:
    """The browser's headers for the device: no hop-by-hop or internal headers, none of the platform's
    cookies, and X-Forwarded-For/Proto/Host/Prefix set by us (never taken from the browser)."""
    listed: set[bytes] = set()
    for key, value in scope.get("headers", []):
        if key.lower() == b"connection":
            listed |= {token.strip().lower() for token in value.split(b",")}
    dropped = HOP_BY_HOP | INTERNAL | listed | (WS_HANDSHAKE if websocket else frozenset())
    headers: list[list[str]] = []
    for key, value in scope.get("headers", []):
        key = key.lower()
        if key in dropped or key.startswith(b"x-forwarded-"):
            continue
        if key == b"cookie":
            value = _platform_cookies_removed(value)
            if value is None:
                continue
        headers.append([key.decode("latin-1"), value.decode("latin-1")])
    client = scope.get("client") or ("", 0)
    scheme = scope.get("scheme") or ("wss" if websocket else "http")
    headers += [
        ["x-forwarded-for", str(client[0])],
        ["x-forwarded-proto", {"ws": "http", "wss": "https"}.get(scheme, scheme)],
        ["x-forwarded-host", header_value(scope, b"host")],
        ["x-forwarded-prefix", prefix],
    ]
    return headers


# On the platform's own host (no AI1NET_DEVICE_WEB_HOST) a device's page shares the platform's origin:
# it gets no opener relation with platform windows, and, unless it overrides it per request, a Referer
# that tells the platform where a request comes from (ai1net.hosts.from_device_page).
SHARED_ORIGIN_HEADERS = ((b"cross-origin-opener-policy", b"same-origin"), (b"referrer-policy", b"same-origin"))


def response_headers(raw: Any) -> list[tuple[bytes, bytes]] | None:
    """The device's response headers for the browser, or None when they are malformed."""
    if not isinstance(raw, list) or len(raw) > protocol.WEB_MAX_HEADERS:
        return None
    mine = {name.lower() for name in platform_cookie_names()}
    shared_origin = not hosts.separate()
    replaced = {name for name, _ in SHARED_ORIGIN_HEADERS} if shared_origin else set()
    headers: list[tuple[bytes, bytes]] = []
    for pair in raw:
        if not isinstance(pair, list) or len(pair) != 2 or not all(isinstance(x, str) for x in pair):
            return None
        name, value = pair[0].strip().lower(), pair[1]
        if not name or any(c in value for c in "\r\n\0") or any(c in name for c in " :\r\n\0"):
            return None
        if name.encode("latin-1", "replace") in HOP_BY_HOP | replaced:
            continue
        if name == "set-cookie" and value.split("=", 1)[0].strip().lower() in mine:
            continue  # a device must not overwrite the platform's session or CSRF cookie
        try:
            headers.append((name.encode("latin-1"), value.encode("latin-1")))
        except UnicodeEncodeError:
            return None
    if shared_origin:
        headers.extend(SHARED_ORIGIN_HEADERS)
    return headers


def wants_html(scope: dict[str, Any]) -> bool:
    return "text/html" in header_value(scope, b"accept")


def error_response(exc: ApplicationError, scope: dict[str, Any]) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """(status, headers, body) for a refused or failed request: a plain page for browsers (a login
    redirect when there is no session), {"error", "detail"} JSON otherwise."""
    html_wanted = wants_html(scope)
    if exc.status == 302:  # device web has a host of its own: the same address there
        raw = scope.get("raw_path")
        target = raw.decode("latin-1") if raw else quote(scope.get("path", "/"), safe="/")
        if scope.get("query_string"):
            target += "?" + scope["query_string"].decode("latin-1")
        scheme = {"ws": "http", "wss": "https"}.get(scope.get("scheme") or "http", scope.get("scheme") or "http")
        location = hosts.device_web_url(scheme, header_value(scope, b"host"), target)
        return 302, [(b"location", location.encode("latin-1")), (b"cache-control", b"no-store")], b""
    if exc.status == 401 and html_wanted:
        path = scope.get("raw_path") or scope.get("path", "/").encode()
        query = scope.get("query_string") or b""
        target = path.decode("latin-1") + ("?" + query.decode("latin-1") if query else "")
        location = f"{resolve_url(settings.LOGIN_URL)}?next={quote(target, safe='/')}"
        return 302, [(b"location", location.encode("latin-1")), (b"cache-control", b"no-store")], b""
    if html_wanted:
        body = (
            "<!doctype html><meta charset=utf-8><meta name=viewport content='width=device-width'>"
            f"<title>{exc.status} {html.escape(exc.code)}</title>"
            f"<h1>{html.escape(_title(exc))}</h1><p>{html.escape(exc.detail)}</p>"
            f"<p><small>{exc.status} · {html.escape(exc.code)} · ai1net device web</small></p>"
        ).encode()
        content_type = b"text/html; charset=utf-8"
    else:
        body = json.dumps(exc.as_dict()).encode()
        content_type = b"application/json"
    return exc.status, [(b"content-type", content_type), (b"content-length", str(len(body)).encode()),
                        (b"cache-control", b"no-store")], body


def _title(exc: ApplicationError) -> str:
    return {
        "device_web_off": "Device web is switched off",
        "device_offline": "The device is offline",
        "port_not_exposed": "This port is not exposed",
        "device_timeout": "The device did not answer in time",
        "upstream_unreachable": "Nothing answers on that port",
    }.get(exc.code, "Device web")


RESET_STATUS = {
    protocol.WEB_RESET_PORT_NOT_EXPOSED: 502,
    protocol.WEB_RESET_UNREACHABLE: 502,
    protocol.WEB_RESET_UPSTREAM_ERROR: 502,
    protocol.WEB_RESET_BAD_REQUEST: 400,
    protocol.WEB_RESET_FLOW: 502,
    protocol.WEB_RESET_TIMEOUT: 504,
}


def reset_error(params: dict[str, Any]) -> ApplicationError:
    reason = str(params.get("reason") or "upstream_error")[:50]
    detail = str(params.get("detail") or "The device could not complete the request.")[:500]
    return ApplicationError(detail, code=reason, status=RESET_STATUS.get(reason, 502))


TUNNEL_READ_BYTES = protocol.WEB_BIN_CHUNK_BYTES + 64 * 1024  # a whole binary data frame per read, mostly


def tune_tunnel_socket(transport: Any) -> None:
    """A device tunnel's Twisted transport (ai1net.asgi): read up to TUNNEL_READ_BYTES per call instead of
    Twisted's 64 KiB (a 1 MiB data frame took 16 reads, each a trip through autobahn's frame parser and its
    unmasking, and 16 pieces to join), and send each write at once (TCP_NODELAY: a web.open or a credit
    must not wait behind the ACK of the previous frame)."""
    if transport is None:
        return
    if isinstance(getattr(transport, "bufferSize", None), int) and transport.bufferSize < TUNNEL_READ_BYTES:
        transport.bufferSize = TUNNEL_READ_BYTES
    if hasattr(transport, "setTcpNoDelay"):
        try:
            transport.setTcpNoDelay(True)
        except OSError:
            pass
