"""Deadlines and a size cap on daphne's HTTP connections, applied before a request reaches the app.

daphne (Twisted) closes a connection only after 60 s of silence, and every byte restarts that count: a client
that sends its request head a byte at a time (slowloris) holds a connection and a file descriptor for hours
(a head may be 16 KiB). daphne also reads a whole request body, to memory or a temporary file, before the
app runs and can refuse it. ``install`` wraps every new HTTP connection of daphne in this process:

- the request line and headers must arrive within ``head_timeout`` seconds of the request's first byte, and
  a body of declared length within ``head_timeout + length / min_body_rate``; else the client gets 408 and
  the connection is closed (a chunked body keeps Twisted's idle timeout: its length is unknown);
- a body declared larger than the largest any route takes (``max_body``) gets 413 at once, unread;
- Twisted's own parse of form bodies (which daphne never uses) is off.

WebSocket upgrades are requests without a body: their deadline ends with their headers, and autobahn's
handshake timeout takes over. Nothing changes for a client that sends its request at a normal pace.
"""

from __future__ import annotations

import functools
import json
import logging
import sys
from typing import Any

logger = logging.getLogger(__name__)


def _refuse(channel: Any, status: bytes, code: str, detail: str) -> None:
    """Answer and close; the rest of what the client sends is dropped unread."""
    body = json.dumps({"error": code, "detail": detail}).encode()
    channel.dataReceived = channel.rawDataReceived = lambda data: None
    channel.allContentReceived = lambda: None
    channel.transport.write(b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\nConnection: close\r\n"
                            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    channel.transport.loseConnection()


def _guard(channel: Any, *, head_timeout: float, min_body_rate: float, max_body: int, clock: Any) -> None:
    deadline: list[Any] = [None]  # the pending IDelayedCall, if any

    def cancel() -> None:
        if deadline[0] is not None and deadline[0].active():
            deadline[0].cancel()
        deadline[0] = None

    def expire() -> None:
        deadline[0] = None
        logger.info("HTTP request not received in time from %s; closed", channel.transport.getPeer())
        _refuse(channel, b"408 Request Timeout", "request_timeout",
                f"the request did not arrive within {head_timeout:g} s")

    def arm(seconds: float) -> None:
        cancel()
        deadline[0] = clock.callLater(seconds, expire)

    data_received = channel.dataReceived
    all_headers_received = channel.allHeadersReceived
    all_content_received = channel.allContentReceived
    connection_lost = channel.connectionLost

    def on_data(data: bytes) -> None:
        if deadline[0] is None and not channel._handlingRequest:  # the first bytes of a request
            arm(head_timeout)
        data_received(data)

    def on_headers() -> None:
        length = channel.length
        if isinstance(length, int) and length > max_body:
            cancel()
            _refuse(channel, b"413 Payload Too Large", "too_large",
                    f"the body is too large: at most {max_body} bytes")
            return
        all_headers_received()
        if isinstance(length, int) and length > 0:
            arm(head_timeout + length / min_body_rate)
        else:
            cancel()  # no body (allContentReceived follows at once), or a chunked one

    def on_content() -> None:
        cancel()
        all_content_received()

    def on_lost(reason: Any) -> None:
        cancel()
        connection_lost(reason)

    channel.dataReceived = on_data
    channel.allHeadersReceived = on_headers
    channel.allContentReceived = on_content
    channel.connectionLost = on_lost


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

    def build_guarded(self: Any, addr: Any) -> Any:
        from twisted.internet import reactor  # the one daphne installed and runs

        protocol = build(self, addr)
        # Twisted parses a form POST's body into request.args (a multipart one whole, through the email
        # package) before daphne hands the raw body to the app, which never reads args: on a small API
        # POST the content-type parse alone was 6% of the event loop's time.
        protocol.requestFactory = functools.partial(http_protocol.WebRequest, parsePOSTFormSubmission=False)
        # Twisted's protocol is a proxy (HTTP/1.1 or HTTP/2 after ALPN) around the HTTP/1.1 channel.
        channel = getattr(protocol, "_channel", protocol)
        if head_timeout > 0 and hasattr(channel, "allHeadersReceived"):
            _guard(channel, head_timeout=head_timeout, min_body_rate=min_body_rate, max_body=max_body,
                   clock=reactor)
        return protocol

    factory.buildProtocol = build_guarded
    factory._ai1net_guarded = True
    return True
