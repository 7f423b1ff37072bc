"""/d/<device>/<port>/<path> over HTTP: a raw ASGI app (channels' AsyncHttpConsumer would buffer the
whole request body before handling it).

Per request: the gates (devices.web.gates; the session's user is resolved in the same trip to the
database thread, and the common case is one query), then one stream through the device's tunnel
(in-process when the tunnel lives in this process, see devices.web.streams). The request
body goes out in chunks under the device's credit, the response comes back chunk by chunk and is
written with ``more_body=True`` as it arrives (server-sent events are not held back). A slow browser
holds back only its own stream: credit goes back to the device only once daphne's socket buffer has
drained (a Twisted push producer on the request, see ``Writable``).

Caveat: daphne reads a request body completely (spooled to a temporary file by Twisted, then queued in
memory for the app) before the app runs, so uploads are capped (DEVICE_WEB_MAX_REQUEST_BYTES);
downloads are not buffered anywhere.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import logging
from typing import Any

from channels.sessions import SessionMiddlewareStack
from django.conf import settings
from django.contrib import auth
from django.contrib.auth.models import AnonymousUser

from ai1net.exceptions import ApplicationError, PayloadTooLarge
from clients import protocol
from devices.errors import DeviceOffline, DeviceTimeout
from devices.web import streams
from devices.web.gates import check_device_web, device_web_fast, gate_threads

logger = logging.getLogger(__name__)

TWISTED_REQUEST = "ai1net.twisted_request"
SEND_BYTES = protocol.WEB_BIN_CHUNK_BYTES


class Writable:
    """A push producer registered on daphne's Twisted request: the transport pauses it when its write
    buffer is full and resumes it when the socket drained; ``wait()`` blocks while paused."""

    def __init__(self, request: Any) -> None:
        self.request = request
        self.ready = asyncio.Event()
        self.ready.set()
        self.registered = False
        if request is not None:
            try:
                request.registerProducer(self, True)
                self.registered = True
            except Exception:  # another server, or a producer already there: no backpressure signal
                logger.debug("no push producer on %r", request, exc_info=True)

    def pauseProducing(self) -> None:  # noqa: N802 - Twisted's IPushProducer
        self.ready.clear()

    def resumeProducing(self) -> None:  # noqa: N802
        self.ready.set()

    def stopProducing(self) -> None:  # noqa: N802 - the connection is going away
        self.ready.set()

    async def wait(self, timeout: float) -> None:
        if not self.ready.is_set():
            async with asyncio.timeout(timeout):  # not wait_for: see HttpStream._download
                await self.ready.wait()

    def close(self) -> None:
        if self.registered:
            self.registered = False
            try:
                self.request.unregisterProducer()
            except Exception:
                logger.debug("unregistering the producer failed", exc_info=True)

    def no_delay(self) -> None:
        """Send each write at once (TCP_NODELAY): the response head, a small body and its end are separate
        writes, and with Nagle's algorithm the second waits for the browser's delayed ACK (~40 ms)."""
        transport = getattr(getattr(self.request, "channel", None), "transport", None)
        if transport is not None and hasattr(transport, "setTcpNoDelay"):
            try:
                transport.setTcpNoDelay(True)
            except OSError:
                logger.debug("no TCP_NODELAY on %r", transport, exc_info=True)
        # Twisted hands the socket at most SEND_LIMIT (128 KiB) per write call, one call per turn of the
        # loop; a body chunk of the tunnel is up to WEB_BIN_CHUNK_BYTES.
        if isinstance(getattr(transport, "SEND_LIMIT", None), int) and transport.SEND_LIMIT < SEND_BYTES:
            transport.SEND_LIMIT = SEND_BYTES

    def abort(self) -> None:
        """Drop the browser's connection: a response that broke mid-way must not look complete."""
        transport = getattr(getattr(self.request, "channel", None), "transport", None)
        if transport is not None:
            transport.abortConnection()


