"""HTTP long-poll fallback of the device tunnel, for networks that block WebSockets (bridges only).

``POST /api/devices/bridge/pull {"ackedSeq"}`` acks every item up to ackedSeq, then is held up to
``DEVICE_LONGPOLL_HOLD_SEC`` and answered as soon as unacked outbox items after ackedSeq exist:
``{"deviceId", "items": [{seq, kind, payload}...], "heartbeatSec", "holdSec"}`` -- the same durable
outbox and seq/ack semantics as ``deliver``/``ack`` on the tunnel. One pull per device at a time:
a newer pull replaces the held one, which returns 409 ``replaced``.

``POST /api/devices/bridge/push {"id", "method", "params"}`` runs a device -> platform request
through ``devices.rpc.dispatch`` (idempotent by id, as on the tunnel) and answers
``{"id", "result"}`` or ``{"id", "error": {code, message, data?}}`` with 200.

Both take ``Authorization: Bearer <device token>``: unknown -> 401 ``unauthorized`` (counted per address:
429 ``rate_limited`` with ``Retry-After`` once too many), revoked -> 403
``revoked`` (both final for the client). A device in long-poll mode is online while its polls keep
coming; platform -> device requests with a reply (``device_call``, device web) need the WebSocket.
The pull re-reads the outbox every ``DEVICE_LONGPOLL_TICK_SEC`` (the doorbell is not used here).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from ai1net.exceptions import ApplicationError, RateLimited, retry_after_header
from clients import limits, protocol
from devices import rpc, selectors, services, signals
from devices.models import LONGPOLL_PREFIX, Device

logger = logging.getLogger(__name__)

MAX_ITEMS = 256  # items per pull answer; the next pull gets the rest at once


def _error(status: int, code: str, detail: str) -> JsonResponse:
    return JsonResponse({"error": code, "detail": detail}, status=status)


def _bearer(request: HttpRequest) -> str:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _body(request: HttpRequest) -> dict[str, Any] | JsonResponse:
    # Read the stream, not request.body: a device request may use the whole frame, above Django's
    # DATA_UPLOAD_MAX_MEMORY_SIZE; the frame limit (clients.limits) is the cap here.
    frame = limits.LIMITS["frame"]
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    raw = b"" if declared > frame.max else request.read(frame.max + 1)
    if declared > frame.max or len(raw) > frame.max:
        return _error(413, "too_large", f"body is too large: at most {frame.max} {frame.unit} ({frame.what}).")
    try:
        body = protocol.loads(raw or b"{}")  # NaN, Infinity: not JSON (as on the tunnel)
    except RecursionError:  # deeper than the parser goes
        return _error(400, "parse_error", "the body is nested too deeply")
    except ValueError:
        return _error(400, "parse_error", "the body is not JSON")
    if not isinstance(body, dict):
        return _error(400, "invalid_request", "the body must be a JSON object")
    return body


async def _device(request: HttpRequest) -> Device | JsonResponse:
    try:
        device = await database_sync_to_async(services.device_authenticate)(
            raw_token=_bearer(request), ip=request.META.get("REMOTE_ADDR"))
    except RateLimited as exc:
        response = JsonResponse(exc.as_dict(), status=exc.status)
        for name, value in retry_after_header(exc).items():
            response[name] = value
        return response
    if device is None:
        return _error(401, "unauthorized", protocol.CLOSE_REASONS[protocol.CLOSE_UNAUTHORIZED])
    if device.status != Device.Status.ACTIVE:
        return _error(403, "revoked", protocol.CLOSE_REASONS[protocol.CLOSE_REVOKED])
    if device.kind != Device.Kind.BRIDGE:
        return _error(403, "bridge_only", "Only a bridge may long-poll; a probe needs the WebSocket.")
    return device


def _poll_state(device_id: Any, after: int) -> tuple[list[tuple[int, str, Any]], str | None, str]:
    """One read per tick: the items waiting, the device's status and its presence channel."""
    items = selectors.outbox_unacked_after(device_id=device_id, after_seq=after, limit=MAX_ITEMS)
    row = Device.objects.filter(pk=device_id).values_list("status", "channel_name").first()
    status, channel = row if row is not None else (None, "")
    return items, status, channel


def _send_signal(signal: Any, **kwargs: Any) -> None:
    for receiver, result in signal.send_robust(sender=Device, **kwargs):
        if isinstance(result, Exception):
            logger.error("receiver %r of %s failed", receiver, signal, exc_info=result)


