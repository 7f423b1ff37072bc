"""A closed connection of daphne's leaves no reference cycle behind, so it is freed as it closes.

Left alone, each closed WebSocket left about 90 objects in cycles (a device tunnel about 125): Twisted keeps an
upgraded request in its HTTP channel's list while the request points back at the channel, and autobahn resolves
a protocol's ``is_closed`` Deferred with the protocol itself. Only the cyclic collector frees such objects, and
by the time a connection closes they have aged into its older generations: after 3,000 sockets closed, daphne
stopped for 230-260 ms in one collection (``bench/tunnel.py``'s connect runs, gc.callbacks in daphne), every
other socket and request of the process waiting meanwhile, and the collector's work on them cost a connect
storm run after it about 8% of its rate.

``install()`` (under daphne; idempotent) breaks both where the connection is done with them:

- a request handed over to a WebSocket leaves its HTTP channel's list of requests (the channel receives
  nothing more: the socket's bytes go to the WebSocket protocol from then on);
- a WebSocket protocol drops its resolved ``is_closed`` once the connection is lost (daphne never reads it).

Our own per-connection objects keep no cycles either (ai1net.http_guard's channel mixin, the tunnel consumer's
tasks). ``tests/test_connection_cycles.py`` counts what the collector finds in a real daphne after sockets close.
"""

from __future__ import annotations

import sys
from typing import Any


def install() -> bool:
    """Patch daphne's request and WebSocket protocol classes; False when daphne is absent."""
    if "daphne.server" not in sys.modules:  # as ai1net.http_guard: not under daphne, do not import Twisted
        return False
    from daphne import http_protocol, ws_protocol

    request_class, socket_class = http_protocol.WebRequest, ws_protocol.WebSocketProtocol
    if getattr(request_class, "_ai1net_acyclic", False):
        return True
    process, connection_lost = request_class.process, socket_class.connectionLost

    def process_unlinked(self: Any) -> None:
        process(self)
        channel = self.channel
        # daphne hands an upgraded request's transport to the WebSocket protocol and sets its own to None.
        if self.transport is None and channel is not None and self in getattr(channel, "requests", ()):
            channel.requests.remove(self)

    def connection_lost_unlinked(self: Any, reason: Any = None) -> None:
        if reason is None:
            connection_lost(self)
        else:
            connection_lost(self, reason)
        if getattr(self, "is_closed", None) is not None and self.is_closed.called:
            self.is_closed = None  # resolved with this protocol: a cycle

    request_class.process = process_unlinked
    socket_class.connectionLost = connection_lost_unlinked
    request_class._ai1net_acyclic = True
    return True
