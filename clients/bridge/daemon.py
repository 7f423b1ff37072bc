"""The bridge daemon core: the credential, the tunnel, and an on-disk inbox of delivered items.

Every ``deliver`` is stored in ``<home>/bridge.sqlite3`` together with the new applied seq, in one
SQLite transaction, before it is acked: a crash at any point replays nothing twice and loses nothing
(the platform resends what was not acked; the inbox skips what it already holds). Then the item goes
to the handler registered for its kind; items of unknown kinds are stored and acked all the same.

Other parts of the bridge plug in through this module (import it, then call at import time):
``register_kind(kind, handler)``, ``register_method(name, handler)``, ``on_startup(hook)``,
``add_capability(name)``. Modules named in ``EXTENSIONS`` are imported when the daemon starts.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import os
import signal
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, Dict, List, Optional, TextIO, Tuple

from clients import masking
from clients.bridge import __version__
from clients.common.credentials import Credential
from clients.common.tunnel import FinalCloseError, MethodNotFound, Tunnel

log = logging.getLogger("ai1net.bridge")

INBOX_FILE = "bridge.sqlite3"
PID_FILE = "bridge.pid"
EXIT_FINAL = 3  # the platform refused this device for good (revoked / unknown token)
EXTENSIONS = ("clients.bridge.mobile", "clients.bridge.web")  # optional daemon parts, imported if present

KindHandler = Callable[["BridgeDaemon", int, Dict[str, Any]], Awaitable[None]]
MethodHandler = Callable[["BridgeDaemon", Dict[str, Any]], Awaitable[Optional[Dict[str, Any]]]]
StartupHook = Callable[["BridgeDaemon"], Awaitable[None]]
NotificationHandler = Callable[["BridgeDaemon", Dict[str, Any]], None]

_kind_handlers: Dict[str, KindHandler] = {}
_method_handlers: Dict[str, MethodHandler] = {}
_notification_handlers: Dict[str, NotificationHandler] = {}
_startup_hooks: List[StartupHook] = []
_capabilities: List[str] = []


def register_kind(kind: str, handler: KindHandler) -> None:
    """``await handler(daemon, seq, payload)`` for each new delivered item of ``kind``, in seq order.
    It runs after the item is stored; one that crashed mid-way is run again when the daemon restarts,
    so make it idempotent (key on the payload's own id)."""
    _kind_handlers[kind] = handler


def register_method(name: str, handler: MethodHandler) -> None:
    """``await handler(daemon, params) -> dict`` answers the platform's JSON-RPC request ``name``."""
    _method_handlers[name] = handler


def register_notification(name: str, handler: NotificationHandler) -> None:
    """``handler(daemon, params)`` for the platform's notification ``name`` (sync: it must not block
    the tunnel's reader; start a task for real work)."""
    _notification_handlers[name] = handler


def on_startup(hook: StartupHook) -> None:
    """``await hook(daemon)`` once the inbox is open and before the tunnel connects; start background
    work with ``daemon.spawn(coro)`` (cancelled when the daemon stops)."""
    _startup_hooks.append(hook)


def add_capability(name: str) -> None:
    if name not in _capabilities:
        _capabilities.append(name)


def load_extensions() -> None:
    for name in EXTENSIONS:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise


async def _ping(daemon: BridgeDaemon, params: Dict[str, Any]) -> Dict[str, Any]:
    return {"pong": True, "version": __version__}


register_method("bridge.ping", _ping)


class Inbox:
    """Delivered outbox items by (device, seq), stored exactly once, and the applied seq per device
    (a new pairing is a new device whose seqs start again at 1)."""

    def __init__(self, path: Path, device_id: str) -> None:
        self.path = Path(path)
        self.device_id = device_id
        fresh = not self.path.exists()
        self.db = sqlite3.connect(str(self.path), isolation_level=None, timeout=30)
        if fresh:
            os.chmod(self.path, 0o600)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL survives a crash of this process
        self.db.executescript(
            """
            CREATE TABLE IF NOT EXISTS inbox (
                device_id TEXT NOT NULL, seq INTEGER NOT NULL, kind TEXT NOT NULL, payload TEXT NOT NULL,
                received_at REAL NOT NULL, handled_at REAL, error TEXT, PRIMARY KEY (device_id, seq));
            CREATE TABLE IF NOT EXISTS applied (device_id TEXT PRIMARY KEY, seq INTEGER NOT NULL);
            """
        )
        row = self.db.execute("SELECT seq FROM applied WHERE device_id = ?", (device_id,)).fetchone()
        self._applied = int(row[0]) if row else 0

    def applied_seq(self) -> int:
        return self._applied

    def record(self, seq: int, kind: str, payload: Dict[str, Any]) -> bool:
        """Store the item and advance the applied seq atomically; False if it was already applied."""
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            row = db.execute("SELECT seq FROM applied WHERE device_id = ?", (self.device_id,)).fetchone()
            if row and seq <= row[0]:
                db.execute("ROLLBACK")
                self._applied = int(row[0])
                return False
            db.execute(
                "INSERT INTO inbox (device_id, seq, kind, payload, received_at) VALUES (?, ?, ?, ?, ?)",
                (self.device_id, seq, kind, json.dumps(payload, ensure_ascii=False), time.time()),
            )
            db.execute(
                "INSERT INTO applied (device_id, seq) VALUES (?, ?) "
                "ON CONFLICT(device_id) DO UPDATE SET seq = excluded.seq",
                (self.device_id, seq),
            )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        self._applied = seq
        return True

    def mark_handled(self, seq: int, error: Optional[str] = None) -> None:
        self.db.execute(
            "UPDATE inbox SET handled_at = ?, error = ? WHERE device_id = ? AND seq = ?",
            (time.time(), error, self.device_id, seq),
        )

    def unhandled(self) -> List[Tuple[int, str, Dict[str, Any]]]:
        rows = self.db.execute(
            "SELECT seq, kind, payload FROM inbox WHERE device_id = ? AND handled_at IS NULL ORDER BY seq",
            (self.device_id,),
        ).fetchall()
        return [(int(seq), kind, json.loads(payload)) for seq, kind, payload in rows]

    def items(self) -> List[Tuple[int, str, Dict[str, Any]]]:
        rows = self.db.execute(
            "SELECT seq, kind, payload FROM inbox WHERE device_id = ? ORDER BY rowid", (self.device_id,)
        ).fetchall()
        return [(int(seq), kind, json.loads(payload)) for seq, kind, payload in rows]

    def prune(self, *, older_than_sec: float = 7 * 86400) -> int:
        """Forget handled items after a while; the applied seq lives in its own table, so resume is kept."""
        cursor = self.db.execute(
            "DELETE FROM inbox WHERE handled_at IS NOT NULL AND received_at < ?", (time.time() - older_than_sec,)
        )
        return cursor.rowcount

    def close(self) -> None:
        self.db.close()


class PidLock:
    """``<home>/bridge.pid``: holds the running daemon's pid under an exclusive lock, so a second
    daemon on the same home refuses to start and a stale file (after kill -9) is never mistaken."""

    def __init__(self, home: Path) -> None:
        self.path = Path(home) / PID_FILE
        self._handle: Optional[Any] = None

    def acquire(self) -> bool:
        handle = open(self.path, "a+")  # noqa: SIM115 - held open for the daemon's lifetime
        if not _try_lock(handle, exclusive=True):
            handle.close()
            return False
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._handle = handle
        return True

    def release(self) -> None:
        if self._handle is not None:
            try:
                self.path.unlink()
            except OSError:
                pass
            self._handle.close()
            self._handle = None


def running_pid(home: Path) -> Optional[int]:
    """The pid of the daemon running on ``home``, or None."""
    path = Path(home) / PID_FILE
    try:
        handle = open(path)  # noqa: SIM115
    except OSError:
        return None
    with handle:
        text = handle.read().strip()
        if _try_lock(handle, exclusive=False):
            return None  # nobody holds it: a stale file
        try:
            return int(text)
        except ValueError:
            return None


def _try_lock(handle: Any, *, exclusive: bool) -> bool:
    try:
        import fcntl
    except ImportError:  # Windows: no advisory locks here; trust the file
        return True
    try:
        fcntl.flock(handle.fileno(), (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except OSError:
        return False
    if not exclusive:
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
    return True


class BridgeDaemon:
    def __init__(self, home: Path, credential: Credential, *, err: TextIO = sys.stderr,
                 expose: Optional[List[int]] = None) -> None:
        self.home = Path(home)
        self.expose = sorted(set(expose or []))  # device web: local ports the platform may reach
        self.credential = credential
        self.err = err
        self.inbox: Optional[Inbox] = None
        self.tunnel: Optional[Tunnel] = None
        self._background: List[asyncio.Future] = []

    def spawn(self, coro: Awaitable[Any]) -> asyncio.Future:
        task = asyncio.ensure_future(coro)
        self._background.append(task)
        return task

    def stop(self) -> None:
        if self.tunnel is not None:
            self.tunnel.stop()

    async def call(self, method: str, params: Optional[Dict[str, Any]] = None, timeout: float = 30.0) -> Any:
        """Device -> platform request through the tunnel (retried with the same id across reconnects)."""
        assert self.tunnel is not None, "the daemon is not running"
        return await self.tunnel.call(method, params or {}, timeout=timeout)

    async def run(self) -> int:
        load_extensions()
        self._handler_lock = asyncio.Lock()
        self.inbox = Inbox(self.home / INBOX_FILE, self.credential.device_id)
        self.inbox.prune()
        self.tunnel = Tunnel(
            self.credential.url,
            self.credential.token,
            hello={
                "kind": "bridge",
                "version": __version__,
                "capabilities": list(_capabilities),
                "ports": list(self.expose),
                "roots": [],
            },
            applied_seq=self.inbox.applied_seq,
            on_deliver=self._on_deliver,
            on_request=self._on_request,
            on_notification=self._on_notification,
            user_agent=f"ai1net-bridge/{__version__}",
            longpoll=True,  # falls back to HTTP long polling where WebSockets are blocked
        )
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(signum, self.stop)
            except (NotImplementedError, RuntimeError):  # Windows
                pass
        try:
            for hook in _startup_hooks:
                await hook(self)
            for seq, kind, payload in self.inbox.unhandled():
                await self._handle(seq, kind, payload)  # stored before a crash, never handled
            log.info("bridge %s: device %s -> %s (WebSocket masking: %s)", __version__, self.credential.device_id,
                     self.tunnel.ws_url, masking.mode())
            await self.tunnel.run()
            return 0
        except FinalCloseError as exc:
            print(f"ai1net-bridge: stopped: {exc.reason} (close code {exc.code})", file=self.err, flush=True)
            return EXIT_FINAL
        finally:
            for task in self._background:
                task.cancel()
            await asyncio.gather(*self._background, return_exceptions=True)
            self.inbox.close()

    async def _on_deliver(self, seq: int, kind: str, payload: Dict[str, Any]) -> None:
        assert self.inbox is not None
        if self.inbox.record(seq, kind, payload):
            # Shielded: a dropped connection must not cut a handler off half-way (the item is already
            # stored as applied, so nothing would run it again before a restart).
            await asyncio.shield(self._handle(seq, kind, payload))

    async def _handle(self, seq: int, kind: str, payload: Dict[str, Any]) -> None:
        async with self._handler_lock:  # in seq order, even across a reconnect
            await self._run_handler(seq, kind, payload)

    async def _run_handler(self, seq: int, kind: str, payload: Dict[str, Any]) -> None:
        assert self.inbox is not None
        handler = _kind_handlers.get(kind)
        error = None
        if handler is not None:
            try:
                await handler(self, seq, payload)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a handler bug must not stall the tunnel; it is on record
                log.exception("handling %s #%s failed", kind, seq)
                error = f"{type(exc).__name__}: {exc}"
        self.inbox.mark_handled(seq, error)

    def _on_notification(self, method: str, params: Dict[str, Any]) -> None:
        handler = _notification_handlers.get(method)
        if handler is not None:
            handler(self, params)

    async def _on_request(self, method: str, params: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        handler = _method_handlers.get(method)
        if handler is None:
            raise MethodNotFound(method)
        return await handler(self, params)
