"""The embedded default's channel layer: Channels' in-memory layer without its O(connections) scans.

``channels.layers.InMemoryChannelLayer`` runs ``_clean_expired`` on every ``receive`` and every
``group_send``; it walks every waiting channel and every group member, so with N open sockets each
message costs O(N) and opening N sockets costs O(N^2) (connection set-up fell from 630/s to 19/s near
18,000 sockets; shared/reference/stack-notes.md). Here the same sweep runs at most once per
``CLEAN_INTERVAL_SEC`` (one sweep took about 0.1 s at 15,000 sockets): a message past its expiry,
or a membership past the group expiry (a day), is dropped up to that much later. Nothing else
changes. One process only, as before.
"""

from __future__ import annotations

import time

from channels.layers import InMemoryChannelLayer as _ChannelsInMemoryChannelLayer

CLEAN_INTERVAL_SEC = 10.0


class InMemoryChannelLayer(_ChannelsInMemoryChannelLayer):
    _cleaned_at = 0.0

    def _clean_expired(self) -> None:
        now = time.monotonic()
        if now - self._cleaned_at < CLEAN_INTERVAL_SEC:
            return
        self._cleaned_at = now
        super()._clean_expired()

    async def flush(self) -> None:
        await super().flush()
        self._cleaned_at = 0.0
