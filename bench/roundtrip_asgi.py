"""``bench.bench_asgi`` plus a ``Server-Timing`` header on every HTTP response (the roundtrip benchmark).

``app;dur=<ms>`` is the time the daphne process spent on the request: from the moment daphne handed the
parsed request to the application (the ASGI call) to the moment the application started its response
(``http.response.start``): every middleware, the session and user reads, the view, the service and its
transaction and commit, in the process that served it. It leaves out only the socket and HTTP parsing
before and the body write after, which the client-side time beside it includes. ``cpu;dur=<ms>`` is the
CPU time the whole process used meanwhile (every thread: the view's worker and the event loop), which
on a busy machine tells the work apart from the wait for a core; during a phone POST the phone's daphne
does little else, so it is close to the request's own cost.
"""

from __future__ import annotations

import time
from typing import Any

from bench.bench_asgi import application as inner


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        await inner(scope, receive, send)
        return
    started, cpu = time.perf_counter(), time.process_time()

    async def timed_send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            took, used = (time.perf_counter() - started) * 1000, (time.process_time() - cpu) * 1000
            timing = f"app;dur={took:.3f}, cpu;dur={used:.3f}".encode()
            message = {**message, "headers": [*message.get("headers", []), (b"server-timing", timing)]}
        await send(message)

    await inner(scope, receive, timed_send)
