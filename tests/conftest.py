"""Shared fixtures. End-to-end helpers (real daphne, real clients) live in tests/e2e_support.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
import warnings

import pytest
from channels.layers import DEFAULT_CHANNEL_LAYER, channel_layers
from django.conf import settings
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.core.cache import cache

# System programs that tests of a marker need, with the Debian package that provides each (`make deps`
# installs them). A missing one stops the run before any test with one line, never a silent skip.
SYSTEM_PROGRAMS = {"browser": ("chromium", "chromium"), "ripgrep": ("rg", "ripgrep")}


class QuickPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    """PBKDF2 with few iterations for the users tests make (Django's default took 0.4-1 s per password, on
    every ``user`` fixture). The same algorithm name: the iteration count travels in the hash, so the real
    daphne processes that end-to-end tests start, on the default hasher, still verify these passwords."""

    iterations = 1_000


def pytest_configure(config: pytest.Config) -> None:
    settings.PASSWORD_HASHERS = ["tests.conftest.QuickPBKDF2PasswordHasher", *settings.PASSWORD_HASHERS]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    markers = {mark.name for item in items for mark in item.iter_markers()}
    missing = sorted({package for marker, (program, package) in SYSTEM_PROGRAMS.items()
                      if marker in markers and shutil.which(program) is None})
    if missing:
        pytest.exit(f"missing system package(s) {' '.join(missing)} for the selected tests: run 'make deps' "
                    f"(or 'sudo apt-get install -y {' '.join(missing)}')", returncode=4)


@pytest.fixture(autouse=True)
def _clean_cache():
    """Rate limits and short-lived state live in the cache; start every test without them."""
    _clear_cache()
    yield
    _clear_cache()


@pytest.fixture(autouse=True)
def _database_threads_settle(request):
    """A tunnel's database thread may still be writing when a test ends (the hello's receivers run after its
    reply, a disconnect writes presence): the test's database is emptied only after it is done, or the flush
    raced the write (PostgreSQL: TRUNCATE deadlocked with the receivers' upsert)."""
    if request.node.get_closest_marker("django_db") is not None:
        request.getfixturevalue("_django_db_helper")  # torn down after this fixture: the flush waits
    yield
    from ai1net.db_threads import DatabaseThreads

    if not DatabaseThreads.wait_all_idle(timeout=10):
        # A call that outlived its test this long is a hang to find (each later test waited 10 s for one that
        # waited for its stopped loop: ai1net.realtime.group_send_now): named here, not only slow.
        warnings.warn(f"a database thread's call was still running 10 s after {request.node.nodeid} ended",
                      stacklevel=1)


@pytest.fixture(autouse=True)
def _sync_to_async_thread_gives_back_its_connection(request):
    """An async test's ``sync_to_async`` calls run in asgiref's one thread-sensitive thread, and nothing there
    gives its database connection back (Channels' ``database_sync_to_async`` does, plain ``sync_to_async``
    does not): on PostgreSQL it stayed checked out of the pool to the end of the run, and the test database
    could not be dropped ("being accessed by other users": a teardown warning in each of four runs of the
    suite here, the connection's last statement a test's UPDATE of a user). Returned after each test."""
    if request.node.get_closest_marker("django_db") is None:
        yield
        return
    request.getfixturevalue("_django_db_helper")  # torn down after this fixture
    yield
    from asgiref.sync import SyncToAsync
    from django.db import close_old_connections

    SyncToAsync.single_thread_executor.submit(close_old_connections).result(timeout=10)


@pytest.fixture(scope="session", autouse=True)
def _test_database_holders_named(request):
    """On PostgreSQL, a connection still open on the test database at the end of the run kept it from being
    dropped, and pytest-django's warning ("is being accessed by other users") named neither the connection
    nor its owner (once in every few CI runs, a connection of the worker itself; not reproduced outside CI).
    Before the drop: the pool is closed, and every session still on the database is named in a warning (its
    last statement, the local process holding it, and the test and thread that took it last), then ended, so
    the database goes and the next run finds no leftover. The psycopg patches that record the takers are undone
    right after."""
    uses_database = any(item.get_closest_marker("django_db") for item in request.session.items)
    if "postgresql" not in settings.DATABASES["default"]["ENGINE"] or not uses_database:
        yield
        return
    with pytest.MonkeyPatch.context() as patches:
        takers = _record_connection_takers(patches)  # before the setup: the pool opens its first connections there
        request.getfixturevalue("django_db_setup")  # torn down after this fixture: the drop comes after
        yield
        with request.getfixturevalue("django_db_blocker").unblock():
            _name_and_end_the_test_databases_holders(takers)


def _record_connection_takers(patches: pytest.MonkeyPatch) -> dict[int, str]:
    """Who took each connection of this worker last, by backend pid: the test and its phase running then
    (pytest's ``PYTEST_CURRENT_TEST``) and the thread, when it was opened and each time it is taken from the
    pool, and then given back. The warning below then names the test that left a connection open, and says
    whether it was still out of the pool (once in CI it named a tunnel database thread in a fuzz test: its
    call waited forever for a stopped loop, ``test_a_call_whose_loop_stopped_meanwhile_still_sends_and_ends``)."""
    import psycopg
    import psycopg_pool

    takers: dict[int, str] = {}
    connect, getconn = psycopg.Connection.connect.__func__, psycopg_pool.ConnectionPool.getconn
    putconn = psycopg_pool.ConnectionPool.putconn

    def now_here(what: str) -> str:
        test = os.environ.get("PYTEST_CURRENT_TEST", "no test")
        return f"{what} during {test} in thread {threading.current_thread().name!r}"

    def connect_recorded(cls, *args, **kwargs):
        conn = connect(cls, *args, **kwargs)
        takers[conn.info.backend_pid] = now_here("opened")
        return conn

    def getconn_recorded(self, *args, **kwargs):
        conn = getconn(self, *args, **kwargs)
        takers[conn.info.backend_pid] = now_here("taken from the pool")
        return conn

    def putconn_recorded(self, conn, *args, **kwargs):
        pid = conn.info.backend_pid if not conn.closed else None
        putconn(self, conn, *args, **kwargs)
        if pid is not None:
            takers[pid] = f"{takers.get(pid, 'not recorded')}, then {now_here('given back')}"

    patches.setattr(psycopg.Connection, "connect", classmethod(connect_recorded))
    patches.setattr(psycopg_pool.ConnectionPool, "getconn", getconn_recorded)
    patches.setattr(psycopg_pool.ConnectionPool, "putconn", putconn_recorded)
    return takers


def _name_and_end_the_test_databases_holders(takers: dict[int, str]) -> None:
    from django.db import connection

    connection.close()
    connection.close_pool()
    name = connection.settings_dict["NAME"]
    deadline = time.monotonic() + 5  # a closed client's backend leaves on its own, not at once
    with connection._nodb_cursor() as cursor:
        while True:
            cursor.execute("SELECT pid, client_port, state, backend_start, left(query, 300) FROM pg_stat_activity"
                           " WHERE datname = %s AND pid <> pg_backend_pid()", [name])
            holders = cursor.fetchall()
            if not holders or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        for pid, port, state, started, query in holders:
            taker = takers.get(pid, "not opened by psycopg in this worker")
            warnings.warn(f"a connection was still open on the test database {name} at the end of the run: "
                          f"backend {pid} ({state}, since {started:%H:%M:%S}), last statement {query!r}, "
                          f"held by {_local_process_on_port(port)}, {taker}", stacklevel=1)
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])


