"""daphne's connections send what they are given in the event loop's next turn, not after a poll for writability.

Twisted buffers a write and asks its reactor to watch the socket for writability; the asyncio reactor daphne runs
on then registers the socket with the loop's epoll (``add_writer``), the next poll reports it writable among the
other events of that turn, ``doWrite`` sends, and the socket is unregistered again (``remove_writer``): two
``epoll_ctl`` calls and the loop's bookkeeping for every burst of writes, and the bytes go out in whatever order
the poll lists them in, after the handlers of frames that arrived meanwhile (a device-web response head waited
behind the next data frame's handling; bench/NOTES.md, "A hop's wake-up").

``apply`` mixes ``SoonWrites`` into one connection's transport: a write schedules one flush with ``call_soon``
(further writes in the same turn join it, as they joined Twisted's buffer before), the flush runs Twisted's own
``doWrite`` at the start of the next turn, and only what the socket did not take is left to the reactor's
watch for writability, as before. Producers, ``loseConnection`` and half-closes keep Twisted's code: ``doWrite``
is what runs them, whoever calls it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ai1net.mixins import mixed

logger = logging.getLogger(__name__)


class SoonWrites:
    """Mixed into the class of a Twisted TCP transport (``apply``)."""

    _soon_loop: asyncio.AbstractEventLoop
    _soon_due = False  # a flush is scheduled
    _soon_watched = False  # the reactor watches the socket for writability (the socket was full)

    def startWriting(self) -> None:  # noqa: N802 - Twisted's name
        if self._soon_due or self._soon_watched:
            return
        self._soon_due = True
        self._soon_loop.call_soon(self._soon_flush)

    def stopWriting(self) -> None:  # noqa: N802
        if self._soon_watched:
            self._soon_watched = False
            super().stopWriting()  # type: ignore[misc]

    def _soon_flush(self) -> None:
        self._soon_due = False
        if not self.connected or self.fileno() == -1 or self._aborting:  # type: ignore[attr-defined]
            return  # lost or aborted meanwhile: connectionLost has run or is due
        try:
            why = self.doWrite()  # type: ignore[attr-defined]
        except Exception as exc:  # as the reactor treats a failing doWrite
            logger.exception("writing to %r", self)
            why = exc
        if why:
            self.reactor._disconnectSelectable(self, why, False)  # type: ignore[attr-defined]
        elif self._tempDataLen or self.offset < len(self.dataBuffer):  # type: ignore[attr-defined]
            self._soon_watched = True
            super().startWriting()  # type: ignore[misc]


def apply(transport: Any, loop: asyncio.AbstractEventLoop) -> bool:
    """Give ``transport`` (a connection's ``twisted.internet.tcp.Connection``) soon writes on ``loop``, the loop
    its reactor runs on; False, and unchanged, for any other transport (TLS wraps the connection in a protocol
    of its own)."""
    from twisted.internet import tcp

    cls = type(transport)
    if not isinstance(transport, tcp.Connection) or issubclass(cls, SoonWrites):
        return False
    transport._soon_loop = loop
    transport.__class__ = mixed(SoonWrites, cls)
    return True