def with_twisted_request(app: Any) -> Any:
    """Outermost wrapper: daphne's ``send`` is ``partial(server.handle_reply, <twisted request>)``; keep
    the request in the scope before middleware wraps ``send``."""

    async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        request = None
        if isinstance(send, functools.partial) and send.args and hasattr(send.args[0], "registerProducer"):
            request = send.args[0]
        await app(dict(scope, **{TWISTED_REQUEST: request}), receive, send)

    return wrapped


class DeviceWebHttp:
    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        kwargs = scope.get("url_route", {}).get("kwargs", {})
        device_id, port = kwargs.get("device_id"), kwargs.get("port")
        try:
            device = await gate_threads.call(_gates, scope, device_id, port)
            length = streams.header_value(scope, b"content-length")
            if length.isdigit() and int(length) > settings.DEVICE_WEB_MAX_REQUEST_BYTES:
                raise PayloadTooLarge(f"Request bodies through device web are capped at "
                                      f"{settings.DEVICE_WEB_MAX_REQUEST_BYTES} bytes.")
        except ApplicationError as exc:
            await _respond_error(send, exc, scope)
            return
        if kwargs.get("rest") is None:  # /d/<device>/<port> -> /d/<device>/<port>/ so relative links work
            location = streams.prefix_of(device_id, port) + "/"
            if scope.get("query_string"):
                location += "?" + scope["query_string"].decode("latin-1")
            await send({"type": "http.response.start", "status": 308,
                        "headers": [(b"location", location.encode("latin-1"))]})
            await send({"type": "http.response.body", "body": b""})
            return
        await HttpStream(scope, receive, send, device, int(port)).run()


class _SessionOnly:
    """What ``django.contrib.auth.get_user`` reads of a request: its session."""

    def __init__(self, session: Any) -> None:
        self.session = session


def _gates(scope: dict[str, Any], device_id: Any, port: Any) -> Any:
    """The session's user, resolved as AuthMiddleware would (``django.contrib.auth.get_user``: backend,
    session hash), and the four gates, in one trip to the database thread instead of two."""
    session = scope.get("session")
    user = scope.get("user")
    if user is None and session is not None:
        fast = device_web_fast(session, device_id, port)
        if fast is not None:
            scope["user"], device = fast
            return device
    if user is None:
        user = auth.get_user(_SessionOnly(session)) if session is not None else AnonymousUser()
        scope["user"] = user
    return check_device_web(user, device_id, port, session=session, host=streams.header_value(scope, b"host"))


