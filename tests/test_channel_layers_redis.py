"""ai1net.channel_layers.RedisChannelLayer: channels-redis's keys, messages and semantics in fewer round trips."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from channels.exceptions import ChannelFull
from channels_redis.core import RedisChannelLayer as ChannelsRedisLayer
from django.conf import settings
from redis.asyncio.connection import AbstractConnection

from ai1net.channel_layers import RedisChannelLayer

pytestmark = [pytest.mark.redis, pytest.mark.skipif(not settings.REDIS_URL, reason="needs REDIS_URL")]


def _config(prefix: str, **overrides: object) -> dict:
    config = dict(settings.CHANNEL_LAYERS["default"]["CONFIG"])
    config.update(prefix=prefix, **overrides)
    return config


@contextlib.asynccontextmanager
async def _layers(*classes: type, **overrides: object) -> AsyncIterator[list]:
    prefix = f"{settings.CHANNEL_LAYERS['default']['CONFIG']['prefix']}:layertest:{uuid.uuid4().hex[:8]}"
    layers = [cls(**_config(prefix, **overrides)) for cls in classes]
    try:
        yield layers
    finally:
        await layers[0].flush()
        for layer in layers:
            await layer.close_pools()


@contextlib.contextmanager
def _round_trips() -> Iterator[list[int]]:
    """Counts what redis-py writes to Redis at once: one command, or one pipeline of several."""
    count = [0]
    original = AbstractConnection.send_packed_command

    async def counted(self, command, check_health=True):  # type: ignore[no-untyped-def]
        count[0] += 1
        return await original(self, command, check_health)

    AbstractConnection.send_packed_command = counted
    try:
        yield count
    finally:
        AbstractConnection.send_packed_command = original


@pytest.mark.parametrize("sender_class, receiver_class", [(RedisChannelLayer, ChannelsRedisLayer),
                                                          (ChannelsRedisLayer, RedisChannelLayer),
                                                          (RedisChannelLayer, RedisChannelLayer)])
async def test_messages_cross_between_it_and_channels_redis(sender_class, receiver_class):
    async with _layers(sender_class, receiver_class) as (sender, receiver):
        local = await receiver.new_channel()  # process-local ("!"): the process's key, the name in the message
        await sender.send(local, {"type": "t.one", "n": 1})
        await sender.send("plain-channel", {"type": "t.two", "n": 2})
        assert await asyncio.wait_for(receiver.receive(local), 10) == {"type": "t.one", "n": 1}
        assert await asyncio.wait_for(receiver.receive("plain-channel"), 10) == {"type": "t.two", "n": 2}

        # A group with two channels of one process (one key, both names in the message) and another.
        second, other = await receiver.new_channel(), await sender.new_channel()
        for channel in (local, second, other):
            await receiver.group_add("g", channel)
        await sender.group_send("g", {"type": "t.group"})
        for layer, channel in ((receiver, local), (receiver, second), (sender, other)):
            assert await asyncio.wait_for(layer.receive(channel), 10) == {"type": "t.group"}
        await receiver.group_discard("g", second)
        await sender.group_send("g", {"type": "t.after"})
        assert await asyncio.wait_for(receiver.receive(local), 10) == {"type": "t.after"}
        assert await asyncio.wait_for(sender.receive(other), 10) == {"type": "t.after"}
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(receiver.receive(second), 0.3)


async def test_a_full_channel_refuses_a_send_and_a_group_send_skips_it(caplog):
    async with _layers(RedisChannelLayer, capacity=2) as (layer,):
        channel = await layer.new_channel()
        await layer.group_add("g", channel)
        await layer.send(channel, {"type": "t", "n": 1})
        await layer.send(channel, {"type": "t", "n": 2})
        with pytest.raises(ChannelFull):
            await layer.send(channel, {"type": "t", "n": 3})
        with caplog.at_level(logging.INFO, logger="ai1net.channel_layers"):
            await layer.group_send("g", {"type": "t", "n": 4})
        assert "1 of 1 channels over capacity in group g" in caplog.text
        assert [(await layer.receive(channel))["n"] for _ in range(2)] == [1, 2]
        await layer.send(channel, {"type": "t", "n": 5})  # room again
        assert (await layer.receive(channel))["n"] == 5


async def test_expired_messages_are_dropped_and_make_room():
    async with _layers(RedisChannelLayer, capacity=1, expiry=1) as (layer,):
        await layer.send("c", {"type": "t", "n": 1})
        with pytest.raises(ChannelFull):
            await layer.send("c", {"type": "t", "n": 2})
        await asyncio.sleep(2.1)  # the first is past its expiry (whole seconds, as channels-redis counts)
        await layer.send("c", {"type": "t", "n": 3})
        assert (await asyncio.wait_for(layer.receive("c"), 10))["n"] == 3


async def test_round_trips():
    async with _layers(RedisChannelLayer) as (layer,):
        channel, another = await layer.new_channel(), await layer.new_channel()
        await layer.send("warm-up", {"type": "t"})  # the connection's handshake and the script's load
        await layer.group_send("warm-up", {"type": "t"})
        with _round_trips() as count:
            await layer.send(channel, {"type": "t"})
        assert count[0] == 1  # channels-redis: 4
        with _round_trips() as count:
            await layer.group_send("empty", {"type": "t"})
        assert count[0] == 1  # channels-redis: 2
        with _round_trips() as count:
            await layer.group_add("g", channel)
        assert count[0] == 1  # channels-redis: 2
        await layer.group_add("g", another)
        await layer.group_send("g", {"type": "w"})  # loads the group script
        with _round_trips() as count:
            await layer.group_send("g", {"type": "t"})
        assert count[0] == 2  # channels-redis: 4
        with _round_trips() as count:
            received = [await asyncio.wait_for(layer.receive(c), 10) for c in [channel] * 3 + [another] * 2]
            await layer.wait_received()
        # Three messages in Redis: the send, and each group send once for both channels of this process
        # (one key per process). One pop each; channels-redis: 4 each.
        assert count[0] == 3
        assert [m["type"] for m in received] == ["t", "w", "t", "w", "t"]  # the send, then the two group sends


async def test_a_restarted_redis_that_forgot_the_scripts_loads_them_again():
    async with _layers(RedisChannelLayer) as (layer,):
        await layer.send("c", {"type": "t", "n": 1})
        await layer.connection(0).script_flush()
        await layer.send("c", {"type": "t", "n": 2})
        await layer.group_add("g", "c")
        await layer.group_send("g", {"type": "t", "n": 3})
        assert [(await asyncio.wait_for(layer.receive("c"), 10))["n"] for _ in range(3)] == [1, 2, 3]
