"""Deadlines and a size cap on daphne's HTTP connections, applied before a request reaches the app.

daphne (Twisted) closes a connection only after 60 s of silence, and every byte restarts that count: a client
that sends its request head a byte at a time (slowloris) holds a connection and a file descriptor for hours
(a head may be 16 KiB). daphne also reads a whole request body, to memory or a temporary file, before the
app runs and can refuse it. ``install`` wraps every new HTTP connection of daphne in this process:

- the request line and headers must arrive within ``head_timeout`` seconds of the request's first byte, and
  a body of declared length within ``head_timeout + length / min_body_rate``; else the client gets 408 and
  the connection is closed (a chunked body keeps Twisted's idle timeout: its length is unknown);
- a body declared larger than the largest any route takes (``max_body``) gets 413 at once, unread;
- Twisted's own parse of form bodies (which daphne never uses) is off, and so is Twisted's own access line
  (daphne writes its own access log; Twisted formatted a second line per request for a log daphne sends
  nowhere, or at ``-v 2`` into Python's logging beside daphne's);
- a connection from this machine is sent without pacing (``clients.common.loopback``), deadlines or not;
- what a connection is given to send goes out in the event loop's next turn (``ai1net.soon_writes``).

The deadlines are timers of the asyncio loop that daphne runs Twisted on: Twisted's ``callLater`` on that
reactor cancels and re-arms the loop's one timer for its own queue at every call and cancel (two of each per
request). With the access line, that was a tenth of the instructions of a bare request
(``python -m bench.instructions``).

WebSocket upgrades are requests without a body: their deadline ends with their headers, and autobahn's
handshake timeout takes over. Nothing changes for a client that sends its request at a normal pace.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import sys
from typing import Any

from ai1net import soon_writes
from ai1net.mixins import mixed
from clients.common import loopback

logger = logging.getLogger(__name__)


def _refuse(channel: Any, status: bytes, code: str, detail: str) -> None:
    """Answer and close; the rest of what the client sends is dropped unread."""
    body = json.dumps({"error": code, "detail": detail}).encode()
    channel.dataReceived = channel.rawDataReceived = lambda data: None
    channel.allContentReceived = lambda: None
    channel.transport.write(b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\nConnection: close\r\n"
                            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    channel.transport.loseConnection()


class _Limits:
    """What ``install`` was given; one for the process, shared by every guarded channel."""

    def __init__(self, *, head_timeout: float, min_body_rate: float, max_body: int,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.head_timeout, self.min_body_rate, self.max_body, self.loop = head_timeout, min_body_rate, max_body, loop


class _TunedChannel:
    """Mixed into the class of each HTTP channel daphne builds, guarded or not: a connection from this machine
    (the proxy in front, as "Scaling out" in README runs daphne; a browser or a bridge on the same host) is sent
    without pacing (clients.common.loopback), and every connection's writes go out in the loop's next turn
    (ai1net.soon_writes; a WebSocket keeps the transport of the request that upgraded it)."""

    def connectionMade(self) -> None:
        super().connectionMade()
        handle = getattr(self.transport, "getHandle", None)
        if handle is not None:
            loopback.unpaced(handle())
        soon_writes.apply(self.transport, asyncio.get_running_loop())


class _GuardedChannel(_TunedChannel):
    """Mixed instead while deadlines are on (ai1net.mixins): methods of the class and two attributes per channel.
    Before, each channel got four closures and their cells as attributes of its own, which pointed back at it:
    a reference cycle per connection that only the cyclic collector freed, in pauses during which every socket
    of the process waited (ai1net.connection_cycles)."""

    _guard_limits: _Limits
    _guard_deadline: asyncio.TimerHandle | None = None  # pending (cleared as it fires)

    def _guard_cancel(self) -> None:
        deadline, self._guard_deadline = self._guard_deadline, None
        if deadline is not None:
            deadline.cancel()  # the loop drops the handle's reference to this channel

    def _guard_arm(self, seconds: float) -> None:
        self._guard_cancel()
        self._guard_deadline = self._guard_limits.loop.call_later(seconds, self._guard_expire)

    def _guard_expire(self) -> None:
        self._guard_deadline = None
        logger.info("HTTP request not received in time from %s; closed", self.transport.getPeer())
        _refuse(self, b"408 Request Timeout", "request_timeout",
                f"the request did not arrive within {self._guard_limits.head_timeout:g} s")

    def dataReceived(self, data: bytes) -> None:
        if self._guard_deadline is None and not self._handlingRequest:  # the first bytes of a request
            self._guard_arm(self._guard_limits.head_timeout)
        super().dataReceived(data)

    def allHeadersReceived(self) -> None:
        length, limits = self.length, self._guard_limits
        if isinstance(length, int) and length > limits.max_body:
            self._guard_cancel()
            _refuse(self, b"413 Payload Too Large", "too_large",
                    f"the body is too large: at most {limits.max_body} bytes")
            return
        super().allHeadersReceived()
        if isinstance(length, int) and length > 0:
            self._guard_arm(limits.head_timeout + length / limits.min_body_rate)
        else:
            self._guard_cancel()  # no body (allContentReceived follows at once), or a chunked one

    def allContentReceived(self) -> None:
        self._guard_cancel()
        super().allContentReceived()

    def connectionLost(self, reason: Any) -> None:
        self._guard_cancel()
        super().connectionLost(reason)


def _no_twisted_access_line(factory: Any, request: Any) -> None:
    """``HTTPFactory.log``: daphne's own access log (``--access-log``) is the one written."""


def install(*, head_timeout: float, min_body_rate: float, max_body: int) -> bool:
    """Guard every HTTP connection daphne builds from now on in this process; False when daphne is absent
    (another server, or tests that run the app in-process). Idempotent."""
    if "daphne.server" not in sys.modules:  # not under daphne: importing Twisted's reactor here would install
        return False  # the default one, and daphne (which installs its asyncio reactor) could not start later
    from daphne import http_protocol

    factory = http_protocol.HTTPFactory
    if getattr(factory, "_ai1net_guarded", False):
        return True
    build = factory.buildProtocol
    limits: _Limits | None = None
    request_factory = functools.partial(http_protocol.WebRequest, parsePOSTFormSubmission=False)

    def build_guarded(self: Any, addr: Any) -> Any:
        nonlocal limits
        if limits is None:  # the loop daphne's asyncio reactor runs on, running this call
            limits = _Limits(head_timeout=head_timeout, min_body_rate=min_body_rate, max_body=max_body,
                             loop=asyncio.get_running_loop())
        protocol = build(self, addr)
        # Twisted parses a form POST's body into request.args (a multipart one whole, through the email
        # package) before daphne hands the raw body to the app, which never reads args: on a small API
        # POST the content-type parse alone was 6% of the event loop's time.
        protocol.requestFactory = request_factory
        # Twisted's protocol is a proxy (HTTP/1.1 or HTTP/2 after ALPN) around the HTTP/1.1 channel.
        channel = getattr(protocol, "_channel", protocol)
        if hasattr(channel, "allHeadersReceived"):
            if head_timeout > 0:
                channel.__class__ = mixed(_GuardedChannel, type(channel))
                channel._guard_limits = limits
            else:
                channel.__class__ = mixed(_TunedChannel, type(channel))
        return protocol

    factory.buildProtocol = build_guarded
    factory.log = _no_twisted_access_line
    factory._ai1net_guarded = True
    return True
