"""The one way events leave: ``group_send_on_commit`` (or ``channel_send_on_commit`` to one known
channel), after the current transaction commits.

Services run in worker threads (``database_sync_to_async``, Django's sync views under ASGI). Sending
with ``async_to_sync`` from there parks the worker until the event loop has run the send: with
thousands of sockets the loop is busy, and every connect's presence event held Django's one
thread-sensitive database thread for a loop turn (bench/tunnel.py). When a running event loop is
known (we are inside a worker started from it), the send is handed to that loop and the thread goes
on; sends to one group keep their order (each waits for the one before it), sends to different groups
go out side by side: a question's phone event does not wait behind its room's two (each group_send
on the Redis layer is a few round trips), and order only ever mattered within a group. Outside
any loop (management commands, sync tests) it sends synchronously, as before. Either way a failed
send is logged, never raised: the write is committed and the layer is only a doorbell.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import threading
import weakref
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from asgiref.sync import SyncToAsync, async_to_sync
from channels.exceptions import ChannelFull
from channels.layers import get_channel_layer
from django.db import transaction

logger = logging.getLogger(__name__)

# Per event loop and group: the sends handed over and not yet done, drained in order by one task per group.
_pending: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, collections.deque]] = (
    weakref.WeakKeyDictionary())
_drainers: set[asyncio.Task] = set()


# A queue's target is a group name, or one channel's name behind this prefix (":" is in no group name),
# or (DIRECT_TARGET) a direct address and a channel's name, space-separated.
CHANNEL_TARGET = "channel:"
DIRECT_TARGET = "direct:"

# Sends a message to a channel held by another process straight to that process, at a direct address the
# sender read with the channel's name (devices.web.relay's stream relay): True when it took the message.
# Registered by the app that keeps such connections; without one, or when it returns False, the layer does.
direct_sender: Callable[[str, str, dict[str, Any]], Awaitable[bool]] | None = None


def _direct(target: str) -> tuple[str, str]:
    """(address, channel name) of a DIRECT_TARGET."""
    address, _, channel = target[len(DIRECT_TARGET):].partition(" ")
    return address, channel


async def _send(target: str, message: dict[str, Any]) -> None:
    if target.startswith(DIRECT_TARGET):
        address, channel = _direct(target)
        try:
            if direct_sender is not None and await direct_sender(address, channel, message):
                return
        except Exception:
            logger.exception("could not send %s to %s directly", message.get("type"), channel)
        target = CHANNEL_TARGET + channel
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        if target.startswith(CHANNEL_TARGET):
            await layer.send(target[len(CHANNEL_TARGET):], message)
        else:
            await layer.group_send(target, message)
    except ChannelFull:  # its reader is far behind; what it is told here it also finds by reading (a doorbell)
        logger.info("channel full: %s to %s dropped", message.get("type"), target)
    except Exception:
        logger.exception("could not send %s to %s", message.get("type"), target)


# Events for people's pages (im.events, mobile.events) travel as ``app.event``; several of them waiting
# for the same group leave as one ``app.events`` layer message (a question posts a room message and its
# panel: one send, not two). Every consumer of those groups handles both types.
APP_EVENT, APP_EVENTS = "app.event", "app.events"
MAX_BATCH = 50


def _batch(queue: collections.deque) -> tuple[dict[str, Any], int]:
    """The next layer message to send for this queue and how many queued messages it covers."""
    head = queue[0]
    if head.get("type") != APP_EVENT or len(queue) == 1 or queue[1].get("type") != APP_EVENT:
        return head, 1
    events = []
    for message in queue:
        if message.get("type") != APP_EVENT or len(events) == MAX_BATCH:
            break
        events.append(message["event"])
    return {"type": APP_EVENTS, "events": events}, len(events)


async def _drain(queues: dict[str, collections.deque], group: str) -> None:
    queue = queues[group]
    try:
        while queue:
            message, count = _batch(queue)
            try:
                await _send(group, message)
            finally:  # only now: while they are queued, no second drainer starts for this group
                for _ in range(count):
                    queue.popleft()
    finally:  # emptied, or cancelled with the loop: the next hand-over starts a fresh queue and drainer
        if queues.get(group) is queue:
            del queues[group]


def _hand_over(loop: asyncio.AbstractEventLoop, group: str, message: dict[str, Any]) -> None:
    # Runs in the loop's thread, in the order the worker threads called call_soon_threadsafe.
    queues = _pending.get(loop)
    if queues is None:
        queues = _pending[loop] = {}
    queue = queues.get(group)
    if queue is None:
        queue = queues[group] = collections.deque()
    queue.append(message)
    if len(queue) == 1:  # no drainer for this group: the running one empties its queue before it ends
        task = loop.create_task(_drain(queues, group))
        _drainers.add(task)
        task.add_done_callback(_drainers.discard)


def _worker_loop() -> asyncio.AbstractEventLoop | None:
    """The running event loop that started this worker thread, if any (as asgiref's AsyncToSync finds it)."""
    if threading.current_thread() is threading.main_thread():
        return None  # e.g. sync code under a short-lived async_to_sync loop that may close before the send
    try:
        asyncio.get_running_loop()
        return None  # in a loop's own thread: not a worker
    except RuntimeError:
        pass
    if getattr(SyncToAsync.threadlocal, "main_event_loop_pid", None) != os.getpid():
        return None
    loop = getattr(SyncToAsync.threadlocal, "main_event_loop", None)
    if loop is None or loop.is_closed() or not loop.is_running():
        return None
    return loop


class LoopCalls:
    """Calls a request's thread hands to the event loop that waits for it, run by that loop when the
    thread returns (ai1net.handlers): a commit's doorbells then cost no wake-up of their own. Each
    ``call_soon_threadsafe`` from a worker wakes the loop at once, and the woken loop takes the GIL from
    the thread still finishing the request (an answer POST handed over three or four). If the waiting
    side is cancelled first (its client left), the thread hands them over itself when it is done."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.calls: list[tuple[Any, tuple]] = []
        self._lock = threading.Lock()
        self._state = "open"  # -> "done" (the thread returned) or "abandoned" (the loop stopped waiting)

    def thread_done(self) -> None:
        """In the thread, last: the loop runs the calls when it resumes, or (abandoned) they go now."""
        with self._lock:
            abandoned, self._state = self._state == "abandoned", "done"
        if abandoned:
            try:
                self.loop.call_soon_threadsafe(self.run)  # the lot in one wake-up, in their order
            except RuntimeError:  # the loop closed: nothing runs there any more (doorbells only)
                pass

    def run(self) -> None:
        """In the loop, once the thread's result is in."""
        calls, self.calls = self.calls, []
        for callback, args in calls:
            try:
                callback(*args)
            except Exception:
                logger.exception("a deferred loop call failed: %r", callback)

    def abandon(self) -> None:
        """In the loop, when it stops waiting for the thread (cancelled)."""
        with self._lock:
            done, self._state = self._state == "done", "abandoned"
        if done:
            self.run()


_local = threading.local()


@contextlib.contextmanager
def loop_calls_collected(calls: LoopCalls) -> Iterator[None]:
    """In a request's thread: ``call_in_loop(calls.loop, ...)`` collects into ``calls`` meanwhile."""
    outer, _local.calls = getattr(_local, "calls", None), calls
    try:
        yield
    finally:
        _local.calls = outer
        calls.thread_done()


async def run_collected(calls: LoopCalls, to_async: Callable[[Callable], Callable[..., Awaitable]], func: Callable,
                        *args: Any, **kwargs: Any) -> Any:
    """``await to_async(func)(*args, **kwargs)`` (sync_to_async, database_sync_to_async ...) with the
    thread's calls to ``calls.loop`` (``call_in_loop``) collected in ``calls``, for the caller to
    ``run()`` on the loop when it suits it: one wake-up for the lot."""

    def collected() -> Any:
        with loop_calls_collected(calls):
            return func(*args, **kwargs)

    try:
        return await to_async(collected)()
    except BaseException:
        calls.abandon()  # failed (they run now) or cancelled (the thread hands them over when done)
        raise


def collecting(to_async: Callable[[Callable], Callable[..., Awaitable]], func: Callable) -> Callable[..., Awaitable]:
    """``to_async(func)`` whose calls to this loop from the thread run as soon as the loop has the
    thread's result (``run_collected``)."""

    async def call(*args: Any, **kwargs: Any) -> Any:
        calls = LoopCalls(asyncio.get_running_loop())
        result = await run_collected(calls, to_async, func, *args, **kwargs)
        calls.run()
        return result

    return call


def call_in_loop(loop: asyncio.AbstractEventLoop, callback: Any, *args: Any) -> None:
    """``loop.call_soon_threadsafe(callback, *args)`` from a worker thread, deferred to the end of the
    request when its thread collects them (``loop_calls_collected``). RuntimeError: the loop is closed."""
    calls = getattr(_local, "calls", None)
    if calls is not None and calls.loop is loop:  # (abandoned too: they keep their order)
        calls.calls.append((callback, args))
        return
    loop.call_soon_threadsafe(callback, *args)


def group_send_now(group: str, message: dict[str, Any]) -> None:
    """Send at once from sync code: handed to the worker's event loop, or synchronously outside any.
    ``group`` may be ``CHANNEL_TARGET + channel name``: then to that one channel."""
    loop = _worker_loop()
    if loop is not None:
        try:
            call_in_loop(loop, _hand_over, loop, group, message)
            return
        except RuntimeError:  # the loop closed meanwhile
            pass
    if group.startswith(DIRECT_TARGET):  # no daphne loop here to keep a direct connection on: the layer
        group = CHANNEL_TARGET + _direct(group)[1]
    # asgiref's async_to_sync schedules the send on the loop that started this thread whenever one is known,
    # running or not, and waits for it: a loop that has stopped (a call outlived its caller's loop, at a
    # test's end or daphne's shutdown) never runs it, and the thread waited forever. Such a send gets a loop
    # of its own.
    known = getattr(SyncToAsync.threadlocal, "main_event_loop", None)
    try:
        async_to_sync(_send, force_new_loop=known is not None and not known.is_running())(group, message)
    except Exception:
        logger.exception("could not send %s to %s", message.get("type"), group)


def group_send_on_commit(group: str, message: dict[str, Any]) -> None:
    """Send ``message`` to ``group`` once the current transaction commits (at once outside one)."""
    transaction.on_commit(lambda: group_send_now(group, message))


def channel_send_on_commit(channel: str, message: dict[str, Any], *, direct: str = "") -> None:
    """Send ``message`` to one channel once the current transaction commits (at once outside one): a
    single layer command, where a group send is several (its members are read first). ``direct``: the
    address where ``direct_sender`` reaches the process that holds the channel ("" for none)."""
    target = f"{DIRECT_TARGET}{direct} {channel}" if direct and direct_sender is not None else CHANNEL_TARGET + channel
    transaction.on_commit(lambda: group_send_now(target, message))
