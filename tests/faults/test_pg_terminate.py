"""Fault: the daphne process's PostgreSQL connections are dropped (pg_terminate_backend) under load.
Requests caught by a dead connection must fail cleanly (a 5xx with the JSON error body, never a
traceback page) and the next ones must succeed, with no restart. Only the daphne process's backends
(told by their application_name) of this test's database are terminated.
"""

from __future__ import annotations

import contextlib
import threading
import time

import httpx
import pytest
from django.db import connection

from tests.e2e_support import Daphne, logged_in
from tests.faults.support import summary

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.redis, pytest.mark.django_db(transaction=True),
              pytest.mark.skipif(connection.vendor != "postgresql", reason="pg_terminate_backend needs PostgreSQL")]

CLIENTS = 4
KILLS = 3
PATHS = ("/api/devices", "/api/mobile/pending", "/api/mobile/state")


APP_NAME = "ai1net-faults-daphne"  # libpq's PGAPPNAME: how the daphne's backends are told from ours


def terminate_backends() -> int:
    """Drop the daphne process's connections to this test's database (not this process's pool)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                       "WHERE datname = current_database() AND application_name = %s", [APP_NAME])
        return int(cursor.fetchone()[0])


def test_dropped_database_connections_fail_cleanly_and_the_next_requests_succeed(tmp_path, user, password):
    user.mobile_reply_enabled = True
    user.save(update_fields=["mobile_reply_enabled"])
    server = Daphne(tmp_path, PGAPPNAME=APP_NAME)
    results: list[tuple[float, int, str, str]] = []  # (when, status, content type, body head)
    stop = threading.Event()

    def load(session: httpx.Client, index: int) -> None:
        n = index
        while not stop.is_set():
            response = session.get(PATHS[n % len(PATHS)])
            results.append((time.monotonic(), response.status_code, response.headers.get("content-type", ""),
                            response.text[:300]))
            n += 1

    sessions = contextlib.ExitStack()
    try:
        clients = [sessions.enter_context(logged_in(server.url, user.username, password)) for _ in range(CLIENTS)]
        threads = [threading.Thread(target=load, args=(client, i)) for i, client in enumerate(clients)]
        for thread in threads:
            thread.start()
        time.sleep(1.0)
        terminated = 0
        for _ in range(KILLS):
            terminated += terminate_backends()
            time.sleep(1.0)
        last_kill = time.monotonic()
        time.sleep(2.0)
        stop.set()
        for thread in threads:
            thread.join(30)
    finally:
        stop.set()
        sessions.close()
        server.stop()
    failed = [r for r in results if r[1] != 200]
    unclean = [r for r in failed if r[1] < 500 or "application/json" not in r[2] or '"error"' not in r[3]]
    after = [r for r in results if r[0] > last_kill + 1.0]
    # A request is delivered (200) or refused cleanly (503 + error body: the client knows to retry);
    # lost = a failure without the error body (a server-error or traceback page).
    summary("pg_terminate_backend", {"sent": len(results), "delivered": len(results) - len(failed),
                                     "refused_503": len(failed) - len(unclean), "lost": len(unclean),
                                     "backends_terminated": terminated,
                                     "ok_after_last_kill": sum(r[1] == 200 for r in after), "after": len(after)})
    assert terminated >= KILLS
    assert not unclean, unclean[:3]
    assert after and all(r[1] == 200 for r in after), [r for r in after if r[1] != 200][:3]
