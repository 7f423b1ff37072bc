"""Device -> platform JSON-RPC requests: a registry and one dispatcher.

Each app registers sync handlers in its own ``<app>/rpc.py`` (autodiscovered at startup)::

    @device_method("mobile.question")
    def question(device: Device, params: dict) -> dict: ...

``dispatch`` runs a handler at most once per (device, client-generated request id): the response,
result or application error, is stored in ``DeviceRequest`` in the same transaction as the handler's
writes, so a retried id gets the first response without running the handler again. It is used by
the tunnel consumer and can serve an HTTP fallback the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.db import IntegrityError, transaction

from ai1net import sql
from ai1net.exceptions import ApplicationError, PayloadTooLarge, ValidationFailed
from ai1net.limits import enforce_storable
from clients import limits, protocol
from devices import selectors
from devices.models import Device, DeviceRequest

logger = logging.getLogger(__name__)

Handler = Callable[[Device, dict], Any]
_registry: dict[str, Handler] = {}


def device_method(name: str) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        if name in _registry and _registry[name] is not fn:
            raise ValueError(f"device method {name!r} registered twice")
        _registry[name] = fn
        return fn

    return register


def registered_methods() -> list[str]:
    return sorted(_registry)


def _error(code: int, message: str, data: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"code": code, "message": message}
    if data:
        body["data"] = data
    return {"error": body}


def dispatch(device: Device, request_id: Any, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """Run ``method`` for ``device``; returns ``{"result": ...}`` or ``{"error": {code, message, data?}}``."""
    handler = _registry.get(method)
    if handler is None:
        return _error(protocol.METHOD_NOT_FOUND, f"unknown method {method!r}")
    key = str(request_id)
    if len(key) > limits.LIMITS["rpc.id"].max:
        exc = limits.LimitExceeded("rpc.id", "id", len(key))
        return _error(protocol.INVALID_PARAMS, str(exc), {"code": "too_large", "detail": str(exc), "field": "id",
                                                          "limit": exc.limit.max})
    try:  # before the first query: PostgreSQL refuses a NUL even in a WHERE
        enforce_storable(key, "id")
        enforce_storable(params, "params")
    except ValidationFailed as exc:
        return _error(protocol.INVALID_PARAMS, exc.detail, {"code": exc.code, "detail": exc.detail, **exc.extra})
    # Every request a device makes reads and writes its record (the bridge's hooks, a question): statements
    # written once, where Django compiled them anew each time (ai1net.sql, devices.selectors).
    stored = sql.one_by(DeviceRequest, device=device, request_id=key)
    if stored is not None:
        return stored.response
    try:
        # Handlers see the device and its owner as they are now, not as they were when the tunnel
        # opened: switches (mobile reply, device web) change while a connection lives.
        fresh = selectors.device_with_owner(device_id=device.pk)
        if fresh is None:
            raise Device.DoesNotExist(device.pk)
        device = fresh
        with transaction.atomic():
            try:
                with transaction.atomic():
                    response: dict[str, Any] = {"result": handler(device, params)}
            except (ValidationFailed, PayloadTooLarge) as exc:  # oversize fields: -32602 naming field and limit
                response = _error(protocol.INVALID_PARAMS, exc.detail,
                                  {"code": exc.code, "detail": exc.detail, **exc.extra})
            except ApplicationError as exc:
                response = _error(protocol.APPLICATION_ERROR, exc.detail,
                                  {"code": exc.code, "detail": exc.detail, **exc.extra})
            sql.insert(DeviceRequest(device=device, request_id=key, method=method[:64], response=response))
    except IntegrityError:
        # The same id ran concurrently and committed first: its response stands, ours rolled back.
        stored = DeviceRequest.objects.filter(device=device, request_id=key).values_list("response", flat=True).first()
        if stored is not None:
            return stored
        logger.exception("device request %s %s failed", method, key)
        return _error(protocol.INTERNAL_ERROR, "internal error")
    except Exception:
        logger.exception("device request %s %s failed", method, key)
        return _error(protocol.INTERNAL_ERROR, "internal error")
    return response


@device_method("devices.ping")
def ping(device: Device, params: dict[str, Any]) -> dict[str, Any]:
    """Liveness check a client can call through the tunnel."""
    return {"pong": True, "device_id": str(device.pk)}
