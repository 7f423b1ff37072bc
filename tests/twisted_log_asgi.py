"""ai1net's ASGI application with one path more, for tests/fuzz/test_slow_clients.py under a real daphne.

``GET /test/twisted-log`` answers the messages Twisted's log has carried since the app loaded, as text (an
observer on Twisted's global log publisher, where daphne sends that log nowhere or, at ``-v 2``, into
Python's logging).
"""

from __future__ import annotations

import json
from typing import Any

from twisted.logger import formatEvent, globalLogPublisher

from ai1net.asgi import application as ai1net_application

_events: list[str] = []
globalLogPublisher.addObserver(lambda event: _events.append(formatEvent(event)))


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "http" and scope["path"] == "/test/twisted-log":
        body = json.dumps(_events).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})
        return
    await ai1net_application(scope, receive, send)
