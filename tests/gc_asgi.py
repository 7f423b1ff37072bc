"""ai1net's ASGI application with one path more, for tests/test_connection_cycles.py under a real daphne.

``GET /test/gc`` runs the cyclic collector and answers what it found: ``garbage``, the objects that were only
kept alive by reference cycles, counted by type; ``exceptions``, where each exception among them was raised;
and ``open_sockets``, the WebSocket protocols still alive otherwise (daphne lets go of a closed one within a
second). What was found is freed before the answer.
"""

from __future__ import annotations

import collections
import gc
import json
import traceback
from typing import Any

from ai1net.asgi import application as ai1net_application


def collect() -> dict[str, Any]:
    from daphne.ws_protocol import WebSocketProtocol

    gc.set_debug(gc.DEBUG_SAVEALL)  # the collector keeps what it finds in gc.garbage instead of freeing it
    try:
        gc.collect()
    finally:
        gc.set_debug(0)
    found = collections.Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.garbage)
    # An exception in a cycle (its traceback's frame holding it) says where it was raised and kept.
    exceptions = [f"{type(o).__qualname__}: {o} at " + " <- ".join(
        f"{frame.f_code.co_filename.rsplit('site-packages/', 1)[-1]}:{lineno}"
        for frame, lineno in traceback.walk_tb(o.__traceback__)) for o in gc.garbage if isinstance(o, BaseException)]
    cyclic = {id(o) for o in gc.garbage}
    sockets = sum(1 for o in gc.get_objects() if isinstance(o, WebSocketProtocol) and id(o) not in cyclic)
    gc.garbage.clear()
    gc.collect()
    return {"garbage": found, "exceptions": exceptions, "open_sockets": sockets}


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "http" and scope["path"] == "/test/gc":
        body = json.dumps(collect()).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})
        return
    await ai1net_application(scope, receive, send)
