"""Django's ASGI handler with its request threads kept, as a WSGI server keeps its workers.

Django runs each HTTP request's synchronous code (middleware, views, the ORM) inside
``ThreadSensitiveContext()``, and without an executor of its own that context starts a new thread for
every request. Database connections are per thread, so every request also opened a new connection
(on SQLite a connect and its PRAGMAs) before any work: a leading cost of a bare API request in a
py-spy profile of daphne. Here each request borrows an idle single-thread executor (making one when
none is idle) and gives it back when done, so a thread and its connection serve one request after
another; there are never more threads than requests that ran at the same time. Connections still go
through Django's request_started/request_finished checks (``CONN_MAX_AGE``, health checks) as under WSGI.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import django
from asgiref.sync import ThreadSensitiveContext
from django.core.handlers.asgi import ASGIHandler


class KeptThreadsASGIHandler(ASGIHandler):
    def __init__(self) -> None:
        super().__init__()
        self._idle: list[ThreadPoolExecutor] = []  # touched on the event loop only

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        executor = self._idle.pop() if self._idle else ThreadPoolExecutor(max_workers=1,
                                                                            thread_name_prefix="django-request")
        try:
            async with ThreadSensitiveContext(executor=executor):
                await self.handle(scope, receive, send)
        finally:
            # Free by now: a view whose request was cancelled (the client went away) may go on in this
            # thread, but handle() always ends with a thread-sensitive call (response.close() or the
            # request_finished receivers) that queues behind it on this one-thread executor.
            self._idle.append(executor)


def get_asgi_application() -> KeptThreadsASGIHandler:
    """``django.core.asgi.get_asgi_application`` with the handler above."""
    django.setup(set_prefix=False)
    return KeptThreadsASGIHandler()
