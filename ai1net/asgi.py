"""ASGI entry point (served by daphne).

HTTP goes through Django, except routes an app claims for streaming ASGI consumers (device web).
Browser WebSockets are origin-checked and session-authenticated; the device tunnel is not
origin-checked (devices are not browsers) and authenticates by its bearer token instead.
Each app contributes from its own ``routing.py``:
``websocket_urlpatterns`` (browser), ``device_websocket_urlpatterns``, ``http_urlpatterns``.
With a device-web host (ai1net.hosts), sockets are refused where that host does not serve them.

daphne caps WebSocket messages at 1 MiB (``--websocket-max-message-size`` / ``--websocket-max-frame-size``,
autobahn's ``maxMessagePayloadSize``/``maxFramePayloadSize``), and autobahn applies the cap to what it sends
too. A tunnel frame may reach ``clients.protocol.MAX_FRAME_BYTES`` (4 MiB: probe results, file writes), so
``tunnel_message_limit`` raises the cap to that for /ws/device connections only, whatever command line
started daphne; browser sockets keep daphne's 1 MiB.
"""

from __future__ import annotations

import functools
import gc
import importlib
import os
import sys
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ai1net.settings")

from ai1net.handlers import get_asgi_application  # noqa: E402 - Django's, with request threads kept

django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402
from django.urls import re_path  # noqa: E402

from ai1net import autobahn_log, connection_cycles, cpu_affinity, http_guard  # noqa: E402
from ai1net.hosts import websocket_host_guard  # noqa: E402
from ai1net.sqlite_backend import checkpoints  # noqa: E402
from clients import protocol  # noqa: E402
from clients.memory import keep_freed_memory  # noqa: E402
from devices.web import masking  # noqa: E402
from devices.web.streams import tune_tunnel_socket  # noqa: E402

ROUTED_APPS = ("ai1net.accounts", "devices", "im", "mobile", "probes")


def _collect(attribute: str) -> list:
    patterns: list = []
    for app in ROUTED_APPS:
        try:
            module = importlib.import_module(f"{app}.routing")
        except ModuleNotFoundError as exc:
            if exc.name != f"{app}.routing":
                raise
            continue
        patterns.extend(getattr(module, attribute, []))
    return patterns


def tunnel_message_limit(app: Any, size: int = protocol.MAX_FRAME_BYTES) -> Any:
    """On daphne (its ``send`` is ``partial(server.handle_reply, <autobahn protocol>)``), let the device
    tunnel's connections carry messages up to ``size`` both ways. Set before the handshake is answered:
    no frame can arrive before the consumer accepts, and it accepts authenticated devices only."""

    async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") == "websocket" and scope.get("path") == protocol.TUNNEL_PATH:
            connection = send.args[0] if isinstance(send, functools.partial) and send.args else None
            for option in ("maxMessagePayloadSize", "maxFramePayloadSize"):
                current = getattr(connection, option, None)
                if isinstance(current, int) and 0 < current < size:
                    setattr(connection, option, size)
            tune_tunnel_socket(getattr(connection, "transport", None))
        await app(scope, receive, send)

    return wrapped


# Under daphne: slowloris and oversized bodies are cut off before they reach the app (ai1net.http_guard).
http_guard.install(head_timeout=settings.HTTP_HEAD_TIMEOUT_SEC, min_body_rate=settings.HTTP_MIN_BODY_RATE,
                   max_body=max(settings.DEVICE_WEB_MAX_REQUEST_BYTES, protocol.MAX_FRAME_BYTES,
                                settings.DATA_UPLOAD_MAX_MEMORY_SIZE or 0))
# ... and a closed connection is freed as it closes, not by the cyclic collector (ai1net.connection_cycles).
connection_cycles.install()
# Device-web bodies pass through buffers of up to 1 MiB: keep freed ones mapped (clients.memory), and
# unmask what bridges send in one pass (devices.web.masking). Here, where a server loads the app, not in
# every process that sets Django up (management commands).
keep_freed_memory()
masking.install()
autobahn_log.install()  # a connection's settings pretty-printed only if its debug line is written

browser_websockets = AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(_collect("websocket_urlpatterns"))))

application = ProtocolTypeRouter(
    {
        "http": URLRouter([*_collect("http_urlpatterns"), re_path(r"", django_asgi_app)]),
        "websocket": tunnel_message_limit(websocket_host_guard(
            URLRouter([*_collect("device_websocket_urlpatterns"), re_path(r"", browser_websockets)]))),
    }
)


# The cyclic collector's thresholds in a server (Python's are (700, 10, 10)). A socket's objects outlive the young
# generation, so while sockets open the heap grows, and at Python's thresholds every 25% of growth brought a full
# collection of it, during which every socket of the process waited. Measured with gc.callbacks in daphne under
# bench/tunnel.py's connect runs (2 x 1,000 echo and 1,000 tunnel sockets kept open), three rounds each way:
# Python's: 12 full collections of 50-180 ms, 1.3-1.8 s of collecting in all, daphne 1.59-1.88 ms of CPU per
# tunnel connect; these: 17 young collections of 8-38 ms, no full one, 0.18-0.23 s, 1.45-1.68 ms per connect.
# Steady traffic leaves few survivors: under deliver -> ack no collection took over 2 ms either way.
GC_THRESHOLDS = (50_000, 20, 20)


def served_by_daphne() -> bool:
    """This process is daphne's command line (the ``daphne`` script, or ``python -m daphne``)."""
    program = sys.argv[0] if sys.argv else ""
    return os.path.basename(program) == "daphne" or program.endswith(os.path.join("daphne", "__main__.py"))


# What start-up built (Django, the apps, the URL and middleware tables) lives as long as the process:
# keep it out of the collector's full passes. A full (generation 2) collection of daphne's heap took
# 85 ms on the 2-core bench machine, and every socket and request of the process waited meanwhile
# (a p99 of its own); with the start-up heap frozen, 11 ms (bench/roundtrip.py, measured with
# gc.callbacks). Objects made later are collected as before. Only in a served process: where the app is
# imported later in a long-lived process (a test run), freezing would keep that process's garbage of the
# moment (closed loops, database connections) forever.
if served_by_daphne():
    if settings.DAPHNE_CPUS:  # first: the threads started below inherit it
        cpu_affinity.pin_process(settings.DAPHNE_CPUS)
    # The embedded database's write-ahead log is copied back by a thread of its own, not by the commit of
    # whichever request grows it past SQLite's threshold (ai1net.sqlite_backend.checkpoints).
    if settings.DATABASES["default"]["ENGINE"] == "ai1net.sqlite_backend":
        checkpoints.start(settings.DATABASES["default"]["NAME"])
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
