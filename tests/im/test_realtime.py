"""ai1net.realtime: events handed from worker threads to the loop keep their order within a group, and
one group's slow sends do not hold another group's back."""

from __future__ import annotations

import asyncio
import threading

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer

from ai1net import realtime


@pytest.mark.asyncio
async def test_groups_are_drained_side_by_side_each_in_order(monkeypatch):
    layer = get_channel_layer()
    slow_channel, fast_channel = await layer.new_channel(), await layer.new_channel()
    await layer.group_add("rt.slow", slow_channel)
    await layer.group_add("rt.fast", fast_channel)
    release = asyncio.Event()
    real_send = realtime._send

    async def send(group, message):
        if group == "rt.slow":
            await release.wait()  # a layer round trip that takes its time
        await real_send(group, message)

    monkeypatch.setattr(realtime, "_send", send)
    threads = []

    def emit():
        threads.append(threading.current_thread())
        for i in range(5):
            realtime.group_send_now("rt.slow", {"type": "t.n", "i": i})
        for i in range(5):
            realtime.group_send_now("rt.fast", {"type": "t.n", "i": i})

    try:
        await sync_to_async(emit, thread_sensitive=False)()
        assert threads[0] is not threading.main_thread()
        # The fast group's events arrive while the slow group's first send still waits.
        fast = [(await asyncio.wait_for(layer.receive(fast_channel), 3))["i"] for _ in range(5)]
        assert fast == list(range(5))
        release.set()
        slow = [(await asyncio.wait_for(layer.receive(slow_channel), 3))["i"] for _ in range(5)]
        assert slow == list(range(5))
    finally:
        release.set()
        await layer.group_discard("rt.slow", slow_channel)
        await layer.group_discard("rt.fast", fast_channel)


async def test_app_events_waiting_for_one_group_leave_as_one_layer_message_in_order(monkeypatch):
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add("rt.batch", channel)
    emitted = asyncio.Event()
    real_send = realtime._send

    async def send(group, message):
        await emitted.wait()  # the first send is still on its way while the rest queue up
        await real_send(group, message)

    monkeypatch.setattr(realtime, "_send", send)

    def emit():
        # As one commit's callbacks do: handed over back to back from the worker thread.
        realtime.group_send_now("rt.batch", {"type": "other.kind", "n": 0})
        for i in range(3):
            realtime.group_send_now("rt.batch", {"type": realtime.APP_EVENT, "event": {"i": i}})
        realtime.group_send_now("rt.batch", {"type": "other.kind", "n": 1})
        realtime.group_send_now("rt.batch", {"type": realtime.APP_EVENT, "event": {"i": 3}})

    try:
        await sync_to_async(emit, thread_sensitive=False)()
        await asyncio.sleep(0.05)  # the loop takes every hand-over
        emitted.set()
        got = [await asyncio.wait_for(layer.receive(channel), 3) for _ in range(4)]
        assert [m["type"] for m in got] == ["other.kind", "app.events", "other.kind", "app.event"]
        assert got[1]["events"] == [{"i": 0}, {"i": 1}, {"i": 2}] and got[3]["event"] == {"i": 3}
    finally:
        emitted.set()
        await layer.group_discard("rt.batch", channel)
