"""The SQLite write-ahead log checkpointed from a thread of its own, not by whichever commit crosses 1,000 pages.

In WAL mode SQLite copies the log back into the database file (a checkpoint, with ``synchronous=NORMAL``
the only step that syncs to disk) on the commit that grows the log past ``wal_autocheckpoint`` pages. That
commit is somebody's request: on the 2-core bench machine one such commit took 2.9-4.5 ms against 0.015 ms
for the others (a bare sqlite3 loop of 2,000 one-row commits). In ``bench/tunnel.py``, whose deliver -> ack
sample commits twice, its p99 was 4.1-6.1 ms with them (4.8-7.2x the echo's) and 2.2-3.0 ms (2.9-3.4x) with
this thread, in interleaved runs.

``start(path)`` runs ``PRAGMA wal_checkpoint(PASSIVE)`` every ``INTERVAL_SEC`` on a connection of its own
when something was committed since its last one (``data_version``). PASSIVE copies what no reader still
needs and never waits for a writer or a reader. While it runs, the backend's new connections in this
process get ``wal_autocheckpoint = BACKSTOP_PAGES``: a commit checkpoints only if the thread has fallen
that far behind, so the log stays bounded. Started where a server loads the app (``ai1net.asgi``); management
commands and test runs keep SQLite's default.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading

logger = logging.getLogger(__name__)

INTERVAL_SEC = 0.25
BACKSTOP_PAGES = 10_000  # ~40 MiB of 4 KiB pages; SQLite's own default is 1,000

_lock = threading.Lock()
_running: dict[str, Checkpointer] = {}


class Checkpointer:
    def __init__(self, path: str, interval: float = INTERVAL_SEC) -> None:
        self.path = path
        self.interval = interval
        self.passes = 0  # looks at the database (one per interval)
        self.checkpoints = 0  # checkpoints run (something had been committed)
        self._seen: int | None = None  # the database's data_version when the last checkpoint began
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sqlite-checkpoint", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        try:
            connection = sqlite3.connect(self.path, timeout=1.0, isolation_level=None, check_same_thread=True)
        except sqlite3.Error:  # commits checkpoint by themselves, as SQLite does by default (running_for)
            logger.warning("no checkpoint thread for %s", self.path, exc_info=True)
            return
        try:
            while not self._stop.wait(self.interval):
                self.passes += 1
                try:
                    # Changes whenever another connection commits (a read of the shared memory, no I/O).
                    state = connection.execute("PRAGMA data_version").fetchone()[0]
                    if state == self._seen:
                        continue  # nothing committed since the last checkpoint
                    connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                    self.checkpoints += 1
                except sqlite3.Error:  # busy or locked for the moment: the next pass tries again
                    logger.debug("checkpoint of %s skipped", self.path, exc_info=True)
                    continue
                self._seen = state
        finally:
            connection.close()


def start(path: str | os.PathLike, interval: float = INTERVAL_SEC) -> Checkpointer | None:
    """Checkpoint ``path``'s log from a thread (once per path and process); None for in-memory databases."""
    path = str(path)
    if not path or path == ":memory:" or path.startswith("file:"):
        return None
    path = os.path.abspath(path)
    with _lock:
        if path not in _running:
            checkpointer = Checkpointer(path, interval)
            checkpointer.start()
            _running[path] = checkpointer
        return _running[path]


def stop(path: str | os.PathLike) -> None:
    with _lock:
        checkpointer = _running.pop(os.path.abspath(path), None)
    if checkpointer is not None:
        checkpointer.stop()


def running_for(path: str | os.PathLike) -> bool:
    """A thread of this process checkpoints ``path``'s log."""
    checkpointer = _running.get(os.path.abspath(str(path))) if path else None
    return checkpointer is not None and checkpointer.alive()
