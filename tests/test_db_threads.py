"""ai1net.db_threads: a database call from the loop runs in one of a few threads and keeps what a worker
thread of asgiref's gave it (the caller's context variables, the calling loop for realtime's sends)."""

from __future__ import annotations

import asyncio
import contextvars
import threading

import pytest
from django.db import connection

from ai1net import realtime
from ai1net.accounts.models import User
from ai1net.db_threads import DatabaseThreads

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="none")


async def test_the_result_and_the_error_come_back_to_the_caller():
    threads = DatabaseThreads(1, "test-db")
    assert await threads.call(lambda a, *, b: (a, b, threading.current_thread().name), 1, b=2) == (1, 2, "test-db_0")

    def fails() -> None:
        raise LookupError("no such row")

    with pytest.raises(LookupError, match="no such row"):
        await threads.call(fails)
    # A future refuses StopIteration itself: the caller gets a RuntimeError instead of waiting forever.
    with pytest.raises(RuntimeError) as raised:
        await asyncio.wait_for(threads.call(next, iter([])), timeout=5)
    assert isinstance(raised.value.__cause__, StopIteration)


async def test_the_callers_context_is_seen_and_sends_go_to_the_calling_loop():
    threads = DatabaseThreads(1, "test-db")
    request_id.set("r-42")
    seen_id, worker_loop = await threads.call(lambda: (request_id.get(), realtime._worker_loop()))
    # realtime hands a send to this loop rather than blocking the thread on async_to_sync.
    assert seen_id == "r-42" and worker_loop is asyncio.get_running_loop()


async def test_a_cancelled_caller_stops_waiting_and_the_threads_go_on():
    threads = DatabaseThreads(1, "test-db")
    started, release, finished = threading.Event(), threading.Event(), threading.Event()

    def slow() -> str:
        started.set()
        release.wait(5)
        finished.set()
        return "late"

    waiting = asyncio.create_task(threads.call(slow))
    await asyncio.to_thread(started.wait, 5)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    release.set()
    assert await threads.call(lambda: "next") == "next"
    assert finished.is_set()


async def test_calls_share_the_threads_it_was_given():
    threads = DatabaseThreads(2, "test-db")
    barrier = threading.Barrier(2, timeout=5)

    def meet() -> str:
        barrier.wait()  # both threads at once: two calls in flight run side by side
        return threading.current_thread().name

    names = await asyncio.gather(*(threads.call(meet) for _ in range(2)))
    assert sorted(names) == ["test-db_0", "test-db_1"]
    names = await asyncio.gather(*(threads.call(lambda: threading.current_thread().name) for _ in range(20)))
    assert set(names) <= {"test-db_0", "test-db_1"}


@pytest.mark.django_db(transaction=True)
async def test_the_orm_works_in_the_threads_on_their_own_connections():
    threads = DatabaseThreads(1, "test-db")
    await threads.call(User.objects.create_user, username="carol", password="x" * 12)
    count, in_atomic = await threads.call(lambda: (User.objects.filter(username="carol").count(),
                                                   connection.in_atomic_block))
    assert count == 1 and not in_atomic


async def test_waiting_for_idle_threads_waits_for_calls_whose_caller_stopped_waiting():
    threads = DatabaseThreads(1, "test-idle")
    release = threading.Event()
    call = asyncio.ensure_future(threads.call(release.wait, 5))
    await asyncio.sleep(0.05)
    call.cancel()  # the caller stops waiting; the call runs on
    loop = asyncio.get_running_loop()
    assert not await loop.run_in_executor(None, DatabaseThreads.wait_all_idle, 0.1)
    loop.call_later(0.1, release.set)
    assert await loop.run_in_executor(None, DatabaseThreads.wait_all_idle, 5)


async def test_connections_are_tidied_after_each_call_and_before_one_only_when_that_failed(monkeypatch):
    from ai1net import db_threads

    tidied: list[str] = []
    failures = ["unusable connection"]

    def close_old_connections() -> None:
        tidied.append(threading.current_thread().name)
        if failures:
            raise RuntimeError(failures.pop())

    monkeypatch.setattr(db_threads, "close_old_connections", close_old_connections)
    threads = DatabaseThreads(1, "test-tidy")
    # The housekeeping after the call failed: the caller hears of it, and the next call tidies first.
    with pytest.raises(RuntimeError, match="unusable connection"):
        await threads.call(lambda: "first")
    assert len(tidied) == 1
    assert await threads.call(lambda: "second") == "second"
    assert len(tidied) == 3  # before (the last one failed) and after
    assert await threads.call(lambda: "third") == "third"
    assert len(tidied) == 4  # after only: nothing ran on the thread since


def test_a_call_whose_loop_stopped_meanwhile_still_sends_and_ends(monkeypatch):
    """A call still running when its caller's loop stops (the end of a test, daphne's shutdown) sent its
    events with ``async_to_sync``, which scheduled them on that loop, stopped but not closed, and waited
    for it forever: the thread never took another call and kept its pooled connection (PostgreSQL CI: the
    test database's teardown found it, 'idle' after its COMMIT, taken by a tunnel database thread in a
    test that ended while its device disconnected; every later test's teardown waited 10 s for the
    threads). The send now runs on a loop of its own."""
    sent: list[tuple[str, dict]] = []

    async def send(group: str, message: dict) -> None:
        sent.append((group, message))

    monkeypatch.setattr(realtime, "_send", send)
    threads = DatabaseThreads(1, "test-stopped")
    in_call, loop_stopped = threading.Event(), threading.Event()

    def disconnect_write() -> str:
        in_call.set()
        loop_stopped.wait(5)
        realtime.group_send_now("rt.stopped", {"type": "t.n"})  # as an on_commit send after the write
        return "written"

    async def leave_a_call_running() -> None:
        asyncio.ensure_future(threads.call(disconnect_write))
        await asyncio.to_thread(in_call.wait, 5)

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(leave_a_call_running())
        loop_stopped.set()  # the loop is stopped, not closed
        assert DatabaseThreads.wait_all_idle(timeout=5), "the call waits for a loop that will not run again"
        assert sent == [("rt.stopped", {"type": "t.n"})]
    finally:
        loop_stopped.set()
        loop.run_until_complete(asyncio.sleep(0.2))  # (before the fix: lets the stuck send run, and the thread go)
        loop.close()
