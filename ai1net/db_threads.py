"""A few threads of their own for short database calls made from an event loop.

``await threads.call(func, *args, **kwargs)`` runs ``func`` in one of the threads, with Django's
connection housekeeping around it as ``channels.db.database_sync_to_async`` does, and settles the
caller's future on the loop. It does what ``DatabaseSyncToAsync(..., executor=ThreadPoolExecutor())``
did for the tunnel with less machinery between the loop and the thread: a ``queue.SimpleQueue`` in,
``call_soon_threadsafe`` out, and no ``concurrent.futures.Future`` (a lock and a condition each), no
executor semaphore, no ``shield`` or ``wrap_future`` chain. ``bench/db_hop.py`` (3 rounds of 20,000 hops
of a trivial function): 74-82 µs of CPU per hop that way with 50 in flight, as in a reconnect storm, and
24-33 µs this way; 157-164 against 99-115 µs one at a time.

What a worker thread of asgiref's provides and our services rely on is kept: the caller's context
variables are visible to ``func``, and the thread knows the loop that called it
(``SyncToAsync.threadlocal``), so ``ai1net.realtime`` hands a send to that loop instead of blocking the
thread on ``async_to_sync``. Changes ``func`` makes to context variables stay in the thread's copy.
A caller that is cancelled stops waiting; ``func`` still runs to its end, as a thread cannot be stopped.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import os
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any

from asgiref.sync import SyncToAsync
from django.conf import settings
from django.db import close_old_connections

logger = logging.getLogger(__name__)

_Call = tuple[asyncio.AbstractEventLoop, asyncio.Future, contextvars.Context, Callable[..., Any], tuple, dict]


def default_count() -> int:
    """One thread on SQLite: it takes one writer at a time anyway, and more threads only traded the GIL
    between them (a tunnel connect cost 2.6-3.5 ms of daphne CPU with one, 3.6-3.9 with four, in three
    interleaved rounds of bench/tunnel.py). Four on PostgreSQL, which answers several at once."""
    return 1 if "sqlite" in settings.DATABASES["default"]["ENGINE"] else 4


class DatabaseThreads:
    _all: weakref.WeakSet[DatabaseThreads] = weakref.WeakSet()

    def __init__(self, count: int, name: str) -> None:
        self.count, self.name = count, name
        self._calls: queue.SimpleQueue[_Call] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._start_lock = threading.Lock()
        self._pending = 0  # calls queued or running
        self._idle = threading.Condition()
        DatabaseThreads._all.add(self)

    async def call(self, func: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if len(self._threads) < self.count:
            self._start()
        with self._idle:
            self._pending += 1
        self._calls.put((loop, future, contextvars.copy_context(), func, args, kwargs))
        return await future

    def to_async(self, func: Callable[..., Any]) -> Callable[..., Any]:
        """``func`` as a coroutine function that runs it in these threads, as ``database_sync_to_async(func)``
        does in Channels' (what ``ai1net.realtime.collecting`` takes)."""
        return functools.partial(self.call, func)

    @classmethod
    def wait_all_idle(cls, timeout: float) -> bool:
        """Wait until no call is queued or running in any of them (a caller that stopped waiting does not
        stop its call); False when ``timeout`` seconds passed first. Tests use it before their database is
        emptied, which would otherwise race a write still under way."""
        for threads in list(cls._all):
            with threads._idle:
                if not threads._idle.wait_for(lambda t=threads: t._pending == 0, timeout):
                    return False
        return True

    def _start(self) -> None:
        with self._start_lock:
            while len(self._threads) < self.count:
                thread = threading.Thread(target=self._work, name=f"{self.name}_{len(self._threads)}", daemon=True)
                thread.start()
                self._threads.append(thread)

    def _work(self) -> None:
        local, pid = SyncToAsync.threadlocal, os.getpid()
        # Django's housekeeping after each call (close_old_connections) left this thread's connections as the
        # next call would find them: nothing else runs here in between. So it runs again before a call only
        # when it failed after the last one (a connection an error left unusable that could not be closed).
        # A pooled connection (PostgreSQL) is back in its pool by then; one kept for CONN_MAX_AGE is closed
        # after the call that ends past its age, as Django's request_finished does for a request.
        tidy = True
        while True:
            loop, future, context, func, args, kwargs = self._calls.get()
            local.main_event_loop, local.main_event_loop_pid = loop, pid
            result: Any = None
            error: BaseException | None = None
            try:
                if not tidy:
                    close_old_connections()
                result = context.run(func, *args, **kwargs)
            except BaseException as exc:  # handed to the caller, whatever it is
                error = exc
            finally:
                tidy = False
                try:
                    close_old_connections()
                    tidy = True
                except Exception as exc:  # noqa: BLE001 - the caller hears of it
                    error = error or exc
            try:
                loop.call_soon_threadsafe(_settle, future, result, error)
            except RuntimeError:  # the loop closed meanwhile: nobody waits
                logger.debug("%s: the loop closed before %r returned", self.name, func)
            with self._idle:
                self._pending -= 1
                if not self._pending:
                    self._idle.notify_all()
            del loop, future, context, func, args, kwargs, result, error


def _settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.done():  # the caller was cancelled
        return
    if isinstance(error, StopIteration):  # a future refuses it (TypeError), which would leave the caller waiting
        wrapped = RuntimeError(f"{type(error).__name__} raised in a database thread")
        wrapped.__cause__ = error
        error = wrapped
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