async def _device_and_body(request: HttpRequest) -> tuple[Device, dict[str, Any]] | JsonResponse:
    """The device the bearer token names and the JSON body, or the refusal to send instead."""
    device = await _device(request)
    if isinstance(device, JsonResponse):
        return device
    body = _body(request)
    if isinstance(body, JsonResponse):
        return body
    return device, body


def _items(rows: list[tuple[int, str, Any]]) -> list[dict[str, Any]]:
    return [{"seq": seq, "kind": kind, "payload": payload} for seq, kind, payload in rows]


@csrf_exempt
@require_POST
async def pull(request: HttpRequest) -> JsonResponse:
    checked = await _device_and_body(request)
    if isinstance(checked, JsonResponse):
        return checked
    device, body = checked
    acked = body.get("ackedSeq", 0)
    if not isinstance(acked, int) or isinstance(acked, bool) or not 0 <= acked <= protocol.MAX_SEQ:
        return _error(400, "invalid_params", f"ackedSeq must be an integer from 0 to {protocol.MAX_SEQ}")
    poll_channel = f"{LONGPOLL_PREFIX}{secrets.token_hex(8)}"
    try:
        if acked:
            await database_sync_to_async(services.outbox_ack)(device_id=device.pk, seq=acked)
        device, came_online = await database_sync_to_async(services.device_longpoll_seen)(
            device_id=device.pk, poll_channel=poll_channel)
    except ApplicationError as exc:
        return _error(exc.status, exc.code, exc.detail)
    if came_online:
        await database_sync_to_async(_send_signal)(signals.device_connected, device=device, hello={})
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settings.DEVICE_LONGPOLL_HOLD_SEC
    beat = settings.DEVICE_HEARTBEAT_SEC
    last_seen = loop.time()
    reply = {"deviceId": str(device.pk), "heartbeatSec": beat, "holdSec": settings.DEVICE_LONGPOLL_HOLD_SEC}
    try:
        while True:
            rows, status, channel = await database_sync_to_async(_poll_state)(device.pk, acked)
            if status != Device.Status.ACTIVE:
                return _error(403, "revoked", protocol.CLOSE_REASONS[protocol.CLOSE_REVOKED])
            if rows:
                return JsonResponse({**reply, "items": _items(rows)})
            if channel.startswith(LONGPOLL_PREFIX) and channel != poll_channel:
                return _error(409, "replaced", "A newer long poll of this device took over.")
            now = loop.time()
            if now >= deadline:
                return JsonResponse({**reply, "items": []})
            if now - last_seen >= beat:
                last_seen = now
                await database_sync_to_async(services.device_longpoll_seen)(device_id=device.pk,
                                                                            poll_channel=poll_channel)
            await asyncio.sleep(min(settings.DEVICE_LONGPOLL_TICK_SEC, max(0.0, deadline - now)))
    except asyncio.CancelledError:
        # The client went away mid-hold (Django cancels the view): offline now, not after the window.
        gone = await database_sync_to_async(services.device_disconnected)(device_id=device.pk,
                                                                          channel_name=poll_channel)
        if gone is not None:
            await database_sync_to_async(_send_signal)(signals.device_disconnected, device=gone)
        raise


@csrf_exempt
@require_POST
async def push(request: HttpRequest) -> JsonResponse:
    checked = await _device_and_body(request)
    if isinstance(checked, JsonResponse):
        return checked
    device, body = checked
    request_id, method, params = body.get("id"), body.get("method"), body.get("params", {})
    if isinstance(request_id, bool) or not isinstance(request_id, str | int) or not str(request_id):
        return _error(400, "invalid_request", "id must be a string or integer")
    if not isinstance(method, str) or not method:
        return _error(400, "invalid_request", "method must be a non-empty string")
    for name, field, value in (("rpc.id", "id", str(request_id)), ("rpc.method", "method", method)):
        try:
            limits.check(name, value, field)
        except limits.LimitExceeded as exc:
            return _error(413, "too_large", str(exc))
    if not isinstance(params, dict):
        return JsonResponse({"id": request_id, "error": {"code": protocol.INVALID_PARAMS,
                                                         "message": "params must be an object"}})
    response = await database_sync_to_async(rpc.dispatch)(device, request_id, method, params)
    return JsonResponse({"id": request_id, **response})
