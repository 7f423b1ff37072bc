"""This process's live tunnel connections, by channel name: the outbox's direct path.

A tunnel consumer adds itself here when its socket opens, before it says hello, and leaves when it
closes. ``services.outbox_enqueue_many`` reads the device's live channel name in the transaction that
writes the items (the row is locked until commit, so a hello cannot change it meanwhile). When that
connection lives in this process, the items, already rendered as ``deliver`` frames, are handed to it
after commit through its event loop: no channel-layer message, no read back from the database. The
layer's doorbell is only for a connection in another process (or none).

Nothing durable depends on this: the items are committed first, and a hand-over the consumer cannot
use as is (a gap, a full window, not yet said hello) makes it read the outbox, as a doorbell would.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from ai1net import realtime

logger = logging.getLogger(__name__)


class LiveTunnel(Protocol):
    loop: asyncio.AbstractEventLoop

    def outbox_handed(self, frames: list[tuple[int, str]]) -> None:
        """Runs in the tunnel's loop: committed items as (seq, deliver frame), in seq order."""


_tunnels: dict[str, LiveTunnel] = {}


def add(channel_name: str, tunnel: LiveTunnel) -> None:
    _tunnels[channel_name] = tunnel


def discard(channel_name: str, tunnel: LiveTunnel) -> None:
    if _tunnels.get(channel_name) is tunnel:
        del _tunnels[channel_name]


def get(channel_name: str) -> LiveTunnel | None:
    return _tunnels.get(channel_name) if channel_name else None


def hand_over(channel_name: str, frames: list[tuple[int, str]]) -> bool:
    """Give committed items to the live connection ``channel_name`` if it is in this process."""
    tunnel = get(channel_name)
    if tunnel is None:
        return False
    try:
        realtime.call_in_loop(tunnel.loop, tunnel.outbox_handed, frames)
    except RuntimeError:  # its loop closed meanwhile: the device reconnects and reads the outbox
        logger.debug("tunnel %s is gone", channel_name)
        return False
    return True
