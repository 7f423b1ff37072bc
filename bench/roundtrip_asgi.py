"""``bench.bench_asgi`` plus a ``Server-Timing`` header on every HTTP response (the roundtrip benchmark).

``app;dur=<ms>`` is the time the daphne process spent on the request: from the moment daphne handed the
parsed request to the application (the ASGI call) to the moment the application started its response
(``http.response.start``): every middleware, the session and user reads, the view, the service and its
transaction and commit, in the process that served it. It leaves out only the socket and HTTP parsing
before and the body write after, which the client-side time beside it includes.
"""

from __future__ import annotations

import time
from typing import Any

from bench.bench_asgi import application as inner


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        await inner(scope, receive, send)
        return
    started = time.perf_counter()

    async def timed_send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            took = (time.perf_counter() - started) * 1000
            message = {**message, "headers": [*message.get("headers", []),
                                              (b"server-timing", f"app;dur={took:.3f}".encode())]}
        await send(message)

    await inner(scope, receive, timed_send)
