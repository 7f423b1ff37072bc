"""The platform's side of the declared field limits (``clients.limits``): one error for oversize input.

``enforce`` raises ``PayloadTooLarge`` (413, code ``too_large``, naming the field and the limit);
``devices.rpc.dispatch`` turns it into JSON-RPC -32602 like any invalid parameter. ``enforce_storable``
refuses text no database column can hold (NUL, lone surrogates) the same way, before a write fails on it.
"""

from __future__ import annotations

from typing import Any

from ai1net.exceptions import PayloadTooLarge, ValidationFailed
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


def _unstorable(text: str) -> str | None:
    if "\x00" in text:
        return "a NUL character"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "a lone surrogate (not UTF-8)"
    return None


def enforce_storable(value: Any, field: str) -> Any:
    """``value`` (JSON: nested lists and objects, keys too) when every string in it can be stored: PostgreSQL
    refuses NUL in text and JSON, and no database takes lone surrogates, which a JSON ``\\ud800`` escape makes.
    Else ``ValidationFailed`` (code ``bad_text``) naming the first such field."""
    stack: list[tuple[str, Any]] = [(field, value)]
    while stack:  # not recursive: the JSON parser allows deeper nesting than Python's call stack
        path, item = stack.pop()
        if isinstance(item, str):
            texts = [(path, item)]
        elif isinstance(item, dict):
            texts = [(f"{path}.{key}", key) for key in item if isinstance(key, str)]
            stack.extend((f"{path}.{key}", child) for key, child in item.items())
        elif isinstance(item, list):
            texts = []
            stack.extend((f"{path}[{i}]", child) for i, child in enumerate(item))
        else:
            continue
        for where, text in texts:
            problem = _unstorable(text)
            if problem:
                where = where.encode("ascii", "backslashreplace").decode("ascii")[:200]
                raise ValidationFailed(f"{where} contains {problem}.", code="bad_text", extra={"field": where})
    return value
