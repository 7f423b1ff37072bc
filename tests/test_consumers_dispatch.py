"""ai1net.consumers.LoopDispatch: our consumers handle a message without a trip to the database thread."""

from __future__ import annotations

import pytest

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
