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

``POST /bench/floor-db`` is that stack followed by the answer's database work as bare statements, and
nothing else of the product: the question's read (the statement ``mobile.selectors.own_question`` sends,
its row not made into models), then one transaction with the answer's writes in the same number, kind and
order (a conditional UPDATE with its INSERT, two INSERTs, a head's UPDATE with its INSERT; on PostgreSQL
one statement each, sent in one pipeline as the answer's are; SQLite has no writing WITH, so two each
there) into tables of the benchmark's own (the rows into the tunnel floors' ``bench_floor_item``), and a
durable COMMIT. What an answer costs at least on this
database before any of the product's Python: models, checks, the payloads, the audit's hashes, events.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings_bench")

from django.db import transaction  # noqa: E402
from django.urls import path  # noqa: E402
from rest_framework.exceptions import NotFound  # noqa: E402
from rest_framework.request import Request  # noqa: E402
from rest_framework.response import Response  # noqa: E402

from ai1net import sql  # noqa: E402
from ai1net.handlers import KeptThreadsASGIHandler  # noqa: E402
from bench.bench_asgi import _floor_create_table  # noqa: E402 - importing it sets Django up first
from bench.bench_asgi import application as inner  # noqa: E402
from mobile.api import AnswerSerializer, MobileView  # noqa: E402
from mobile.models import Question  # noqa: E402
from mobile.selectors import _own_question_plan  # noqa: E402

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


# About an answer's room message, outbox payload or audit entry: a few hundred bytes of JSON each.
_ROW_BODY = json.dumps({"question_id": "5f0c9a52-0d7e-4a55-9d1c-1f8e8f3f2f55", "via": "phone",
                        "answers": {"Proceed with the deploy?": ["Yes"]}, "other": {},
                        "answered_at": "2026-12-07T22:51:00.000000+00:00", "note": "x" * 96})
# The rows go to the tunnel floors' table (bench.bench_asgi); the gate's is this floor's own.
_GATE_TABLE = "CREATE TABLE IF NOT EXISTS bench_floor_gate (id integer PRIMARY KEY, n bigint NOT NULL)"
_GATED = ("WITH gate AS (UPDATE bench_floor_gate SET n = n + 1 WHERE id = %s RETURNING n) "
          "INSERT INTO bench_floor_item (payload) SELECT %s FROM gate RETURNING id")
_INSERT = "INSERT INTO bench_floor_item (payload) VALUES (%s) RETURNING id"
_GATE = "UPDATE bench_floor_gate SET n = n + 1 WHERE id = %s RETURNING n"
_tables_made: set[str] = set()
_tables_lock = threading.Lock()


def _floor_tables(conn: Any) -> None:
    with _tables_lock:
        if conn.alias in _tables_made:
            return
        with transaction.atomic(using=conn.alias), conn.cursor() as cursor:
            _floor_create_table()
            cursor.execute(_GATE_TABLE)
            cursor.execute("INSERT INTO bench_floor_gate (id, n) VALUES (1, 0), (2, 0) ON CONFLICT (id) DO NOTHING")
        _tables_made.add(conn.alias)


def _floor_writes(vendor: str) -> list[tuple[str, list[Any]]]:
    """The answer's writes (the nonce's burn with the answer, the outbox item, the room message, the audit
    chain's head with its entry) as statements of the same kinds on the benchmark's tables."""
    if vendor == "postgresql":
        return [(_GATED, [1, _ROW_BODY]), (_INSERT, [_ROW_BODY]), (_INSERT, [_ROW_BODY]), (_GATED, [2, _ROW_BODY])]
    return [(_GATE, [1]), (_INSERT, [_ROW_BODY]), (_INSERT, [_ROW_BODY]), (_INSERT, [_ROW_BODY]), (_GATE, [2]),
            (_INSERT, [_ROW_BODY])]


class StatementsFloorView(MobileView):
    def post(self, request: Request) -> Response:
        serializer = AnswerSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        conn = transaction.get_connection()
        _floor_tables(conn)
        read, _ = _own_question_plan(conn.vendor)
        question_id = Question._meta.pk.get_db_prep_value(serializer.validated_data["question_id"], conn)
        with conn.cursor() as cursor:
            cursor.execute(read, [question_id, request.user.pk])
            if cursor.fetchone() is None:
                raise NotFound()
        with transaction.atomic(), sql.pipelined():
            written = [sql.run(conn, statement, params) for statement, params in _floor_writes(conn.vendor)]
        if any(later.value is None for later in written):
            raise RuntimeError("a floor statement wrote no row")
        return Response({"state": "answered"})


urlpatterns = [path("bench/floor", FloorView.as_view()), path("bench/floor-db", StatementsFloorView.as_view())]


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

    target = floor if scope.get("path") in ("/bench/floor", "/bench/floor-db") else inner
    await target(scope, receive, timed_send)
