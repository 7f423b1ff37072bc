"""ai1net.sqlite_backend.checkpoints: the write-ahead log copied back by a thread, not by a request's commit."""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection

from ai1net.sqlite_backend import checkpoints
from ai1net.sqlite_backend.base import DatabaseWrapper

ROOT = Path(__file__).resolve().parent.parent
ROW = "x" * 1000


def _writer(path: Path, autocheckpoint: int) -> sqlite3.Connection:
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("PRAGMA synchronous=NORMAL")
    writer.execute(f"PRAGMA wal_autocheckpoint={autocheckpoint}")
    writer.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, body TEXT)")
    return writer


def _commit_rows(writer: sqlite3.Connection, count: int) -> None:
    for _ in range(count):
        writer.execute("INSERT INTO t (body) VALUES (?)", (ROW,))


def _wait_for(condition, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


@pytest.fixture
def database(tmp_path):
    """(path, a connection that writes and never checkpoints by itself)"""
    path = tmp_path / "db.sqlite3"
    writer = _writer(path, autocheckpoint=0)
    yield path, writer
    writer.close()


@contextlib.contextmanager
def _checkpointing(path: Path) -> Iterator[checkpoints.Checkpointer]:
    checkpointer = checkpoints.Checkpointer(str(path), interval=0.02)
    checkpointer.start()
    try:
        yield checkpointer
    finally:
        checkpointer.stop()


def test_the_thread_copies_the_log_into_the_database(database):
    path, writer = database
    _commit_rows(writer, 2000)  # ~2 MB, one commit each
    time.sleep(0.3)
    assert path.stat().st_size < 100_000  # still all in the log
    with _checkpointing(path) as checkpointer:
        # (the file grows while the checkpoint copies, before it is counted)
        assert _wait_for(lambda: checkpointer.checkpoints >= 1), path.stat().st_size
        assert path.stat().st_size > 2_000_000


def test_the_log_stays_bounded_while_writes_go_on(database):
    path, writer = database
    with _checkpointing(path) as checkpointer:
        for _ in range(10):  # ~30 MB of log written in all
            _commit_rows(writer, 500)
            begun = checkpointer.passes + 1  # the pass after the one that may be under way
            assert _wait_for(lambda begun=begun: checkpointer.passes > begun)  # pass `begun` has checkpointed
        # A log that is fully copied back is written again from its start: it does not grow with the writes.
        assert Path(f"{path}-wal").stat().st_size < 10_000_000
        assert writer.execute("SELECT count(*) FROM t").fetchone() == (5000,)


def test_an_idle_log_is_not_checkpointed_again(database):
    path, writer = database
    _commit_rows(writer, 10)
    with _checkpointing(path) as checkpointer:
        assert _wait_for(lambda: checkpointer.checkpoints >= 1)
        passes = checkpointer.passes
        assert _wait_for(lambda: checkpointer.passes >= passes + 10)  # passes with nothing written
        assert checkpointer.checkpoints == 1
        _commit_rows(writer, 10)
        assert _wait_for(lambda: checkpointer.checkpoints == 2)


@pytest.mark.skipif(connection.vendor != "sqlite", reason="the embedded default's backend")
def test_connections_leave_checkpoints_to_the_thread_while_it_runs(tmp_path, django_db_blocker):
    path = tmp_path / "db.sqlite3"

    def autocheckpoint() -> int:
        wrapper = DatabaseWrapper({**connection.settings_dict, "NAME": str(path)})
        with django_db_blocker.unblock():
            try:
                wrapper.ensure_connection()
                return wrapper.connection.execute("PRAGMA wal_autocheckpoint").fetchone()[0]
            finally:
                wrapper.close()

    assert autocheckpoint() == 1000  # SQLite's default
    assert not checkpoints.running_for(path)
    checkpoints.start(path)
    try:
        assert checkpoints.running_for(path) and checkpoints.start(str(path)) is checkpoints.start(path)
        assert autocheckpoint() == checkpoints.BACKSTOP_PAGES
    finally:
        checkpoints.stop(path)
    assert autocheckpoint() == 1000


def test_a_database_the_thread_cannot_open_leaves_checkpoints_to_the_commits(tmp_path, caplog):
    path = tmp_path / "no such folder" / "db.sqlite3"
    with caplog.at_level(logging.WARNING, logger="ai1net.sqlite_backend.checkpoints"):
        checkpointer = checkpoints.start(path)
        try:
            assert _wait_for(lambda: not checkpointer.alive())
            assert not checkpoints.running_for(path)  # new connections keep SQLite's own threshold
        finally:
            checkpoints.stop(path)
    assert "no checkpoint thread for" in caplog.text


def test_in_memory_databases_get_no_thread():
    assert checkpoints.start(":memory:") is None
    assert checkpoints.start("file:memdb1?mode=memory&cache=shared") is None


@pytest.mark.parametrize("program, expected", [("daphne", "True (50000, 20, 20)"), ("manage.py", "False (700, 10, 10)")])
def test_a_server_starts_the_thread_and_tunes_the_collector_and_other_programs_do_not(tmp_path, program, expected):
    # As daphne loads the app (ai1net.asgi), and as a management command or a test run would.
    script = (
        "import sys; sys.argv = [sys.argv[1]]; import gc, ai1net.asgi; from django.conf import settings; "
        "from ai1net.sqlite_backend import checkpoints; "
        "print(checkpoints.running_for(settings.DATABASES['default']['NAME']), gc.get_threshold())"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(
        DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}",
        DJANGO_SETTINGS_MODULE="ai1net.settings",
        AI1NET_DEBUG="1",
        PYTHONPATH=str(ROOT),
    )
    result = subprocess.run(
        [sys.executable, "-c", script, program], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == expected
