"""/d/<device>/<port>/<path> as a WebSocket: the browser's socket is relayed to a WebSocket client the
bridge opens on 127.0.0.1:<port>.

The same gates as HTTP run in ``connect``; the browser's handshake is answered (101, with the
subprotocol the local server chose) only once the device says its side is open (``web.ws_accept``);
a refusal rejects the handshake (403). Frames carry a per-direction seq and use the same credit window
as HTTP bodies; browser frames beyond our credit wait in a bounded buffer. Closes propagate both ways.

The stream takes the HTTP path's link (``streams.link_to``): straight to the tunnel consumer when it runs in
this process, to the stream relay of the daphne process that holds it, else through the channel layer.
Through the layer the device's frames come to this consumer's own channel (its dispatch reads it, as
Channels reads every consumer's); otherwise a task reads them from the link. Either way they and the
browser's messages are handled one at a time.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import collections
import logging
from typing import Any

from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from ai1net.consumers import LoopDispatch
from ai1net.exceptions import ApplicationError
from clients import protocol
from devices.web import streams
from devices.web.gates import check_device_web, gate_threads

logger = logging.getLogger(__name__)

OPEN_TIMEOUT_SEC = 15.0
MAX_PENDING_FRAMES = 4096  # browser frames waiting for credit, however small
# Close codes the platform chooses (an application may send only 1000 or 3000-4999):
CLOSE_TOO_BIG = 4009  # a message over protocol.WEB_WS_MAX_MESSAGE (cf. 1009)
CLOSE_TRY_AGAIN = 4013  # the browser sent more than we may buffer (cf. 1013)
CLOSE_UPSTREAM_FAILED = 4502  # the device or its local server failed (cf. 1011 / 502)


class DeviceWebSocketConsumer(LoopDispatch, AsyncWebsocketConsumer):
    link: streams.TunnelLink | None = None
    reader: asyncio.Task | None = None

    async def connect(self) -> None:
        kwargs = self.scope.get("url_route", {}).get("kwargs", {})
        self.accepted = False
        self.closed = False
        self.pending: collections.deque[tuple[str | bytes, int]] = collections.deque()
        self.pending_bytes = 0  # what the browser sent that waits for credit (memory, not cost)
        self.send_seq = self.recv_seq = 0
        self.credit = streams.Credit()
        self.receipts = streams.Receipts()
        self.open_timer: asyncio.Task | None = None
        self.turn = asyncio.Lock()  # the browser's messages and the device's, one at a time
        try:
            device = await gate_threads.call(
                check_device_web, self.scope.get("user"), kwargs.get("device_id"), kwargs.get("port"),
                session=self.scope.get("session"), host=streams.header_value(self.scope, b"host"))
        except ApplicationError as exc:
            logger.info("device web socket refused: %s", exc.code)
            await self.close()  # before accept: the handshake is rejected (403)
            return
        port = int(kwargs["port"])
        prefix = streams.prefix_of(device.pk, port)
        path = streams.strip_prefix(self.scope.get("raw_path") or self.scope["path"].encode("latin-1"))
        self.link = await streams.link_to(device, reply_channel=self.channel_name)
        self.credit = streams.Credit(self.link.window)
        self.receipts = streams.Receipts(self.link.window)
        try:
            await self.link.open(protocol.WEB_WS_OPEN, {
                "port": port, "path": path, "query": (self.scope.get("query_string") or b"").decode("latin-1"),
                "headers": streams.forward_headers(self.scope, prefix, websocket=True),
                "subprotocols": list(self.scope.get("subprotocols") or [])[:20],
            })
        except streams.LinkLost:
            await self._end(None)
            return
        if not self.link.via_layer:
            self.reader = asyncio.create_task(self._read_device())
        self.open_timer = asyncio.create_task(self._open_deadline())

    async def _open_deadline(self) -> None:
        await asyncio.sleep(OPEN_TIMEOUT_SEC)
        async with self.turn:
            if not self.accepted:
                await self._end(protocol.WEB_RESET_TIMEOUT)

    async def _end(self, reset: str | None, code: int = CLOSE_UPSTREAM_FAILED) -> None:
        if self.closed:
            return
        self.closed = True
        await self._stop_tasks()
        await self.close(code=code if self.accepted else None)
        if self.link is not None:
            await self.link.close(reset)

    async def _stop_tasks(self) -> None:
        """The open timer and the link's reader, unless one of them is ending the socket itself (the
        reader waits on its link's queue, never on the channel layer: cancelling it loses nothing)."""
        for task in (self.open_timer, self.reader):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
                await asyncio.wait({task})

    # --- browser -> device -----------------------------------------------------------------------
    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        async with self.turn:
            await self._from_browser(text_data, bytes_data)

    async def _from_browser(self, text_data: str | None, bytes_data: bytes | None) -> None:
        if self.closed or not self.accepted:
            return
        body: str | bytes = text_data if text_data is not None else (bytes_data or b"")
        size = len(body.encode("utf-8")) if isinstance(body, str) else len(body)
        if size > protocol.WEB_WS_MAX_MESSAGE:
            await self._end(protocol.WEB_RESET_CANCELLED, CLOSE_TOO_BIG)
            return
        self.pending.append((body, size))
        self.pending_bytes += size
        if self.pending_bytes > settings.DEVICE_WEB_WS_BUFFER_BYTES or len(self.pending) > MAX_PENDING_FRAMES:
            await self._end(protocol.WEB_RESET_CANCELLED, CLOSE_TRY_AGAIN)
            return
        await self._flush()

    async def _flush(self) -> None:
        """Send buffered browser frames while credit lasts (never waits: messages are handled one at a
        time, and the credit that would free us arrives as one)."""
        while self.pending and not self.closed:
            body, size = self.pending[0]
            cost = self.credit.cost(size)
            if self.credit.available < cost:
                return
            self.credit.available -= cost
            self.pending.popleft()
            self.pending_bytes -= size
            try:
                if isinstance(body, str):
                    await self.link.frame(protocol.WEB_WS_FRAME, {"text": body, "seq": self.send_seq})
                else:
                    await self.link.data(self.send_seq, body, protocol.WEB_BIN_WS)
            except streams.LinkLost:
                await self._end(None)
                return
            self.send_seq += 1

    async def disconnect(self, code: int) -> None:
        async with self.turn:
            if self.closed:
                return
            self.closed = True
        await self._stop_tasks()
        if self.link is not None:
            try:
                await self.link.frame(protocol.WEB_WS_CLOSE, {"code": code if isinstance(code, int) else 1000,
                                                              "reason": ""})
            except streams.LinkLost:
                pass
            await self.link.close()

    # --- device -> browser ---------------------------------------------------------------------------
    async def _read_device(self) -> None:
        """The device's messages on this stream from the link's queue (in process, or a stream relay)."""
        while not self.closed:
            message = await self.link.receive()
            if message.get("type") == "device.stream.closed":
                await self.device_stream_closed(message)
            else:
                await self.device_stream(message)

    async def device_stream(self, message: dict[str, Any]) -> None:
        """A frame of the device's on this stream (from the reader, or the layer through dispatch)."""
        async with self.turn:
            if not self.closed and self.link is not None and message.get("stream") == self.link.stream:
                await self._from_device(message)

    async def device_stream_closed(self, message: dict[str, Any]) -> None:
        async with self.turn:
            if self.link is not None and message.get("stream") == self.link.stream:
                self.link.opened = False  # the tunnel is gone: nothing to forget there
                await self._end(None)

    async def _from_device(self, message: dict[str, Any]) -> None:
        frame = message.get("frame") or {}
        method, params = frame.get("method"), frame.get("params") or {}
        if method == protocol.WEB_WS_ACCEPT and not self.accepted:
            subprotocol = params.get("subprotocol")
            offered = self.scope.get("subprotocols") or []
            await self.accept(subprotocol if isinstance(subprotocol, str) and subprotocol in offered else None)
            self.accepted = True
            if self.open_timer is not None:
                self.open_timer.cancel()
        elif method == protocol.WEB_CREDIT:
            if self.credit.add(params.get("bytes")):
                await self._flush()
        elif method == protocol.WEB_WS_FRAME and self.accepted:
            await self._frame_from_device(params)
        elif method == protocol.WEB_WS_CLOSE:
            await self._end(None, _browser_close_code(params.get("code")))
        elif method == protocol.WEB_RESET:
            logger.info("device web socket reset by the device: %s", params.get("reason"))
            await self._end(None)
        else:
            await self._end(protocol.WEB_RESET_UPSTREAM_ERROR)

    async def _frame_from_device(self, params: dict[str, Any]) -> None:
        if params.get("seq") != self.recv_seq:
            await self._end(protocol.WEB_RESET_FLOW)
            return
        self.recv_seq += 1
        if isinstance(params.get("text"), str):
            text = params["text"]
            size = len(text.encode("utf-8"))
            await self.send(text_data=text)
        else:
            data = params.get("raw")  # a binary frame's bytes
            if not isinstance(data, bytes):
                try:
                    data = base64.b64decode(params.get("data") or "", validate=True)
                except (binascii.Error, ValueError, TypeError):
                    await self._end(protocol.WEB_RESET_UPSTREAM_ERROR)
                    return
            size = len(data)
            await self.send(bytes_data=data)
        if not self.receipts.received(size):
            await self._end(protocol.WEB_RESET_FLOW)
            return
        owed = self.receipts.handed_on(size)
        if owed:
            try:
                await self.link.frame(protocol.WEB_CREDIT, {"bytes": owed})
            except streams.LinkLost:
                await self._end(None)


def _browser_close_code(code: object) -> int:
    """The local server's close code as the browser may receive it from us."""
    if isinstance(code, int) and not isinstance(code, bool) and (code == 1000 or 3000 <= code <= 4999):
        return code
    return CLOSE_UPSTREAM_FAILED if code in (1006, 1011) else 1000
