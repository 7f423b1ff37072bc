"""What every WebSocket consumer of ours shares."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from channels.consumer import get_handler_name
from channels_redis.core import RedisChannelLayer

logger = logging.getLogger(__name__)

# The receives of closed consumers still finishing (below); held here so they are not collected.
_finishing: set[asyncio.Task] = set()
FINISH_TIMEOUT_SEC = 30.0
GONE = "consumer.gone"  # what a closed consumer sends itself so its last receive ends


def _receive_finishing_on_close(layer: Any, channel: str) -> Callable[[], Awaitable[dict[str, Any]]]:
    """``layer.receive(channel)`` that, when cancelled because its consumer closes, lets the receive
    go on until the channel's next message, and sends the channel that message itself.

    channels_redis receives all of a process's channels through one blocking pop at a time, run by
    whichever receive holds its lock, and files what it pops under the channel it was for. If the
    holder is cancelled while a popped message is on its way back, the message is gone: a page's
    channel on the same layer as a tunnel lost the tunnel's offline event after 4 of 15 closes (the
    event is sent as the tunnel's consumer closes, so the pop in flight is likely to be it). Left to
    run, the receive files any message it pops for another channel, as it would have, and ends with
    its own."""

    async def receive() -> dict[str, Any]:
        pending = asyncio.ensure_future(layer.receive(channel))
        try:
            return await asyncio.shield(pending)
        except asyncio.CancelledError:
            if not pending.done():
                _finish(layer, channel, pending)
            raise

    return receive


def _finish(layer: Any, channel: str, pending: asyncio.Future) -> None:
    loop = asyncio.get_running_loop()

    async def end_it() -> None:
        try:
            await layer.send(channel, {"type": GONE})
            await asyncio.wait_for(asyncio.shield(pending), FINISH_TIMEOUT_SEC)
        except Exception:  # the layer is down or the channel full: a popped message, if any, is lost
            logger.debug("a closed consumer's receive did not finish", exc_info=True)
        finally:  # its own message (ours, or one sent to the closed consumer) has nobody to read it
            if pending.done() and not pending.cancelled():
                pending.exception()  # retrieved, so a failed receive is not reported as never retrieved
            else:
                pending.cancel()

    task = loop.create_task(end_it())
    _finishing.add(task)
    task.add_done_callback(_finishing.discard)


class LoopDispatch:
    """What our consumers change in Channels' ``AsyncConsumer``.

    ``dispatch`` without its ``close_old_connections`` before every message. That call is a trip to the
    thread-sensitive database thread and back for each frame, heartbeat and layer event (5% of daphne's
    event loop in the answer round trip, and with thousands of tunnels that one thread became the
    bottleneck). Our consumers never use the ORM on the event loop: each ORM call runs in
    ``database_sync_to_async``, which closes old connections around the call itself.

    ``channel_receive``, which Channels sets to ``partial(layer.receive, channel_name)`` and cancels when
    the consumer closes: on a Redis layer, a receive that finishes (``_receive_finishing_on_close``).
    """

    async def dispatch(self, message: dict[str, Any]) -> None:
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    @property
    def channel_receive(self) -> Callable[[], Awaitable[dict[str, Any]]]:
        return self._channel_receive

    @channel_receive.setter
    def channel_receive(self, receive: Callable[[], Awaitable[dict[str, Any]]]) -> None:
        if isinstance(self.channel_layer, RedisChannelLayer):
            receive = _receive_finishing_on_close(self.channel_layer, self.channel_name)
        self._channel_receive = receive


class AppEvents:
    """A page's socket (a JSON consumer) handling ai1net.realtime's events: each event goes to the browser as it
    is, and several that left in one layer message (``app.events``) go in their order."""

    async def app_event(self, message: dict[str, Any]) -> None:
        await self.send_json(message["event"])

    async def app_events(self, message: dict[str, Any]) -> None:
        for event in message["events"]:
            await self.send_json(event)
