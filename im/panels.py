"""One registry: panel kind -> the service that handles an action on it.

``mobile`` registers ``mobile.question`` here, so ``POST /api/im/rooms/<id>/panels/<pk>/actions`` and
``POST /api/mobile/answer`` run the same service.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from im.models import Panel


class PanelHandler(Protocol):
    def __call__(self, *, actor: Any, panel: Panel, action: str, data: dict) -> dict: ...


_handlers: dict[str, PanelHandler] = {}


def register(kind: str, handler: PanelHandler | None = None) -> Callable | None:
    """``register('mobile.question', fn)`` or ``@register('mobile.question')``."""
    if handler is None:
        def decorator(fn: PanelHandler) -> PanelHandler:
            _handlers[kind] = fn
            return fn
        return decorator
    _handlers[kind] = handler
    return None


def handler_for(kind: str) -> PanelHandler | None:
    return _handlers.get(kind)
