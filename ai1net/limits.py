"""The platform's side of the declared field limits (``clients.limits``): one error for oversize input.

``enforce`` raises ``PayloadTooLarge`` (413, code ``too_large``, naming the field and the limit);
``devices.rpc.dispatch`` turns it into JSON-RPC -32602 like any invalid parameter.
"""

from __future__ import annotations

from typing import Any

from ai1net.exceptions import PayloadTooLarge
from clients import limits


def too_large(exc: limits.LimitExceeded) -> PayloadTooLarge:
    return PayloadTooLarge(str(exc), code="too_large",
                           extra={"field": exc.field, "limit": exc.limit.max, "unit": exc.limit.unit})


def enforce(name: str, value: Any, field: str | None = None) -> Any:
    try:
        return limits.check(name, value, field)
    except limits.LimitExceeded as exc:
        raise too_large(exc) from None


def enforce_questions(questions: Any) -> Any:
    try:
        return limits.check_questions(questions)
    except limits.LimitExceeded as exc:
        raise too_large(exc) from None
