"""The device side of the tunnel: one outbound WebSocket, JSON-RPC 2.0 frames (see clients/protocol.py).

``Tunnel.run()`` keeps the connection up: it reconnects with exponential backoff and full jitter,
says ``hello`` with the last seq the device applied, hands each new ``deliver`` to ``on_deliver``
exactly once (the callback records the seq durably; items at or below it are only re-acked), answers
platform requests through ``on_request``, sends heartbeats and drops a platform that went silent.
Close codes 4401/4403 are final: ``run()`` raises ``FinalCloseError``.

With ``longpoll=True`` (the bridge), a WebSocket that cannot be opened (the upgrade is refused, or
``LONGPOLL_AFTER`` connects in a row fail) makes the tunnel fall back by itself to HTTP long polling
(``clients.common.longpoll``): the same outbox, seqs and acks, and ``call()`` goes over HTTP with the
same ids. Meanwhile it tries the WebSocket every ``ws_retry_sec`` and switches back when it opens.
Platform -> device requests (``on_request``) need the WebSocket.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import threading
import uuid
from typing import Any, Awaitable, Callable, Dict, Optional, Set, Tuple

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from clients import limits, masking, protocol
from clients.common import loopback
from clients.common.longpoll import LongPollClient

log = logging.getLogger("ai1net.tunnel")

masking.install()  # a .pyz has no C masking: every frame a client sends is masked (clients/masking.py)

BACKOFF_BASE = 0.5
BACKOFF_CAP = 60.0
RECONNECT_SPREAD_SEC = 5.0  # the jitter window of a reconnect: the fleet's declared spread
FLAT_ATTEMPTS = 6  # tries within the spread (about 15 s of a platform restart) before the window doubles
CLOSE_ABNORMAL = 1006  # websockets' code for a connection lost without a close frame
ACK_EVERY = 100  # while items keep arriving, ack at least this often (one ack covers all before it)
LONGPOLL_AFTER = 3  # failed WebSocket connects in a row before falling back to long polling
WS_RETRY_SEC = 60.0  # in long-poll mode, try the WebSocket again this often

DeliverHandler = Callable[[int, str, Dict[str, Any]], Awaitable[None]]
RequestHandler = Callable[[str, Dict[str, Any]], Awaitable[Optional[Dict[str, Any]]]]
NotificationHandler = Callable[[str, Dict[str, Any]], None]  # sync: must not block the reader


class FinalCloseError(Exception):
    """The platform refused this device for good (4401 unknown token, 4403 revoked): do not retry."""

    def __init__(self, code: int, reason: str = "") -> None:
        self.code = code
        self.reason = reason or protocol.CLOSE_REASONS.get(code, "")
        super().__init__(f"{self.reason} (close code {code})")


class RemoteError(Exception):
    """The platform answered a ``Tunnel.call`` with a JSON-RPC error."""

    def __init__(self, code: int, message: str, data: Optional[Dict[str, Any]] = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data or {}

    @property
    def app_code(self) -> Optional[str]:
        """The application error code (e.g. ``mobile_reply_off``) of a -32000 error."""
        value = self.data.get("code")
        return value if isinstance(value, str) else None


class RequestError(Exception):
    """Raise from ``on_request`` to answer the platform with this JSON-RPC error."""

    def __init__(self, message: str, *, code: int = protocol.APPLICATION_ERROR, data: Optional[Dict[str, Any]] = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


class MethodNotFound(RequestError):
    def __init__(self, method: str) -> None:
        super().__init__(f"unknown method {method!r}", code=protocol.METHOD_NOT_FOUND)


def backoff_delay(attempt: int, *, base: float = BACKOFF_BASE, cap: float = BACKOFF_CAP,
                  spread: float = RECONNECT_SPREAD_SEC, rng=random.random) -> float:
    """Full jitter: uniform in [0, window), the window never over ``cap``. It is ``spread`` for the first
    ``FLAT_ATTEMPTS`` tries, then doubles: a fleet that lost the platform together (a restart) comes back
    spread over ``spread`` seconds (about 2 N / spread tries a second for N devices, README "Reconnects")
    with none waiting long, and a longer outage is tried less and less often. With no spread (tests),
    the window is ``base * 2**attempt``."""
    attempt = min(attempt, 32)
    window = spread * 2 ** max(0, attempt - FLAT_ATTEMPTS) if spread > 0 else base * 2**attempt
    return rng() * min(cap, window)


def tunnel_url(url: str) -> str:
    """The platform's base URL (http/https) -> the tunnel's WebSocket URL (ws/wss)."""
    url = url.strip().rstrip("/")
    if url.startswith("https://"):
        url = "wss://" + url[len("https://") :]
    elif url.startswith("http://"):
        url = "ws://" + url[len("http://") :]
    elif not url.startswith(("ws://", "wss://")):
        raise ValueError(f"the platform URL must start with http:// or https://, got {url!r}")
    if url.endswith(protocol.TUNNEL_PATH):
        return url
    return url + protocol.TUNNEL_PATH


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ[name])
    except (KeyError, ValueError):
        return default


class Tunnel:
    def __init__(
        self,
        url: str,
        token: str,
        *,
        hello: Dict[str, Any],
        applied_seq: Callable[[], int],
        on_deliver: DeliverHandler,
        on_request: Optional[RequestHandler] = None,
        on_notification: Optional[NotificationHandler] = None,
        heartbeat_sec: Optional[float] = None,
        backoff_base: Optional[float] = None,
        backoff_cap: Optional[float] = None,
        reconnect_spread: Optional[float] = None,
        open_timeout: float = 15.0,
        user_agent: str = "ai1net-client",
        longpoll: bool = False,
        ws_retry_sec: Optional[float] = None,
    ) -> None:
        self.ws_url = tunnel_url(url)
        self._token = token
        self.hello = dict(hello)
        self.applied_seq = applied_seq
        self.on_deliver = on_deliver
        self.on_request = on_request
        self.on_notification = on_notification  # other platform notifications (device web streams)
        # Binary frames from the platform (device web data, clients/protocol.py); sync, must not block.
        self.on_binary: Optional[Callable[[bytes], None]] = None
        self.heartbeat_sec = heartbeat_sec  # overrides the platform's heartbeatSec when set
        if backoff_base is None:
            backoff_base = _env_float("AI1NET_BACKOFF_BASE", BACKOFF_BASE)
        if backoff_cap is None:
            backoff_cap = _env_float("AI1NET_BACKOFF_CAP", BACKOFF_CAP)
        self.backoff_base, self.backoff_cap = backoff_base, backoff_cap
        if reconnect_spread is None:
            reconnect_spread = _env_float("AI1NET_RECONNECT_SPREAD_SEC", RECONNECT_SPREAD_SEC)
        self.reconnect_spread = reconnect_spread
        self.open_timeout = open_timeout
        self.user_agent = user_agent
        # Construct inside the running loop (asyncio primitives bind to it on Python 3.9).
        self.connected = asyncio.Event()
        self._stopping = asyncio.Event()
        self._ws: Any = None
        self._waiters: Dict[str, asyncio.Future] = {}
        self._pending_calls: Dict[str, Tuple[str, Dict[str, Any]]] = {}
        self._request_tasks: Set[asyncio.Future] = set()
        self._last_rx = 0.0
        self.hello_reply: Dict[str, Any] = {}
        self.device_id: Optional[str] = None
        self.connections = 0  # sessions that completed hello, for status and tests
        self.sessions = 0  # connections that sent hello; what the platform sends is tied to one of them
        self._session_ws: Any = None
        # HTTP long-poll fallback
        self.mode = "websocket"  # or "longpoll" while falling back
        self._longpoll = LongPollClient(url, token, user_agent=user_agent) if longpoll else None
        if ws_retry_sec is None:
            ws_retry_sec = _env_float("AI1NET_WS_RETRY_SEC", WS_RETRY_SEC)
        self.ws_retry_sec = ws_retry_sec
        self._pushes: Set[asyncio.Future] = set()

    # --- public ----------------------------------------------------------------------------
    def stop(self) -> None:
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    async def run(self) -> None:
        attempt = 0
        ws_failures = 0
        try:
            while not self._stopping.is_set():
                established, close_code, refused = False, None, False
                try:
                    established, close_code = await self._connect_once()
                except FinalCloseError:
                    raise
                except (OSError, asyncio.TimeoutError, ConnectionClosed, InvalidStatus, RemoteError) as exc:
                    log.warning("tunnel to %s: %s", self.ws_url, _describe(exc))
                    refused = isinstance(exc, InvalidStatus)
                except Exception:
                    log.exception("tunnel to %s failed", self.ws_url)
                if self._stopping.is_set():
                    break
                # A close frame from the platform (1011 while its Redis restarts, 1012 ...) proves the
                # WebSocket gets through: only failures to open one count towards long polling.
                platform_closed = close_code is not None and close_code != CLOSE_ABNORMAL
                ws_failures = 0 if established or platform_closed else ws_failures + 1
                if self._longpoll is not None and (refused or ws_failures >= LONGPOLL_AFTER):
                    if await self._longpoll_mode():
                        attempt = ws_failures = 0
                        continue  # the WebSocket opens again: go back to it at once
                # A replaced connection (4409) means another copy of this device is online:
                # keep backing off instead of taking the tunnel back at once, forever.
                if established and close_code != protocol.CLOSE_REPLACED:
                    attempt = 0
                delay = self._backoff(attempt)
                attempt += 1
                log.info("reconnecting in %.2fs", delay)
                try:
                    await asyncio.wait_for(self._stopping.wait(), delay)
                except asyncio.TimeoutError:
                    pass
        except FinalCloseError as exc:
            self._fail_calls(exc)
            raise
        finally:
            self.connected.clear()
        self._fail_calls(ConnectionError("the tunnel was stopped"))

    async def call(self, method: str, params: Optional[Dict[str, Any]] = None, timeout: float = 30.0) -> Any:
        """Device -> platform request. Waits across reconnects and resends with the same id, so the
        platform answers a retry from its stored first result. Raises RemoteError, asyncio.TimeoutError."""
        request_id = str(uuid.uuid4())
        frame = limits.LIMITS["frame"].max  # declared in clients.limits (= protocol.MAX_FRAME_BYTES)
        if len(protocol.request(method, params or {}, request_id).encode("utf-8")) > frame:
            raise ValueError(f"{method}: the request is larger than {frame} bytes")
        future = asyncio.get_running_loop().create_future()
        self._waiters[request_id] = future
        self._pending_calls[request_id] = (method, dict(params or {}))
        try:
            if self.mode == "longpoll" and self.connected.is_set():
                self._start_push(request_id)
            elif self._ws is not None and self.connected.is_set():
                await self._send(self._ws, protocol.request(method, params or {}, request_id))
            return await asyncio.wait_for(future, timeout)
        finally:
            self._waiters.pop(request_id, None)
            self._pending_calls.pop(request_id, None)

    async def notify(self, method: str, params: Dict[str, Any], *, generation: Optional[int] = None) -> bool:
        """Send a notification now; False when there is no live connection (or it is no longer the
        ``generation``-th one, see ``sessions``: a stream's frames must not leak into the next connection)."""
        ws = self._session_ws
        if ws is None or (generation is not None and generation != self.sessions):
            return False
        try:
            await ws.send(protocol.notification(method, params))
        except ConnectionClosed:
            return False
        return True

    async def send_binary(self, frame: bytes, *, generation: Optional[int] = None) -> bool:
        """Send one binary frame now (device web data); False as for ``notify``."""
        ws = self._session_ws
        if ws is None or (generation is not None and generation != self.sessions):
            return False
        try:
            await ws.send(frame)
        except ConnectionClosed:
            return False
        return True

    def _backoff(self, attempt: int) -> float:
        return backoff_delay(attempt, base=self.backoff_base, cap=self.backoff_cap, spread=self.reconnect_spread)

    # --- one connection --------------------------------------------------------------------
    async def _connect_once(self) -> Tuple[bool, Optional[int]]:
        headers = {"Authorization": f"Bearer {self._token}", "User-Agent": self.user_agent}
        try:
            ws = await connect(
                self.ws_url,
                additional_headers=headers,
                max_size=protocol.MAX_FRAME_BYTES,
                ping_interval=None,  # the protocol's own heartbeats keep the line and prove the consumer alive
                open_timeout=self.open_timeout,
                close_timeout=5,
            )
        except InvalidStatus as exc:
            if exc.response.status_code == 401:
                raise FinalCloseError(protocol.CLOSE_UNAUTHORIZED) from exc
            raise
        loopback.unpaced(ws.transport.get_extra_info("socket"))  # a platform on this machine: no pacing
        before = self.connections
        try:
            await self._session(ws)
        except ConnectionClosed:
            pass  # the close code below says what happened
        finally:
            self._ws = None
            self.connected.clear()
            await ws.close()
        established = self.connections > before
        code = ws.close_code
        if code in protocol.FINAL_CLOSE_CODES:
            raise FinalCloseError(code, protocol.CLOSE_REASONS.get(code) or (ws.close_reason or ""))
        if code is not None and code != protocol.CLOSE_NORMAL:
            log.info("tunnel closed: %s %s", code, ws.close_reason or protocol.CLOSE_REASONS.get(code, ""))
        return established, code

    async def _session(self, ws: Any) -> None:
        loop = asyncio.get_running_loop()
        self._last_rx = loop.time()
        deliveries: asyncio.Queue = asyncio.Queue()
        hello_id = str(uuid.uuid4())
        hello_future = loop.create_future()
        self._waiters[hello_id] = hello_future
        self.sessions += 1
        self._session_ws = ws  # frames the platform sends after hello may arrive before hello's reply is read
        reader = asyncio.ensure_future(self._reader(ws, deliveries))
        tasks = [reader]
        try:
            params = dict(self.hello)
            params.setdefault("protocolVersion", protocol.PROTOCOL_VERSION)
            params["ackedSeq"] = int(self.applied_seq())
            await ws.send(protocol.request(protocol.HELLO, params, hello_id))
            done, _ = await asyncio.wait(
                {hello_future, reader}, timeout=self.open_timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if hello_future not in done:
                if reader in done:
                    return  # closed before the hello reply; the caller reads the close code
                raise asyncio.TimeoutError("no reply to hello")
            reply = hello_future.result()
            if not isinstance(reply, dict):
                raise RemoteError(protocol.INVALID_REQUEST, "hello reply is not an object")
            self.hello_reply = reply
            self.device_id = reply.get("deviceId")
            heartbeat = float(self.heartbeat_sec or reply.get("heartbeatSec") or protocol.DEFAULT_HEARTBEAT_SEC)
            tasks.append(asyncio.ensure_future(self._deliverer(ws, deliveries)))
            tasks.append(asyncio.ensure_future(self._heartbeat(ws, heartbeat)))
            stopper = asyncio.ensure_future(self._stopping.wait())
            tasks.append(stopper)
            self._ws = ws
            self.connections += 1
            self.connected.set()
            log.info("tunnel up: device %s, heartbeat %ss, resend from %s", self.device_id, heartbeat,
                     reply.get("resendFrom"))
            for request_id, (method, call_params) in list(self._pending_calls.items()):
                await self._send(ws, protocol.request(method, call_params, request_id))
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is stopper or task.cancelled():
                    continue
                error = task.exception()
                if error is not None and not isinstance(error, ConnectionClosed):
                    raise error
            if stopper in done:
                await ws.close(protocol.CLOSE_NORMAL, "device stopping")
        finally:
            self._session_ws = None
            self._waiters.pop(hello_id, None)
            for task in tasks + list(self._request_tasks):
                task.cancel()
            await asyncio.gather(*tasks, *self._request_tasks, return_exceptions=True)
            self._request_tasks.clear()

    async def _reader(self, ws: Any, deliveries: asyncio.Queue) -> None:
        loop = asyncio.get_running_loop()
        try:
            async for text in ws:
                self._last_rx = loop.time()
                if isinstance(text, bytes) and self.on_binary is not None:
                    try:
                        self.on_binary(text)
                    except Exception:
                        log.exception("handling a binary frame failed")
                    continue
                try:
                    message = protocol.parse(text)
                except protocol.ProtocolError as exc:
                    log.warning("bad frame from the platform: %s", exc.message)
                    continue
                if protocol.is_response(message):
                    self._resolve(message)
                elif protocol.is_notification(message):
                    self._notification(message, deliveries)
                else:
                    task = asyncio.ensure_future(self._answer(ws, message))
                    self._request_tasks.add(task)
                    task.add_done_callback(self._request_tasks.discard)
        except ConnectionClosed:
            pass

    def _resolve(self, message: Dict[str, Any]) -> None:
        future = self._waiters.get(str(message["id"]))
        if future is None or future.done():
            return  # an answer to a retry we already have, or to a call that timed out
        if "error" in message:
            err = message["error"]
            future.set_exception(RemoteError(err["code"], err["message"], err.get("data")))
        else:
            future.set_result(message.get("result"))

    def _notification(self, message: Dict[str, Any], deliveries: asyncio.Queue) -> None:
        method, params = message["method"], message["params"]
        if method == protocol.DELIVER:
            seq, kind, payload = params.get("seq"), params.get("kind"), params.get("payload", {})
            if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1 or not isinstance(kind, str):
                log.warning("ignoring a malformed deliver: %r", params)
                return
            deliveries.put_nowait((seq, kind, payload if isinstance(payload, dict) else {"value": payload}))
        elif method != protocol.HEARTBEAT:
            if self.on_notification is None:
                log.debug("ignoring notification %s", method)
                return
            try:
                self.on_notification(method, params)
            except Exception:
                log.exception("handling notification %s failed", method)

    async def _deliverer(self, ws: Any, deliveries: asyncio.Queue) -> None:
        unacked: Optional[int] = None
        since_ack = 0
        while True:
            if unacked is not None and (deliveries.empty() or since_ack >= ACK_EVERY):
                await ws.send(protocol.notification(protocol.ACK, {"seq": unacked}))
                unacked, since_ack = None, 0
            seq, kind, payload = await deliveries.get()
            applied = int(self.applied_seq())
            if seq > applied:
                if seq != applied + 1:
                    log.warning("deliver seq %s after applied %s: a gap in the outbox", seq, applied)
                await self.on_deliver(seq, kind, payload)  # records seq durably; raising ends this connection
            unacked = seq if unacked is None else max(unacked, seq)
            since_ack += 1

    async def _heartbeat(self, ws: Any, interval: float) -> None:
        loop = asyncio.get_running_loop()
        silent_limit = interval * protocol.HEARTBEAT_MISSES
        tick = max(0.05, min(1.0, interval / 4))
        next_beat = loop.time() + interval
        while True:
            await asyncio.sleep(tick)
            now = loop.time()
            if now - self._last_rx > silent_limit:
                log.warning("the platform was silent for %.0fs; reconnecting", now - self._last_rx)
                await ws.close(protocol.CLOSE_HEARTBEAT_TIMEOUT, "no heartbeat")
                return
            if now >= next_beat:
                await ws.send(protocol.notification(protocol.HEARTBEAT))
                next_beat = now + interval

    async def _answer(self, ws: Any, message: Dict[str, Any]) -> None:
        request_id, method = message["id"], message["method"]
        try:
            if self.on_request is None:
                raise MethodNotFound(method)
            value = await self.on_request(method, message["params"])
            frame = protocol.result(request_id, {} if value is None else value)
            if len(frame.encode("utf-8")) > protocol.MAX_FRAME_BYTES:
                frame = protocol.error(request_id, protocol.APPLICATION_ERROR, "result larger than the frame cap",
                                       {"code": "too_large"})
        except RequestError as exc:
            frame = protocol.error(request_id, exc.code, exc.message, exc.data)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("handling %s failed", method)
            frame = protocol.error(request_id, protocol.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")
        await self._send(ws, frame)

    async def _send(self, ws: Any, frame: str) -> None:
        try:
            await ws.send(frame)
        except ConnectionClosed:
            pass  # the reader notices; pending calls are resent after the reconnect

    # --- HTTP long-poll fallback -------------------------------------------------------------
    async def _longpoll_mode(self) -> bool:
        """Serve over long polls until the WebSocket opens again (True) or the platform cannot be
        reached over HTTP either (False: back to the WebSocket's backoff). Raises FinalCloseError."""
        assert self._longpoll is not None
        prober = asyncio.ensure_future(self._probe_websocket())
        stopper = asyncio.ensure_future(self._stopping.wait())
        failures = 0
        log.warning("the WebSocket to %s cannot be opened; falling back to HTTP long polling", self.ws_url)
        try:
            while not self._stopping.is_set():
                puller = _in_thread(self._longpoll.pull, int(self.applied_seq()))
                done, _ = await asyncio.wait({puller, prober, stopper}, return_when=asyncio.FIRST_COMPLETED)
                if stopper in done:
                    return False
                if prober in done and prober.result():
                    log.info("the WebSocket opens again; leaving long polling")
                    return True  # an abandoned pull just ends on the platform; its items come again
                try:
                    status, body = await puller
                except (OSError, ValueError) as exc:
                    failures += 1
                    log.warning("long poll to %s: %s", self._longpoll.base, exc)
                    if failures >= LONGPOLL_AFTER:
                        return False
                    await self._pause(self._backoff(failures))
                    continue
                if status == 401:
                    raise FinalCloseError(protocol.CLOSE_UNAUTHORIZED)
                if status == 403:
                    raise FinalCloseError(protocol.CLOSE_REVOKED, str(body.get("detail") or ""))
                if status == 409:
                    # Another copy of this device polls: back off as a replaced WebSocket would.
                    failures += 1
                    await self._pause(self._backoff(failures))
                    continue
                if status != 200:
                    failures += 1
                    log.warning("long poll refused: HTTP %s %s", status, body.get("detail", ""))
                    if failures >= LONGPOLL_AFTER:
                        return False
                    await self._pause(self._backoff(failures))
                    continue
                failures = 0
                if not self.connected.is_set() or self.mode != "longpoll":
                    self.mode = "longpoll"
                    self.device_id = body.get("deviceId") or self.device_id
                    self.hello_reply = {"deviceId": self.device_id, "heartbeatSec": body.get("heartbeatSec"),
                                        "transport": "longpoll"}
                    self.connections += 1
                    self.connected.set()
                    log.info("long polling: device %s", self.device_id)
                    for request_id in list(self._pending_calls):
                        self._start_push(request_id)
                for item in body.get("items") or []:
                    seq, kind, payload = item.get("seq"), item.get("kind"), item.get("payload", {})
                    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1 or not isinstance(kind, str):
                        log.warning("ignoring a malformed item: %r", item)
                        continue
                    if seq > int(self.applied_seq()):
                        await self.on_deliver(seq, kind, payload if isinstance(payload, dict) else {"value": payload})
            return False
        finally:
            self.mode = "websocket"
            self.connected.clear()
            for task in (prober, stopper):
                task.cancel()
            await asyncio.gather(prober, stopper, return_exceptions=True)

    async def _pause(self, delay: float) -> None:
        try:
            await asyncio.wait_for(self._stopping.wait(), delay)
        except asyncio.TimeoutError:
            pass

    async def _probe_websocket(self) -> bool:
        """Try the WebSocket now and then; True once an upgrade succeeds (the socket is closed again)."""
        while True:
            await asyncio.sleep(self.ws_retry_sec)
            try:
                ws = await connect(self.ws_url, additional_headers={"Authorization": f"Bearer {self._token}",
                                                                    "User-Agent": self.user_agent},
                                   ping_interval=None, open_timeout=self.open_timeout, close_timeout=2)
            except Exception as exc:  # noqa: BLE001 - still blocked; any failure means the same
                log.debug("the WebSocket is still closed: %s", _describe(exc))
                continue
            await ws.close()
            return True

    def _start_push(self, request_id: str) -> None:
        task = asyncio.ensure_future(self._push(request_id))
        self._pushes.add(task)
        task.add_done_callback(self._pushes.discard)

    async def _push(self, request_id: str) -> None:
        """One device -> platform request over HTTP, retried with the same id while it is pending."""
        assert self._longpoll is not None
        attempt = 0
        while request_id in self._pending_calls and self.mode == "longpoll":
            method, params = self._pending_calls[request_id]
            try:
                status, body = await _in_thread(self._longpoll.push, request_id, method, params)
            except (OSError, ValueError) as exc:
                log.warning("push %s: %s", method, exc)
                status, body = 0, {}
            if status == 200 and ("result" in body or "error" in body):
                err = body.get("error")
                if isinstance(err, dict) and not isinstance(err.get("code"), int):
                    err = {"code": protocol.INTERNAL_ERROR, "message": str(err)}
                self._resolve({"id": request_id, "error": err} if err else {"id": request_id,
                                                                            "result": body.get("result")})
                return
            if status in (400, 413):  # refused as sent (too large, malformed): a retry cannot help
                self._resolve({"id": request_id, "error": {
                    "code": protocol.INVALID_PARAMS, "message": str(body.get("detail") or f"HTTP {status}"),
                    "data": {"code": str(body.get("error") or "invalid_request")}}})
                return
            attempt += 1
            await self._pause(self._backoff(attempt))

    def _fail_calls(self, exc: BaseException) -> None:
        for request_id in list(self._pending_calls):
            future = self._waiters.get(request_id)
            if future is not None and not future.done():
                future.set_exception(exc)


def _in_thread(fn: Callable[..., Any], *args: Any) -> asyncio.Future:
    """Run a blocking call in a daemon thread: a pull held by the platform must not keep a stopping
    process alive (the default executor's threads are joined at exit)."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(value: Any, error: Optional[BaseException]) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)

    def work() -> None:
        try:
            value, error = fn(*args), None
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting side
            value, error = None, exc
        try:
            loop.call_soon_threadsafe(settle, value, error)
        except RuntimeError:
            pass  # the loop is closed: nobody waits any more

    threading.Thread(target=work, name="ai1net-longpoll", daemon=True).start()
    return future


def _describe(exc: BaseException) -> str:
    if isinstance(exc, InvalidStatus):
        return f"the platform refused the connection (HTTP {exc.response.status_code})"
    text = str(exc) or type(exc).__name__
    return text
