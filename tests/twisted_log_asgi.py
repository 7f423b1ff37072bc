"""ai1net's ASGI application with two paths more, for tests under a real daphne.

``GET /test/twisted-log`` answers the messages Twisted's log has carried since the app loaded, as text (an
observer on Twisted's global log publisher, where daphne sends that log nowhere or, at ``-v 2``, into
Python's logging; tests/fuzz/test_slow_clients.py). ``GET /test/transport`` answers the class names of the
request's Twisted transport, its own first (tests/test_soon_writes.py).
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
    if scope["type"] == "http" and scope["path"] == "/test/transport":
        request = send.args[0]  # daphne's send: partial(server.handle_reply, <the Twisted request>)
        body = json.dumps([cls.__name__ for cls in type(request.channel.transport).__mro__]).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})
        return
    await ai1net_application(scope, receive, send)
