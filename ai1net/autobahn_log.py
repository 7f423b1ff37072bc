"""autobahn (daphne's WebSocket server) pretty-prints every new connection's settings for a debug line.

``WebSocketProtocol._connectionMade`` builds the 30-odd settings it copied from the factory into a list
and passes ``pformat(list)`` to ``log.debug``: the text is made whether or not debug logging is on, and
it never is. In py-spy on daphne that was 13% of the CPU of a bare Channels echo connect and 11% of a
device tunnel's (bench/tunnel.py, connects). ``install`` makes autobahn's ``pformat`` lazy: the text is
made only if the line is ever written. Its one other use that must return text (``Timings.__str__``)
keeps the real one.
"""

from __future__ import annotations

import pprint
from typing import Any


class LazyPformat:
    """``pprint.pformat(value)``, made when the log line is formatted (never, with debug off)."""

    __slots__ = ("value",)
    lazy = True

    def __init__(self, value: Any) -> None:
        self.value = value

    def __str__(self) -> str:
        return pprint.pformat(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


def install() -> bool:
    """True when autobahn's connection settings are pretty-printed only on demand from now on."""
    try:
        from autobahn.websocket import protocol
    except ImportError:
        return False
    if getattr(protocol, "pformat", None) is LazyPformat:
        return True
    timings = getattr(protocol, "Timings", None)
    if getattr(protocol, "pformat", None) is not pprint.pformat or timings is None:
        return False  # an autobahn that does this otherwise: leave it
    timings.__str__ = lambda self: pprint.pformat(self._timings)
    protocol.pformat = LazyPformat
    return True
