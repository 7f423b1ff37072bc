"""Our channel layers: Channels' in-memory one without its O(connections) scans (the embedded default), and
channels-redis's in fewer round trips (scaled out, ``RedisChannelLayer`` below).

``channels.layers.InMemoryChannelLayer`` runs ``_clean_expired`` on every ``receive`` and every
``group_send``; it walks every waiting channel and every group member, so with N open sockets each
message costs O(N) and opening N sockets costs O(N^2) (connection set-up fell from 630/s to 19/s near
18,000 sockets; shared/reference/stack-notes.md). Here the same sweep runs at most once per
``CLEAN_INTERVAL_SEC`` (one sweep took about 0.1 s at 15,000 sockets): a message past its expiry,
or a membership past the group expiry (a day), is dropped up to that much later. Nothing else
changes. One process only, as before.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from channels.exceptions import ChannelFull
from channels.layers import InMemoryChannelLayer as _ChannelsInMemoryChannelLayer
from channels_redis import core
from redis.commands.core import AsyncScript

logger = logging.getLogger(__name__)

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


# --- scaled out: channels-redis with fewer round trips to Redis -----------------------------------------

# A send: expire old messages, refuse at capacity, add, renew the key's expiry. channels-redis makes these
# four commands four round trips; here they are one script (one round trip, and atomic).
_SEND_LUA = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], 0, ARGV[3])
if redis.call('ZCOUNT', KEYS[1], '-inf', '+inf') >= tonumber(ARGV[4]) then
    return 0
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[5])
return 1
"""

# A group send's writes, per member key: channels-redis's script, with the expiry of old messages (a
# pipeline of its own there) done in it. KEYS: n channel keys; ARGV: n messages, n capacities, now,
# expiry, the score below which messages have expired. Returns how many keys were at capacity.
_GROUP_SEND_LUA = """
local n = #KEYS
local now, expiry, expired = ARGV[2 * n + 1], ARGV[2 * n + 2], ARGV[2 * n + 3]
local over_capacity = 0
for i = 1, n do
    redis.call('ZREMRANGEBYSCORE', KEYS[i], 0, expired)
    if redis.call('ZCOUNT', KEYS[i], '-inf', '+inf') < tonumber(ARGV[n + i]) then
        redis.call('ZADD', KEYS[i], now, ARGV[i])
        redis.call('EXPIRE', KEYS[i], expiry)
    else
        over_capacity = over_capacity + 1
    end
end
return over_capacity
"""


class RedisChannelLayer(core.RedisChannelLayer):
    """channels-redis's layer with the same keys, messages and semantics, in fewer round trips: a send in one
    (was four), a group send in two (was four; one for a group without members), a group add in one (was
    two), a receive's pop in one (was four). In one process on the bench machine, a send and its receive
    took 0.92 ms of CPU and eight round trips with channels-redis 4.3.0.

    The pop: channels-redis runs an EVAL (a cleanup), the BZPOPMIN, a ZADD of the popped message to a
    backup key and, after it returns, a ZPOPMIN of that backup, and the next pop on the channel waits for
    that ZPOPMIN. The backup saves a message only from a cancellation during its own ZADD: a receive
    cancelled while BZPOPMIN's reply is on its way loses the message either way (which is why our
    consumers let a closing consumer's receive finish, ai1net.consumers). Here the pop is the BZPOPMIN.

    With several Redis hosts a group's members may live on other hosts than the group: then group sends
    are channels-redis's own. The overridden receive steps are private to channels-redis 4.3
    (requirements.txt pins it; tests/test_channel_layers_redis.py checks them)."""

    # redis-py's script objects: EVALSHA, and SCRIPT LOAD first where the server does not know the script
    # (a new or restarted Redis). Given as bytes, they need no client to compute their SHA1.
    _send_script = AsyncScript(None, _SEND_LUA.encode())
    _group_send_script = AsyncScript(None, _GROUP_SEND_LUA.encode())

    async def send(self, channel: str, message: dict[str, Any]) -> None:
        assert isinstance(message, dict), "message is not a dict"
        assert self.require_valid_channel_name(channel), "Channel name not valid"
        assert "__asgi_channel__" not in message
        if "!" in channel:  # a process-local channel: the process's key, the full name in the message
            message = {**message, "__asgi_channel__": channel}
            key_name = self.non_local_name(channel)
            index = self.consistent_hash(channel)
        else:
            key_name = channel
            index = next(self._send_index_generator)
        now = time.time()
        added = await self._send_script(
            keys=[self.prefix + key_name],
            args=[self.serialize(message), now, int(now) - int(self.expiry), self.get_capacity(channel),
                  int(self.expiry)],
            client=self.connection(index),
        )
        if not added:
            raise ChannelFull()

    async def group_add(self, group: str, channel: str) -> None:
        assert self.require_valid_group_name(group), "Group name not valid"
        assert self.require_valid_channel_name(channel), "Channel name not valid"
        key = self._group_key(group)
        pipe = self.connection(self.consistent_hash(group)).pipeline(transaction=False)
        pipe.zadd(key, {channel: time.time()})
        pipe.expire(key, self.group_expiry)
        await pipe.execute()

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        if self.ring_size != 1:
            await super().group_send(group, message)
            return
        assert self.require_valid_group_name(group), "Group name not valid"
        connection = self.connection(0)
        key = self._group_key(group)
        pipe = connection.pipeline(transaction=False)
        pipe.zremrangebyscore(key, min=0, max=int(time.time()) - self.group_expiry)
        pipe.zrange(key, 0, -1)
        _, members = await pipe.execute()
        if not members:
            return
        channel_names = [member.decode("utf8") for member in members]
        by_connection, messages, capacities = self._map_channel_keys_to_connection(channel_names, message)
        keys = by_connection[0]
        now = time.time()
        over_capacity = await self._group_send_script(
            keys=keys,
            args=[*(messages[k] for k in keys), *(capacities[k] for k in keys), now, self.expiry,
                  int(now) - int(self.expiry)],
            client=connection,
        )
        if over_capacity > 0:
            logger.info("%s of %s channels over capacity in group %s", over_capacity, len(channel_names), group)

    async def _brpop_with_clean(self, index: int, channel: str, timeout: int) -> Any:
        result = await self.connection(index).bzpopmin(channel, timeout=timeout)
        return None if result is None else result[1]

    async def _clean_receive_backup(self, index: int, channel: str) -> None:
        return None  # no backup was made