async def _respond_error(send: Any, exc: ApplicationError, scope: dict[str, Any]) -> None:
    status, headers, body = streams.error_response(exc, scope)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class HttpStream:
    def __init__(self, scope: dict[str, Any], receive: Any, send: Any, device: Any, port: int) -> None:
        self.scope, self.receive, self.send = scope, receive, send
        self.device, self.port = device, port
        self.first_byte_sec = settings.DEVICE_WEB_FIRST_BYTE_SEC
        self.idle_sec = settings.DEVICE_WEB_IDLE_SEC
        self.started = False
        self.finished = False
        self.writable: Writable | None = None
        self.tunnel_closed = False  # the tunnel connection ended: it sends nothing more on our channel
        self.device_done = False  # the device said its last word (web.end / web.reset): the tunnel forgot us

    async def run(self) -> None:
        self.link = await streams.link_to(self.device)
        self.credit = streams.Credit(self.link.window)
        self.receipts = streams.Receipts(self.link.window)
        # Slow start (clients/protocol.py): the device starts with a small credit, the rest once the head is out.
        slow_start = protocol.WEB_SLOW_START_CAPABILITY in (self.device.capabilities or [])
        first_credit = protocol.web_first_credit(self.link.window) if slow_start else 0
        self.grant = self.link.window - first_credit if slow_start else 0
        prefix = streams.prefix_of(self.device.pk, self.port)
        path = streams.strip_prefix(self.scope.get("raw_path") or self.scope["path"].encode("latin-1"))
        length = streams.header_value(self.scope, b"content-length").strip()
        chunked = bool(streams.header_value(self.scope, b"transfer-encoding"))
        has_body = chunked or (length.isdigit() and int(length) > 0)
        uploader: asyncio.Task | None = None
        reset: str | None = protocol.WEB_RESET_CANCELLED
        try:
            await self.link.open(protocol.WEB_OPEN, {
                "port": self.port, "method": self.scope["method"], "path": path,
                "query": (self.scope.get("query_string") or b"").decode("latin-1"),
                "headers": streams.forward_headers(self.scope, prefix), "body": has_body,
                **({"first_credit": first_credit} if first_credit else {}),
            })
            uploader = asyncio.ensure_future(self._upload(has_body))
            downloader = asyncio.ensure_future(self._download())
            done, _ = await asyncio.wait({uploader, downloader}, return_when=asyncio.FIRST_COMPLETED)
            if downloader not in done:
                # The upload side ended first: the browser left, or the upload broke a cap.
                error = uploader.exception()
                downloader.cancel()
                await asyncio.gather(downloader, return_exceptions=True)
                if error is not None:
                    raise error
                return
            downloader.result()
            reset = None if self.finished else reset
        except ApplicationError as exc:
            if not self.started:
                await _respond_error(self.send, exc, self.scope)
            else:
                self._abort()
        except streams.LinkLost:
            if not self.started:
                await _respond_error(self.send, DeviceOffline("The device's tunnel went away."), self.scope)
            else:
                self._abort()
        finally:
            if uploader is not None:
                uploader.cancel()
                await asyncio.gather(uploader, return_exceptions=True)
            if self.writable is not None:
                self.writable.close()
            if not self.tunnel_closed and not self.device_done:
                await self.link.close(reset, drain=True)

    def _abort(self) -> None:
        if self.writable is not None:
            self.writable.abort()

    # --- browser -> device -----------------------------------------------------------------------
    async def _upload(self, has_body: bool) -> None:
        """Send the body in chunks under credit, then keep listening for the browser leaving."""
        buffer = bytearray()
        total, seq, ended = 0, 0, not has_body
        cap = settings.DEVICE_WEB_MAX_REQUEST_BYTES
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                return
            if message["type"] != "http.request" or ended:
                continue
            body = message.get("body", b"")
            total += len(body)
            if total > cap:
                raise PayloadTooLarge(f"Request bodies through device web are capped at {cap} bytes.")
            buffer += body
            more = message.get("more_body", False)
            chunk = self.link.chunk
            while len(buffer) >= chunk or (buffer and not more):
                piece = bytes(buffer[:chunk])
                del buffer[:chunk]
                try:
                    await self.credit.take(len(piece), self.idle_sec)
                except TimeoutError:
                    raise DeviceTimeout("The device stopped taking the request body.") from None
                await self.link.data(seq, piece)
                seq += 1
            if not more:
                await self.link.frame(protocol.WEB_END, {})
                ended = True

    # --- device -> browser -----------------------------------------------------------------------
    async def _download(self) -> None:
        expected = 0
        while True:
            timeout = self.idle_sec if self.started else self.first_byte_sec
            try:
                # Not asyncio.wait_for: on Python 3.11 it returns what arrives in the same turn of the loop as a
                # cancellation of this task (the browser left) and loses the cancellation; the stream then
                # lived on until its idle timeout, the device sending meanwhile.
                async with asyncio.timeout(timeout):
                    message = await self.link.receive()
            except TimeoutError:
                raise DeviceTimeout(f"The device did not answer within {timeout:g} s.") from None
            if message.get("type") == "device.stream.closed":
                self.tunnel_closed = True
                raise DeviceOffline("The device disconnected.")
            if message.get("stream") != self.link.stream or not isinstance(message.get("frame"), dict):
                continue
            method = message["frame"].get("method")
            params = message["frame"].get("params") or {}
            if method == protocol.WEB_CREDIT:
                self.credit.add(params.get("bytes"))
            elif method == protocol.WEB_RESPONSE and not self.started:
                body = _head_body(params.get("body"))
                if params.get("end") is True:  # the whole (small) body came with the head
                    await self._start(params)
                    self.device_done = True
                    await self._finish(body)
                    return
                # Slow start: the body's first bytes may come with the head (they used credit as a data frame).
                if body:
                    self._received(len(body))
                await self._start(params, body)
            elif method == protocol.WEB_DATA and self.started:
                if params.get("seq") != expected:
                    raise streams.reset_error({"reason": protocol.WEB_RESET_FLOW, "detail": "a frame was lost"})
                expected += 1
                await self._body(params)
            elif method == protocol.WEB_END and self.started:
                self.device_done = True
                await self._finish(b"")
                return
            elif method == protocol.WEB_RESET:
                self.device_done = True
                raise streams.reset_error(params)
            else:
                raise streams.reset_error({"reason": protocol.WEB_RESET_UPSTREAM_ERROR,
                                           "detail": f"unexpected {method} from the device"})

    async def _finish(self, body: bytes) -> None:
        self.writable.close()  # before the last write: Twisted finishes the request on it
        await self.send({"type": "http.response.body", "body": body, "more_body": False})
        self.finished = True

    async def _start(self, params: dict[str, Any], body: bytes = b"") -> None:
        """Write the response head, and unless the response ends with it, ``body`` (its first bytes, or none)
        at once: the head goes out now (server-sent events), then the rest of a slow-start window is granted."""
        status = params.get("status")
        headers = streams.response_headers(params.get("headers"))
        if isinstance(status, bool) or not isinstance(status, int) or not 200 <= status <= 599 or headers is None:
            raise streams.reset_error({"reason": protocol.WEB_RESET_UPSTREAM_ERROR,
                                       "detail": "the device sent a malformed response head"})
        await self.send({"type": "http.response.start", "status": status, "headers": headers})
        self.started = True
        self.writable = Writable(self.scope.get(TWISTED_REQUEST))
        self.writable.no_delay()
        if params.get("end") is True:
            return
        await self.send({"type": "http.response.body", "body": body, "more_body": True})
        grant, self.grant = self.grant, 0
        if grant:
            await self.link.frame(protocol.WEB_CREDIT, {"bytes": grant})
        if body:
            await self._handed_on(len(body))

    async def _handed_on(self, size: int) -> None:
        """``size`` bytes went to the browser: once its socket has drained, the credit they used goes back."""
        try:
            await self.writable.wait(self.idle_sec)  # the browser reads slowly: hold this stream's credit
        except TimeoutError:
            raise DeviceTimeout("The browser stopped reading.") from None
        owed = self.receipts.handed_on(size)
        if owed:
            await self.link.frame(protocol.WEB_CREDIT, {"bytes": owed})

    def _received(self, size: int) -> None:
        """The device sent ``size`` body bytes: within its credit, or the stream is reset."""
        if not self.receipts.received(size):
            raise streams.reset_error({"reason": protocol.WEB_RESET_FLOW, "detail": "more data than credit"})

    async def _body(self, params: dict[str, Any]) -> None:
        chunk = params.get("raw")  # a binary frame's bytes
        if not isinstance(chunk, bytes):
            chunk = _base64(params.get("data") or "", "data")
        self._received(len(chunk))
        await self.send({"type": "http.response.body", "body": chunk, "more_body": True})
        await self._handed_on(len(chunk))


def _head_body(body: Any) -> bytes:
    """The body bytes a web.response carries (base64; none when absent)."""
    return _base64(body, "a body") if isinstance(body, str) else b""


def _base64(value: Any, what: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError, TypeError):
        raise streams.reset_error({"reason": protocol.WEB_RESET_UPSTREAM_ERROR,
                                   "detail": f"the device sent {what} that is not base64"}) from None


def http_application() -> Any:
    """The ASGI app for ``http_urlpatterns``: the session in ``scope["session"]`` (the user is resolved with
    the gates, ``_gates``), Twisted request kept."""
    return with_twisted_request(SessionMiddlewareStack(DeviceWebHttp()))
