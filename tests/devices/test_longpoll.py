"""The HTTP long-poll fallback of the tunnel: bridge/pull and bridge/push."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from channels.db import database_sync_to_async
from django.test import AsyncClient

from devices.models import LONGPOLL_PREFIX, Device, OutboxItem
from devices.services import device_create, device_revoke, outbox_enqueue
from devices.signals import device_connected

PULL = "/api/devices/bridge/pull"
PUSH = "/api/devices/bridge/push"


@pytest.fixture
def hold(settings):
    settings.DEVICE_LONGPOLL_HOLD_SEC = 0.6
    settings.DEVICE_LONGPOLL_TICK_SEC = 0.05
    settings.DEVICE_HEARTBEAT_SEC = 1


def _bridge(user, kind=Device.Kind.BRIDGE):
    return device_create(owner=user, name="desk", kind=kind)


def _post(client, path, body, token):
    return client.post(path, body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}")


@pytest.mark.django_db(transaction=True)
def test_pull_needs_a_valid_bridge_token(client, user, hold):
    assert _post(client, PULL, {"ackedSeq": 0}, "nope").status_code == 401
    probe, probe_token = _bridge(user, Device.Kind.PROBE)
    assert _post(client, PULL, {"ackedSeq": 0}, probe_token).json()["error"] == "bridge_only"
    device, token = _bridge(user)
    device_revoke(device=device, actor=user)
    response = _post(client, PULL, {"ackedSeq": 0}, token)
    assert (response.status_code, response.json()["error"]) == (403, "revoked")
    assert client.get(PULL).status_code == 405


@pytest.mark.django_db(transaction=True)
def test_pull_answers_at_once_with_items_acks_and_shows_online(client, user, hold):
    device, token = _bridge(user)
    connected = []
    device_connected.connect(lambda sender, device, **kw: connected.append(device.pk), weak=False, dispatch_uid="t")
    try:
        for n in range(3):
            outbox_enqueue(device=device, kind="mobile.message", payload={"n": n})
        first = _post(client, PULL, {"ackedSeq": 0}, token).json()
    finally:
        device_connected.disconnect(dispatch_uid="t")
    # (a bridge coming online is also told the mobile-reply switch: mobile.switch, after these)
    mine = [(i["seq"], i["payload"]["n"]) for i in first["items"] if i["kind"] == "mobile.message"]
    assert mine == [(1, 0), (2, 1), (3, 2)]
    last = first["items"][-1]["seq"]
    assert first["deviceId"] == str(device.pk) and connected == [device.pk]
    device.refresh_from_db()
    assert device.is_online and device.is_long_polling and device.ports == []
    # The next pull acks them; with nothing new it is held, then answers empty.
    second = _post(client, PULL, {"ackedSeq": last}, token).json()
    assert second["items"] == []
    assert not OutboxItem.objects.filter(device=device, acked_at__isnull=True).exists()
    assert Device.objects.get(pk=device.pk).acked_seq == last
    assert _post(client, PULL, {"ackedSeq": "x"}, token).status_code == 400


@pytest.mark.django_db(transaction=True)
def test_a_silent_long_poller_goes_offline_after_the_window(client, user, hold, settings):
    from datetime import timedelta

    from django.utils import timezone

    device, token = _bridge(user)
    outbox_enqueue(device=device, kind="k", payload={})
    _post(client, PULL, {"ackedSeq": 0}, token)
    assert Device.objects.get(pk=device.pk).is_online
    Device.objects.filter(pk=device.pk).update(last_seen_at=timezone.now() - timedelta(seconds=3.1))
    assert not Device.objects.get(pk=device.pk).is_online


@pytest.mark.django_db(transaction=True)
def test_push_runs_the_dispatcher_once_per_id(client, user, hold):
    device, token = _bridge(user)
    request_id = str(uuid.uuid4())
    body = {"id": request_id, "method": "devices.ping", "params": {}}
    first = _post(client, PUSH, body, token).json()
    assert first == {"id": request_id, "result": {"pong": True, "device_id": str(device.pk)}}
    assert _post(client, PUSH, body, token).json() == first
    unknown = _post(client, PUSH, {"id": "2", "method": "nope", "params": {}}, token).json()
    assert unknown["error"]["code"] == -32601
    assert _post(client, PUSH, {"id": "3", "method": "devices.ping", "params": []}, token).json()["error"][
        "code"] == -32602
    assert _post(client, PUSH, {"method": "devices.ping"}, token).status_code == 400
    assert _post(client, PUSH, body, "nope").status_code == 401


@pytest.mark.django_db(transaction=True)
async def test_a_second_pull_replaces_the_first(user, hold, settings):
    settings.DEVICE_LONGPOLL_HOLD_SEC = 10
    device, token = await database_sync_to_async(_bridge)(user)
    client = AsyncClient()
    headers = {"headers": {"Authorization": f"Bearer {token}"}}
    # Coming online the bridge is told the switch (mobile.switch): take that first.
    items = (await client.post(PULL, {"ackedSeq": 0}, content_type="application/json", **headers)).json()["items"]
    acked = items[-1]["seq"] if items else 0
    await Device.objects.filter(pk=device.pk).aupdate(channel_name="")
    first = asyncio.ensure_future(client.post(PULL, {"ackedSeq": acked}, content_type="application/json",
                                              **headers))

    async def channel() -> str:
        return (await Device.objects.aget(pk=device.pk)).channel_name

    for _ in range(200):
        if (await channel()).startswith(LONGPOLL_PREFIX):
            break
        await asyncio.sleep(0.02)
    held = await channel()
    assert held.startswith(LONGPOLL_PREFIX) and not first.done()
    second = asyncio.ensure_future(client.post(PULL, {"ackedSeq": acked}, content_type="application/json",
                                               **headers))
    replaced = await asyncio.wait_for(first, 5)
    assert (replaced.status_code, replaced.json()["error"]) == (409, "replaced")
    await database_sync_to_async(outbox_enqueue)(device=device, kind="k", payload={"x": 1})
    answered = await asyncio.wait_for(second, 5)
    assert [i["payload"] for i in answered.json()["items"]] == [{"x": 1}]


@pytest.mark.django_db(transaction=True)
def test_push_takes_a_request_up_to_the_frame_limit(client, user, hold):
    device, token = _bridge(user)
    body = {"id": "big", "method": "devices.ping", "params": {"pad": "x" * (3 * 1024 * 1024)}}  # > Django's 2.5 MB
    assert _post(client, PUSH, body, token).json()["result"]["pong"] is True
