"""What keeps many tunnels cheap: the shared heartbeat sweep, events handed to the loop, the layer."""

from __future__ import annotations

import asyncio
import threading

import pytest
from asgiref.sync import sync_to_async
from channels.exceptions import ChannelFull
from channels.layers import get_channel_layer
from django.db import connection
from django.test.utils import CaptureQueriesContext

from ai1net import realtime
from ai1net.channel_layers import InMemoryChannelLayer
from clients import protocol
from devices import services
from devices.models import Device, OutboxItem
from tests.devices.tunnel_support import Device as FakeDevice

db = sync_to_async


@pytest.fixture(autouse=True)
def _isolated(isolated_device_signals):
    """Other apps react to connections (e.g. mobile enqueues its switch); these tests count seqs exactly."""


@pytest.mark.django_db(transaction=True)
async def test_one_sweep_revokes_silently_and_finds_items_a_lost_doorbell_left(user, settings):
    settings.DEVICE_HEARTBEAT_SEC = 0.3
    pairs = [await db(services.device_create)(owner=user, name=f"d{i}", kind="bridge") for i in range(3)]
    devs = []
    for _, token in pairs:
        dev = FakeDevice(token)
        await dev.open()
        await dev.hello()
        devs.append(dev)
    (revoked, _), (quiet, _), _ = pairs

    def write_silently():
        # as another process would, with no event reaching this one: only the sweep can notice
        Device.objects.filter(pk=revoked.pk).update(status=Device.Status.REVOKED)
        Device.objects.filter(pk=quiet.pk).update(next_seq=2)
        OutboxItem.objects.create(device=quiet, seq=1, kind="quiet", payload={})

    await db(write_silently)()
    assert await devs[0].closed(timeout=3) == protocol.CLOSE_REVOKED
    assert (await devs[1].delivers(1, timeout=3))[0]["kind"] == "quiet"
    for dev in devs[1:]:
        await dev.close()


@pytest.mark.django_db(transaction=True)
async def test_a_replaced_tunnel_that_missed_its_message_is_closed_by_the_sweep(user, settings, monkeypatch):
    settings.DEVICE_HEARTBEAT_SEC = 0.3
    device, token = await db(services.device_create)(owner=user, name="d", kind="bridge")
    older = FakeDevice(token)
    await older.open()
    await older.hello()
    layer = get_channel_layer()
    send = layer.send

    async def lose_replaced(channel, message):
        if message.get("type") == "devices.replaced":
            raise ChannelFull(channel)  # as when the older connection's process is gone (channels-redis)
        await send(channel, message)

    monkeypatch.setattr(layer, "send", lose_replaced)
    newer = FakeDevice(token)
    await newer.open()
    await newer.hello()  # the hello goes through although the message could not be sent
    assert await older.closed(timeout=3) == protocol.CLOSE_REPLACED
    assert await db(lambda: Device.objects.get(pk=device.pk).channel_name)() != ""
    await newer.close()


@pytest.mark.django_db(transaction=True)
def test_sweep_reads_and_marks_many_devices_in_one_query_per_chunk(user):
    created = [services.device_create(owner=user, name=f"d{i}", kind="bridge")[0] for i in range(5)]
    for i, device in enumerate(created):
        Device.objects.filter(pk=device.pk).update(channel_name=f"chan{i}")
    from devices import selectors

    with CaptureQueriesContext(connection) as queries:
        states = selectors.devices_tick_state(device_ids=[d.pk for d in created], chunk=3)
        # the last one is not its device's live connection (replaced): left alone
        services.devices_seen(connections=[(d.pk, f"chan{i}") for i, d in enumerate(created[:4])]
                              + [(created[4].pk, "older")], chunk=10)
    assert len(queries) == 3
    assert states == {d.pk: (Device.Status.ACTIVE, 1, f"chan{i}") for i, d in enumerate(created)}
    seen = dict(Device.objects.values_list("pk", "last_seen_at"))
    assert all(seen[d.pk] is not None for d in created[:4]) and seen[created[4].pk] is None


async def test_events_from_worker_threads_are_handed_to_the_loop_in_order():
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add("scale.order", channel)
    threads = []

    def emit():
        threads.append(threading.current_thread())
        for i in range(30):
            realtime.group_send_now("scale.order", {"type": "t.n", "i": i})

    await sync_to_async(emit, thread_sensitive=False)()
    assert threads[0] is not threading.main_thread()
    got = [(await asyncio.wait_for(layer.receive(channel), 3))["i"] for _ in range(30)]
    assert got == list(range(30))
    await layer.group_discard("scale.order", channel)


async def test_in_memory_layer_sweeps_expired_messages_at_most_once_a_second(monkeypatch):
    layer = InMemoryChannelLayer(expiry=0.01)
    sweeps = []
    original = InMemoryChannelLayer.__mro__[1]._clean_expired
    monkeypatch.setattr(InMemoryChannelLayer.__mro__[1], "_clean_expired",
                        lambda self: (sweeps.append(1), original(self))[1])
    await layer.send("x.stale", {"type": "old"})
    await asyncio.sleep(0.05)
    for _ in range(50):
        await layer.group_send("nobody", {"type": "t"})
    assert len(sweeps) == 1  # the first one swept; the other 49 did not walk every channel
    assert "x.stale" not in layer.channels  # and the sweep still drops what expired
