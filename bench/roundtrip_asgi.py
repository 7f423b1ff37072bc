"""``bench.bench_asgi`` plus a ``Server-Timing`` header on every HTTP response (the roundtrip benchmark),
and the answer POST's framework floor.

``app;dur=<ms>`` is the time the daphne process spent on the request: from the moment daphne handed the
parsed request to the application (the ASGI call) to the moment the application started its response
(``http.response.start``): every middleware, the session and user reads, the view, the service and its
transaction and commit, in the process that served it. It leaves out only the socket and HTTP parsing
before and the body write after, which the client-side time beside it includes. ``cpu;dur=<ms>`` is the
CPU time the whole process used meanwhile (every thread: the view's worker and the event loop), which
on a busy machine tells the work apart from the wait for a core; during a phone POST the phone's daphne
does little else, so it is close to the request's own cost. ``db;dur=<ms>`` is the wall time the request's
thread spent in database calls (each statement from Django's ``execute`` to its result, each commit, and
the end of each pipeline, where its statements' results come back),
``dbn;dur=<count>`` how many there were: the rest of ``app`` is Python and waiting for a core.

``POST /bench/floor`` is the answer POST without the answer: the same Django stack (every middleware,
the session, the user), the same DRF view base as ``/api/mobile/answer`` (session authentication, CSRF,
the mobile-reply switch and the two-factor check) and the same body parsed by the same serializer,
then ``{"state": "answered"}``: what any answer costs before ``mobile.services.answer_submit`` runs.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings_bench")

from django.urls import path  # noqa: E402
from rest_framework.request import Request  # noqa: E402
from rest_framework.response import Response  # noqa: E402

from ai1net.handlers import KeptThreadsASGIHandler  # noqa: E402
from bench.bench_asgi import application as inner  # noqa: E402 - sets Django up before the app's modules
from mobile.api import AnswerSerializer, MobileView  # noqa: E402

_db_spent = [0.0, 0]  # ms, calls: in the request threads (bench requests are one at a time)


def _timed(method: Any) -> Any:
    def timed(*args: Any, **kwargs: Any) -> Any:
        if not threading.current_thread().name.startswith("django-request"):
            return method(*args, **kwargs)
        started = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            _db_spent[0] += (time.perf_counter() - started) * 1000
            _db_spent[1] += 1
    return timed


def _time_database_calls() -> None:
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.backends.utils import CursorWrapper

    CursorWrapper._execute_with_wrappers = _timed(CursorWrapper._execute_with_wrappers)
    BaseDatabaseWrapper.commit = _timed(BaseDatabaseWrapper.commit)
    try:
        import psycopg
    except ImportError:
        return
    # A pipeline's statements are sent by execute and answered at its end (ai1net.sql.pipelined).
    psycopg.Pipeline.__exit__ = _timed(psycopg.Pipeline.__exit__)


_time_database_calls()


class FloorView(MobileView):
    def post(self, request: Request) -> Response:
        serializer = AnswerSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        return Response({"state": "answered"})


urlpatterns = [path("bench/floor", FloorView.as_view())]


class _FloorHandler(KeptThreadsASGIHandler):
    """The app's ASGI handler, resolving against this module's URLs only (same settings, same middleware)."""

    urlconf = __name__


floor = _FloorHandler()


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        await inner(scope, receive, send)
        return
    started, cpu, (db, calls) = time.perf_counter(), time.process_time(), _db_spent

    async def timed_send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            took, used = (time.perf_counter() - started) * 1000, (time.process_time() - cpu) * 1000
            timing = (f"app;dur={took:.3f}, cpu;dur={used:.3f}, db;dur={_db_spent[0] - db:.3f}, "
                      f"dbn;dur={_db_spent[1] - calls}").encode()
            message = {**message, "headers": [*message.get("headers", []), (b"server-timing", timing)]}
        await send(message)

    target = floor if scope.get("path") == "/bench/floor" else inner
    await target(scope, receive, timed_send)
