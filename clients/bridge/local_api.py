"""The daemon's loopback HTTP API, used by the `hook` command.

Binds 127.0.0.1 only. Every request must carry the local secret (`X-AI1NET-Secret`, compared in
constant time) from `<home>/local.json` (mode 0600); a request with a browser `Origin` header or a
`Host` other than 127.0.0.1:<port> / localhost:<port> is refused (403) so that a web page cannot
reach it (DNS rebinding, cross-site POSTs). Requests are served in threads; each one is handed to the
daemon's asyncio loop (`backend(route, body)` coroutine) and waits for its result.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import secrets
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Awaitable, Callable, Dict, Optional

from clients import protocol

log = logging.getLogger("ai1net.bridge.local_api")

MAX_BODY_BYTES = 1024 * 1024
MAX_WAIT_SEC = 3600.0  # the longest "timeout" of a request body that the call waits for
# A request's line, headers and body must all arrive within this; a client that sends them a byte at a time
# (slowloris) or goes quiet is cut off, so it cannot hold a thread and a socket for ever. The hook sends
# its request in one write.
REQUEST_READ_SEC = 5.0
SECRET_HEADER = "X-AI1NET-Secret"
Backend = Callable[[str, Dict[str, Any]], Awaitable[Dict[str, Any]]]


class RequestRefused(Exception):
    """A backend error with an HTTP status (404 unknown route, 400 bad body)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def read_local_info(home: Path) -> Optional[Dict[str, Any]]:
    try:
        return json.loads((Path(home) / "local.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def write_private_json(path: Path, data: Dict[str, Any]) -> None:
    """Atomically write `data` to `path` with mode 0600."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(str(tmp), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(data, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # Every waiting hook reconnects at once when the daemon restarts; socketserver's backlog of 5 dropped
    # the rest of the burst's SYNs, and the kernel's retries (1, 3, 7, 15 s ...) held answers back ~25 s.
    request_queue_size = 512
    api: LocalApi

    def handle_error(self, request: Any, client_address: Any) -> None:
        # socketserver prints the traceback to stderr; the daemon's log is where it gets read.
        if isinstance(sys.exc_info()[1], OSError):  # the client went away mid-answer (a hook that gave up)
            log.info("local api: connection from %s lost", client_address, exc_info=True)
        else:
            log.exception("local api: request from %s failed", client_address)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    server_version = "ai1net-bridge"
    sys_version = ""
    timeout = REQUEST_READ_SEC  # set on the socket: a silent (or idle keep-alive) client is closed
    _reading = False

    def handle_one_request(self) -> None:
        # The socket timeout counts from the last byte; this deadline counts from the request's first.
        self._reading = True
        deadline = threading.Timer(REQUEST_READ_SEC, self._cut_off)
        deadline.daemon = True
        deadline.start()
        try:
            super().handle_one_request()
        finally:
            deadline.cancel()

    def _cut_off(self) -> None:
        if self._reading:
            log.debug("local api: request not read within %s s; connection closed", REQUEST_READ_SEC)
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's signature
        log.debug("local api: " + format, *args)

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        self._serve(read_body=False)

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        self._serve(read_body=True)

    def do_PUT(self) -> None:  # noqa: N802 - the stdlib's name
        self._reply(405, {"error": "method_not_allowed"})

    do_DELETE = do_PUT
    do_PATCH = do_PUT

    def _serve(self, *, read_body: bool) -> None:
        api = self.server.api
        refusal = api.refusal(self.headers)
        if refusal:
            status, code = refusal
            self._reply(status, {"error": code}, drain=read_body)
            return
        body: Dict[str, Any] = {}
        if read_body:
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if length < 0 or length > MAX_BODY_BYTES:
                self.close_connection = True
                self._reply(413 if length > 0 else 400, {"error": "bad_length"})
                return
            raw = self.rfile.read(length) if length else b"{}"
            try:
                body = protocol.loads(raw)  # NaN and Infinity are not JSON
            except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
                self._reply(400, {"error": "bad_json"})
                return
            if not isinstance(body, dict):
                self._reply(400, {"error": "bad_json"})
                return
        self._reading = False  # read whole: the backend may take its time
        path = self.path.split("?", 1)[0]
        if not path.startswith("/v1/"):
            self._reply(404, {"error": "not_found"})
            return
        try:
            result = api.call(path[len("/v1/") :], body)
        except RequestRefused as exc:
            self._reply(exc.status, {"error": str(exc)})
            return
        except Exception:
            log.exception("local api %s failed", path)
            self._reply(500, {"error": "internal"})
            return
        self._reply(200, result)

    def _reply(self, status: int, body: Dict[str, Any], drain: bool = False) -> None:
        if drain:
            self.close_connection = True
        data = json.dumps(body).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(data)


class LocalApi:
    """`start()` binds and writes local.json; `stop()` shuts down. `backend` runs in `loop`."""

    def __init__(
        self,
        home: Path,
        backend: Backend,
        loop: Optional[asyncio.AbstractEventLoop] = None,
        *,
        port: Optional[int] = None,
        call_timeout: float = 60.0,
    ) -> None:
        self.home = Path(home)
        self.backend = backend
        self.loop = loop
        self.call_timeout = call_timeout
        self.requested_port = port
        self.port = 0
        self.secret = ""
        self._server: Optional[_Server] = None
        self._thread: Optional[threading.Thread] = None

    def start(self) -> int:
        if self.loop is None:
            self.loop = asyncio.get_running_loop()
        previous = read_local_info(self.home) or {}
        # Keep the secret (and, when free, the port) across restarts so that a hook waiting through a
        # daemon restart can carry on.
        secret = previous.get("secret")
        self.secret = secret if isinstance(secret, str) and len(secret) >= 32 else secrets.token_urlsafe(32)
        candidates = [self.requested_port] if self.requested_port is not None else [previous.get("port"), 0]
        last_error: Optional[OSError] = None
        for candidate in candidates:
            if not isinstance(candidate, int):
                continue
            try:
                self._server = _Server(("127.0.0.1", candidate), _Handler)
                break
            except OSError as exc:
                last_error = exc
        if self._server is None:
            raise last_error or OSError("could not bind the local API")
        self._server.api = self
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, name="ai1net-local-api", daemon=True
        )
        self._thread.start()
        write_private_json(self.home / "local.json", {"port": self.port, "secret": self.secret, "pid": os.getpid()})
        return self.port

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def refusal(self, headers: Any) -> Optional[tuple]:
        if headers.get("Origin") is not None:
            return 403, "origin_refused"
        host = (headers.get("Host") or "").strip().lower()
        if host not in (f"127.0.0.1:{self.port}", f"localhost:{self.port}"):
            return 403, "host_refused"
        given = headers.get(SECRET_HEADER) or ""
        if not hmac.compare_digest(given.encode("utf-8", "replace"), self.secret.encode("utf-8")):
            return 401, "bad_secret"
        return None

    def call(self, route: str, body: Dict[str, Any]) -> Dict[str, Any]:
        assert self.loop is not None
        wait = body.get("timeout")
        # Capped: the backend waits at most a minute anyway, and a wait of 1e300 s overflowed the clock (a 500).
        limit = self.call_timeout + (min(float(wait), MAX_WAIT_SEC) if isinstance(wait, (int, float)) and wait > 0
                                     else 0)
        future = asyncio.run_coroutine_threadsafe(self.backend(route, body), self.loop)
        try:
            return future.result(timeout=limit)
        except BaseException:
            future.cancel()
            raise
