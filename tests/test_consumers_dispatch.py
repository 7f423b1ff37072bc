"""ai1net.consumers: our consumers handle a message without a trip to the database thread, and a closing one
leaves its last channel-layer receive to finish."""

from __future__ import annotations

import asyncio

import pytest

from ai1net import consumers
from devices.consumers import DeviceConsumer, DevicesPageConsumer
from devices.web.ws import DeviceWebSocketConsumer
from im.consumers import RoomConsumer
from mobile.consumers import MobileConsumer

CONSUMERS = [DeviceConsumer, DevicesPageConsumer, DeviceWebSocketConsumer, RoomConsumer, MobileConsumer]


@pytest.mark.parametrize("consumer_class", CONSUMERS, ids=lambda c: c.__name__)
async def test_a_layer_event_is_handled_on_the_loop_without_closing_connections_first(consumer_class, monkeypatch):
    import channels.consumer

    trips = []

    async def counted():
        trips.append(1)

    monkeypatch.setattr(channels.consumer, "aclose_old_connections", counted)
    handled = []
    consumer = consumer_class()

    async def handler(message):
        handled.append(message)

    consumer.test_event = handler
    await consumer.dispatch({"type": "test.event", "n": 1})
    assert handled == [{"type": "test.event", "n": 1}] and trips == []
    with pytest.raises(ValueError):
        await consumer.dispatch({"type": "no.such.handler"})


class HeldLayer:
    """A layer whose receive waits until a message is put for the channel; sends may fail."""

    def __init__(self, send_fails: bool = False) -> None:
        self.queues: dict[str, asyncio.Queue] = {}
        self.sent: list[tuple[str, dict]] = []
        self.receiving = asyncio.Event()
        self.cancelled: list[str] = []
        self.send_fails = send_fails

    def queue(self, channel: str) -> asyncio.Queue:
        return self.queues.setdefault(channel, asyncio.Queue())

    async def receive(self, channel: str) -> dict:
        self.receiving.set()
        try:
            return await self.queue(channel).get()
        except asyncio.CancelledError:
            self.cancelled.append(channel)
            raise

    async def send(self, channel: str, message: dict) -> None:
        if self.send_fails:
            raise ConnectionError("the layer is down")
        self.sent.append((channel, message))
        self.queue(channel).put_nowait(message)


def finishing_here() -> set[asyncio.Task]:
    """The finishing receives of this test's loop (another test's consumers may have left theirs behind in a
    loop that is closed now: they never end there)."""
    loop = asyncio.get_running_loop()
    return {task for task in consumers._finishing if task.get_loop() is loop}


async def closed_consumer_receive(layer: HeldLayer) -> asyncio.Future:
    """A consumer's receive, cancelled as Channels cancels it when the socket closes; returns the receive
    that was left running (the layer's own call)."""
    receive = consumers._receive_finishing_on_close(layer, "specific.x!c1")
    task = asyncio.ensure_future(receive())
    await layer.receiving.wait()
    assert not finishing_here()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(finishing_here()) == 1
    return next(iter(finishing_here()))


async def test_a_closed_consumers_receive_goes_on_until_its_own_gone_message_comes_back():
    layer = HeldLayer()
    ending = await closed_consumer_receive(layer)
    await asyncio.wait_for(ending, 5)
    assert layer.sent == [("specific.x!c1", {"type": consumers.GONE})]
    assert not finishing_here() and layer.queue("specific.x!c1").empty()  # it took the message back
    assert layer.cancelled == []


async def test_a_closed_consumers_receive_is_cancelled_when_the_gone_message_cannot_be_sent():
    layer = HeldLayer(send_fails=True)
    ending = await closed_consumer_receive(layer)
    await asyncio.wait_for(ending, 5)
    assert layer.sent == [] and not finishing_here() and layer.cancelled == ["specific.x!c1"]


def test_only_the_redis_layer_gets_the_finishing_receive():
    from channels.layers import InMemoryChannelLayer
    from channels_redis.core import RedisChannelLayer

    consumer = MobileConsumer()
    consumer.channel_layer, consumer.channel_name = InMemoryChannelLayer(), "c"
    plain = object()
    consumer.channel_receive = plain
    assert consumer.channel_receive is plain
    consumer.channel_layer = RedisChannelLayer(hosts=[{"address": "redis://127.0.0.1:1/0"}])
    consumer.channel_receive = plain
    assert consumer.channel_receive is not plain and consumer.channel_receive.__name__ == "receive"
