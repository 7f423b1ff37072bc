"""Off the hot path: a new question only drops the user's id here (after commit, microseconds); a
background thread sends at most one notice per user per ``NOTIFY_COALESCE_SEC``, on a small pool.

The first question sends at once; more questions within the window are merged into one send at its end,
which reads the count then. Coalescing is per process (the process that stored the question).
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connection

logger = logging.getLogger(__name__)


class Dispatcher:
    def __init__(self, *, workers: int = 2) -> None:
        self._lock = threading.Condition()
        self._heap: list[tuple[float, Any]] = []
        self._due: dict[Any, float] = {}  # user id -> when its scheduled send runs
        self._last: dict[Any, float] = {}  # user id -> when its last send started
        self._workers = workers
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None

    def waiting(self, user_id: Any) -> None:
        """A question for ``user_id`` was stored. Never blocks, never raises."""
        try:
            with self._lock:
                if user_id in self._due:
                    return  # a send is already scheduled: it will read the count then
                now = time.monotonic()
                last = self._last.get(user_id)
                due = now if last is None else max(now, last + settings.NOTIFY_COALESCE_SEC)
                self._due[user_id] = due
                heapq.heappush(self._heap, (due, user_id))
                self._start()
                self._lock.notify()
        except Exception:  # noqa: BLE001 - a notice must never break the question that caused it
            logger.exception("notify: could not schedule a notice")

    def waiting_for_device(self, device_id: Any) -> None:
        """The same, when only the question's device is known: its owner is looked up in the pool."""
        try:
            with self._lock:
                self._start()
                assert self._pool is not None
                self._pool.submit(self._device_owner_waiting, device_id)
        except Exception:  # noqa: BLE001 - as in waiting()
            logger.exception("notify: could not schedule a notice")

    def _device_owner_waiting(self, device_id: Any) -> None:
        from devices.models import Device

        close_old_connections()
        try:
            owner_id = Device.objects.filter(pk=device_id).values_list("owner_id", flat=True).first()
        except Exception:  # noqa: BLE001 - a background lookup reports in the log, never to a caller
            logger.exception("notify: looking up a device's owner failed")
            return
        finally:
            connection.close()
        if owner_id is not None:
            self.waiting(owner_id)

    def _start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._pool = ThreadPoolExecutor(max_workers=self._workers, thread_name_prefix="notify-send")
            self._thread = threading.Thread(target=self._loop, name="notify-dispatch", daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Drop the sends not yet due, stop the thread and wait for the sends running. A later notice starts
        the dispatcher afresh. Tests close theirs so that no send of one test runs in the next."""
        with self._lock:
            self._heap.clear()
            self._due.clear()
            thread, pool = self._thread, self._pool
            self._thread = self._pool = None
            self._lock.notify_all()
        if thread is not None:
            thread.join()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def _loop(self) -> None:
        me = threading.current_thread()
        while True:
            with self._lock:
                while self._thread is me and (not self._heap or self._heap[0][0] > time.monotonic()):
                    self._lock.wait(None if not self._heap else self._heap[0][0] - time.monotonic())
                if self._thread is not me:
                    return  # closed
                _due, user_id = heapq.heappop(self._heap)
                del self._due[user_id]
                now = time.monotonic()
                # Forget users whose window has passed, so the map stays small.
                window = settings.NOTIFY_COALESCE_SEC
                for stale in [uid for uid, at in self._last.items() if now - at > window and uid not in self._due]:
                    del self._last[stale]
                self._last[user_id] = now
                assert self._pool is not None
                self._pool.submit(send_waiting, user_id)


def send_waiting(user_id: Any) -> dict | None:
    """Run one send for ``user_id`` in this thread; log and swallow any failure; release the connection."""
    from notify import services

    close_old_connections()
    try:
        return services.notify_user_waiting(user_id=user_id)
    except Exception:  # noqa: BLE001 - a background send reports in the log, never to a caller
        logger.exception("notify: sending a notice failed")
        return None
    finally:
        connection.close()


dispatcher = Dispatcher()
