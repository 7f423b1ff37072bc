"""What every WebSocket consumer of ours shares."""

from __future__ import annotations

from typing import Any

from channels.consumer import get_handler_name


class LoopDispatch:
    """Channels' ``AsyncConsumer.dispatch`` without its ``close_old_connections`` before every message.

    That call is a trip to the thread-sensitive database thread and back for each frame, heartbeat and
    layer event (5% of daphne's event loop in the answer round trip, and with thousands of tunnels
    that one thread became the bottleneck). Our consumers never use the ORM on the event loop: each
    ORM call runs in ``database_sync_to_async``, which closes old connections around the call itself.
    """

    async def dispatch(self, message: dict[str, Any]) -> None:
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)