def _local_process_on_port(port: int | None) -> str:
    """The local process whose socket has this client port (``ss`` from iproute2), for the warning above."""
    if not port or not shutil.which("ss"):
        return "an unknown process"
    found = subprocess.run(["ss", "-tnpH", f"sport = :{port}"], capture_output=True, text=True).stdout.strip()
    return f"{found or 'no local process'} (this test worker is pid {os.getpid()})"


@pytest.fixture(autouse=True)
def _notices_stay_in_their_test(request, monkeypatch):
    """Every test gets a notice dispatcher of its own, closed when it ends. The process-wide one sent a
    question's notice from its thread while a later test ran, and a coalesced one up to 5 s after: without
    database access there, it logged an error into that test (PostgreSQL CI, a fuzz test's error log)."""
    from notify import dispatch, receivers

    if request.node.get_closest_marker("django_db") is not None:
        request.getfixturevalue("_django_db_helper")  # torn down after this fixture: a running send ends first
    dispatcher = dispatch.Dispatcher()
    monkeypatch.setattr(receivers, "dispatcher", dispatcher)
    yield dispatcher
    dispatcher.close()


@pytest.fixture(autouse=True)
def _own_channel_layer():
    """Every test gets a channel layer of its own. A test runs event loops one after another (its own,
    async_to_sync's) in one process, where a daphne runs one: channels-redis keeps asyncio locks in the
    layer, and one left held by a loop that had just ended failed the next receive on another loop
    ("bound to a different event loop", once in a CI run). The in-memory layer's leftovers go too."""
    yield
    channel_layers.backends.pop(DEFAULT_CHANNEL_LAYER, None)


def _clear_cache() -> None:
    if settings.REDIS_URL:
        import redis

        client = redis.Redis.from_url(settings.REDIS_URL)
        try:
            keys = list(client.scan_iter(f"{settings.REDIS_PREFIX}:cache*", count=1000))
            if keys:
                client.delete(*keys)
        finally:
            client.close()
    else:
        cache.clear()


@pytest.fixture
def password() -> str:
    return "correct horse battery staple 42"


@pytest.fixture
def user(django_user_model, password):
    return django_user_model.objects.create_user(username="alice", password=password, email="alice@example.com")


@pytest.fixture
def other_user(django_user_model, password):
    return django_user_model.objects.create_user(username="mallory", password=password)


@pytest.fixture
def api(client, user):
    """A browser-like test client logged in as ``user`` (no OTP device enrolled)."""
    client.force_login(user)
    return client


@pytest.fixture
def mobile_user(user):
    """``user`` with mobile reply switched on."""
    from tests.mobile.factories import enable_mobile

    return enable_mobile(user)


@pytest.fixture
def bridge(mobile_user):
    """A bridge device of ``mobile_user``."""
    from tests.mobile.factories import bridge_for

    return bridge_for(mobile_user)


@pytest.fixture
def phone(client, mobile_user):
    """The user's phone: a logged-in browser session."""
    client.force_login(mobile_user)
    return client
