"""The device tunnel consumer: auth, hello, outbox, acks, resume, abuse, heartbeat, replacement, calls."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.db import transaction
from django.utils import timezone

from ai1net.exceptions import ApplicationError, ValidationFailed
from clients import protocol
from devices import consumers, events, rpc, services, signals
from devices.errors import DeviceCallError, DeviceOffline, DeviceTimeout
from devices.models import Device, DeviceRequest, OutboxItem
from devices.web import relay
from tests.devices.tunnel_support import Device as FakeDevice

pytestmark = [pytest.mark.django_db(transaction=True)]

db = sync_to_async


@pytest.fixture(autouse=True)
def _isolated(isolated_device_signals):
    """Other apps react to connections (e.g. mobile enqueues its switch); these tests count seqs exactly."""


@pytest.fixture
def paired(user):
    device, token = services.device_create(owner=user, name="laptop", kind="bridge")
    return device, token


async def connected(token: str, acked_seq: int = 0) -> tuple[FakeDevice, dict]:
    dev = FakeDevice(token)
    await dev.open()
    reply = await dev.hello(acked_seq=acked_seq)
    return dev, reply


async def enqueue(device, n: int, kind: str = "test.item") -> None:
    def write():
        with transaction.atomic():
            for i in range(n):
                services.outbox_enqueue(device=device, kind=kind, payload={"i": i})

    await db(write)()


async def wait_db(condition, timeout: float = 5.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = await db(condition)()
        if value:
            return value
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {condition}"
        await asyncio.sleep(0.02)


# --- auth -------------------------------------------------------------------------------------

@pytest.mark.parametrize("token", [None, "ai1d_not-a-token"])
async def test_missing_or_bad_token_closes_4401(token):
    dev = FakeDevice(token)
    await dev.open()
    assert await dev.closed() == protocol.CLOSE_UNAUTHORIZED


async def test_revoked_device_closes_4403(paired, user):
    device, token = paired
    await db(services.device_revoke)(device=device, actor=user)
    dev = FakeDevice(token)
    await dev.open()
    assert await dev.closed() == protocol.CLOSE_REVOKED


async def test_token_in_the_url_is_not_accepted(paired):
    from channels.testing import WebsocketCommunicator

    from ai1net.asgi import application

    _, token = paired
    comm = WebsocketCommunicator(application, f"{protocol.TUNNEL_PATH}?token={token}")
    await comm.connect()
    output = await comm.receive_output(3)
    assert output == {"type": "websocket.close", "code": protocol.CLOSE_UNAUTHORIZED,
                      "reason": protocol.CLOSE_REASONS[protocol.CLOSE_UNAUTHORIZED]}


# --- hello and presence -----------------------------------------------------------------------

async def presence_event(layer, page: str) -> dict:
    """The next presence event a page's channel gets: one ``app.event`` (one change at a time here)."""
    message = await asyncio.wait_for(layer.receive(page), 10)
    assert message["type"] == "app.event", message
    return message["event"]


async def test_hello_makes_the_device_online_and_pushes_presence(paired, user, settings):
    settings.DEVICE_HEARTBEAT_SEC = 20
    device, token = paired
    layer = get_channel_layer()
    page = await layer.new_channel()
    await layer.group_add(events.user_group(user.pk), page)
    seen = []
    signals.device_connected.connect(lambda sender, device, hello, **kw: seen.append((device.pk, hello)), weak=False,
                                     dispatch_uid="t-connected")
    try:
        dev, reply = await connected(token)
        assert reply == {"deviceId": str(device.pk), "heartbeatSec": 20, "protocolVersion": protocol.PROTOCOL_VERSION,
                         "resendFrom": 1}
        event = await presence_event(layer, page)
        assert event["type"] == "devices.presence.changed"
        assert event["device_id"] == str(device.pk) and event["online"] is True and event["connection_count"] == 1
        fresh = await db(Device.objects.get)(pk=device.pk)
        assert fresh.is_online and fresh.capabilities == ["mobile"] and fresh.client_version == "test"
        assert seen and seen[0][0] == device.pk
        await dev.close()
        event = await presence_event(layer, page)
        assert event["online"] is False
        fresh = await db(Device.objects.get)(pk=device.pk)
        assert not fresh.is_online and fresh.disconnected_at is not None
    finally:
        signals.device_connected.disconnect(dispatch_uid="t-connected")


async def test_a_page_on_the_same_layer_gets_every_offline_event_as_tunnels_close(paired, user, settings):
    """channels_redis pops for all of a process's channels at once: a tunnel's consumer that closes while
    its receive holds that pop must not take the page's event with it (ai1net.consumers). Before the
    fix one close in four or five lost it here, so twenty in a row all failing to lose one is no luck."""
    settings.DEVICE_HEARTBEAT_SEC = 20
    _, token = paired
    layer = get_channel_layer()  # the one the consumers use, as a page on the same daphne would
    page = await layer.new_channel()
    await layer.group_add(events.user_group(user.pk), page)
    for _ in range(20):
        dev, _reply = await connected(token)
        assert (await presence_event(layer, page))["online"] is True
        await dev.close()
        assert (await presence_event(layer, page))["online"] is False


async def test_hello_is_required_first_and_validated(paired):
    _, token = paired
    dev = FakeDevice(token)
    await dev.open()
    reply = await dev.call("devices.ping", {})
    assert reply["error"]["code"] == protocol.INVALID_REQUEST
    await dev.send(protocol.request(protocol.HELLO, {"protocolVersion": "one"}, "h1"))
    assert (await dev.wait_for(lambda m: m.get("id") == "h1"))["error"]["code"] == protocol.INVALID_PARAMS
    await dev.send(protocol.request(protocol.HELLO, {"protocolVersion": 1, "kind": "probe"}, "h2"))
    assert "bridge" in (await dev.wait_for(lambda m: m.get("id") == "h2"))["error"]["message"]
    await dev.hello()
    await dev.send(protocol.request(protocol.HELLO, {"protocolVersion": 1}, "h3"))
    assert (await dev.wait_for(lambda m: m.get("id") == "h3"))["error"]["code"] == protocol.INVALID_REQUEST
    await dev.close()


# --- outbox -----------------------------------------------------------------------------------

async def test_outbox_is_delivered_in_order_and_acked(paired):
    device, token = paired
    await enqueue(device, 5)
    dev, _ = await connected(token)
    items = await dev.delivers(5)
    assert [i["seq"] for i in items] == [1, 2, 3, 4, 5]
    assert [i["payload"]["i"] for i in items] == [0, 1, 2, 3, 4] and items[0]["kind"] == "test.item"
    await dev.ack(3)
    await wait_db(lambda: OutboxItem.objects.filter(device=device, acked_at__isnull=False).count() == 3)
    await wait_db(lambda: Device.objects.get(pk=device.pk).acked_seq == 3)
    await dev.close()


async def test_doorbell_delivers_items_enqueued_while_connected(paired):
    device, token = paired
    dev, _ = await connected(token)
    assert await dev.nothing()
    await enqueue(device, 3)
    assert [i["seq"] for i in await dev.delivers(3)] == [1, 2, 3]
    await enqueue(device, 1)
    assert [i["seq"] for i in await dev.delivers(1)] == [4]
    await dev.close()


async def test_reconnect_resends_everything_after_acked_seq(paired):
    device, token = paired
    await enqueue(device, 6)
    dev, _ = await connected(token)
    await dev.delivers(6)
    await dev.ack(2)
    await wait_db(lambda: Device.objects.get(pk=device.pk).acked_seq == 2)
    await dev.close()
    # The device applied 4 (its ack of 3-4 got lost): it says so in hello.
    dev, reply = await connected(token, acked_seq=4)
    assert reply["resendFrom"] == 5
    assert [i["seq"] for i in await dev.delivers(2)] == [5, 6]
    assert await dev.nothing()
    assert await db(OutboxItem.objects.filter(device=device, seq__lte=4, acked_at__isnull=True).count)() == 0
    await dev.close()


async def test_at_most_a_window_is_in_flight(paired):
    from devices.consumers import WINDOW

    device, token = paired
    await enqueue(device, WINDOW + 40)
    dev, _ = await connected(token)
    first = await dev.delivers(WINDOW)
    assert first[-1]["seq"] == WINDOW
    assert await dev.nothing(0.5)
    await dev.ack(WINDOW)
    rest = await dev.delivers(40)
    assert [i["seq"] for i in rest] == list(range(WINDOW + 1, WINDOW + 41))
    await dev.close()


@pytest.mark.django_db
def test_one_doorbell_per_transaction(paired, django_capture_on_commit_callbacks):
    device, _ = paired
    other, _ = services.device_create(owner=device.owner, name="other", kind="probe")
    with django_capture_on_commit_callbacks() as callbacks:
        with transaction.atomic():
            for i in range(50):
                services.outbox_enqueue(device=device, kind="k", payload={"i": i})
            services.outbox_enqueue(device=other, kind="k", payload={})
            try:
                with transaction.atomic():  # a rolled-back savepoint takes its doorbell with it ...
                    services.outbox_enqueue(device=other, kind="k", payload={})
                    raise RuntimeError
            except RuntimeError:
                pass
            services.outbox_enqueue(device=device, kind="k", payload={"i": 50})
    assert len(callbacks) == 2  # one per device
    assert list(OutboxItem.objects.filter(device=device).values_list("seq", flat=True)) == list(range(1, 52))
    assert list(OutboxItem.objects.filter(device=other).values_list("seq", flat=True)) == [1]


async def _rung(device, write) -> dict:
    """What a connection of ``device`` in another process would get: its row names a channel no tunnel
    of this process holds; ``write`` runs in a worker thread, and the doorbell is read off that channel."""
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await db(Device.objects.filter(pk=device.pk).update)(channel_name=channel)
    await db(write)()
    return await asyncio.wait_for(layer.receive(channel), 5)


async def test_a_doorbell_to_another_process_carries_its_one_enqueues_frames(paired):
    device, _ = paired

    def write():
        with transaction.atomic():
            services.outbox_enqueue_many(device=device, items=[("k", {"i": 1}), ("k", {"i": 2})])

    message = await _rung(device, write)
    assert message["type"] == events.OUTBOX_DOORBELL
    frames = [(seq, json.loads(frame)) for seq, frame in message["frames"]]
    assert [(seq, f["method"], f["params"]["seq"], f["params"]["payload"]) for seq, f in frames] == [
        (1, protocol.DELIVER, 1, {"i": 1}), (2, protocol.DELIVER, 2, {"i": 2})]


async def test_two_enqueues_in_one_transaction_ring_once_without_frames(paired):
    device, _ = paired

    def write():
        with transaction.atomic():
            services.outbox_enqueue(device=device, kind="k", payload={"i": 1})
            try:
                with transaction.atomic():  # rolled back: its seq is given again below
                    services.outbox_enqueue(device=device, kind="k", payload={"gone": True})
                    raise RuntimeError
            except RuntimeError:
                pass
            services.outbox_enqueue(device=device, kind="k", payload={"i": 2})

    message = await _rung(device, write)
    assert message == {"type": events.OUTBOX_DOORBELL}  # read the outbox: it holds what committed


async def test_a_rolled_back_first_enqueue_takes_its_frames_with_it(paired):
    device, _ = paired

    def write():
        with transaction.atomic():
            try:
                with transaction.atomic():
                    services.outbox_enqueue(device=device, kind="k", payload={"gone": True})
                    raise RuntimeError
            except RuntimeError:
                pass
            services.outbox_enqueue(device=device, kind="k", payload={"kept": True})

    message = await _rung(device, write)
    assert [(seq, json.loads(frame)["params"]["payload"]) for seq, frame in message["frames"]] == [
        (1, {"kept": True})]


async def test_a_large_enqueue_rings_without_frames(paired):
    device, _ = paired
    big = "x" * (services.DOORBELL_FRAMES_MAX_BYTES + 1)
    message = await _rung(device, lambda: services.outbox_enqueue(device=device, kind="k", payload={"big": big}))
    assert message == {"type": events.OUTBOX_DOORBELL}


class _TunnelElsewhere:
    """A tunnel held by "another process": its relay here answers for it, but no consumer of this process
    is live on its channel (devices.live), so the enqueue rings instead of handing over."""

    closing = False
    hello_done = True

    def __init__(self, channel_name: str) -> None:
        self.channel_name, self.loop, self.rung = channel_name, asyncio.get_running_loop(), asyncio.Queue()

    async def devices_outbox(self, message: dict) -> None:
        self.rung.put_nowait(message)


async def test_a_doorbell_to_another_process_goes_to_its_relay_and_through_the_layer_when_that_fails(
        paired, monkeypatch):
    from devices import consumers
    from devices.web import relay

    device, _ = paired
    monkeypatch.setattr(relay, "enabled", lambda layer: True)  # scaled out (the layer may be in memory here)
    layer = get_channel_layer()
    tunnel = _TunnelElsewhere(await layer.new_channel())
    monkeypatch.setitem(consumers._web_tunnels, tunnel.channel_name, tunnel)
    address = await relay.serve()
    await db(Device.objects.filter(pk=device.pk).update)(channel_name=tunnel.channel_name, relay=address)
    try:
        await db(lambda: services.outbox_enqueue(device=device, kind="k", payload={"i": 1}))()
        message = await asyncio.wait_for(tunnel.rung.get(), 5)
        assert [(seq, json.loads(frame)["params"]["payload"]) for seq, frame in message["frames"]] == [(1, {"i": 1})]
        with pytest.raises(TimeoutError):  # not through the layer as well
            await asyncio.wait_for(layer.receive(tunnel.channel_name), 0.2)

        # A relay that cannot be reached (its process died): the layer carries the doorbell.
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            dead = f"127.0.0.1:{sock.getsockname()[1]}"
        await db(Device.objects.filter(pk=device.pk).update)(relay=dead)
        await db(lambda: services.outbox_enqueue(device=device, kind="k", payload={"i": 2}))()
        message = await asyncio.wait_for(layer.receive(tunnel.channel_name), 5)
        assert message["type"] == events.OUTBOX_DOORBELL and [seq for seq, _ in message["frames"]] == [2]
        assert tunnel.rung.empty()
    finally:
        relay.close_connections()


async def test_the_tunnel_sends_a_doorbells_frames_as_they_are_and_reads_past_a_gap(paired):
    device, token = paired
    dev, _ = await connected(token)
    channel = await db(lambda: Device.objects.get(pk=device.pk).channel_name)()
    layer = get_channel_layer()
    carried = protocol.notification(protocol.DELIVER, {"seq": 1, "kind": "carried", "payload": {"via": "doorbell"}})
    await layer.send(channel, {"type": events.OUTBOX_DOORBELL, "frames": [[1, carried]]})
    item = (await dev.delivers(1, timeout=3))[0]
    assert (item["seq"], item["kind"], item["payload"]) == (1, "carried", {"via": "doorbell"})  # not read: no row

    def write_silently():  # items 2 and 3 committed; the doorbell below lost the first of them
        Device.objects.filter(pk=device.pk).update(next_seq=4)
        OutboxItem.objects.create(device=device, seq=2, kind="read", payload={})
        OutboxItem.objects.create(device=device, seq=3, kind="read", payload={})

    await db(write_silently)()
    phantom = protocol.notification(protocol.DELIVER, {"seq": 3, "kind": "carried", "payload": {}})
    await layer.send(channel, {"type": events.OUTBOX_DOORBELL, "frames": [[3, phantom]]})
    items = await dev.delivers(2, timeout=3)
    assert [(i["seq"], i["kind"]) for i in items] == [(2, "read"), (3, "read")]
    await dev.close()


async def test_a_rolled_back_enqueue_leaves_no_gap(paired):
    device, _ = paired

    def write():
        try:
            with transaction.atomic():
                services.outbox_enqueue(device=device, kind="k", payload={})
                raise RuntimeError("caller failed")
        except RuntimeError:
            pass
        return services.outbox_enqueue(device=device, kind="k", payload={}).seq

    assert await db(write)() == 1


async def test_heartbeat_tick_reads_the_outbox_without_a_doorbell(paired, settings):
    settings.DEVICE_HEARTBEAT_SEC = 0.3
    device, token = paired
    dev, _ = await connected(token)

    def write_silently():
        # as another process on the in-memory layer would: no doorbell reaches this consumer
        Device.objects.filter(pk=device.pk).update(next_seq=2)
        OutboxItem.objects.create(device=device, seq=1, kind="quiet", payload={})

    await db(write_silently)()
    item = (await dev.delivers(1, timeout=3))[0]
    assert item["kind"] == "quiet"
    await dev.close()


# --- frames -----------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "frame,code",
    [
        ("{not json", protocol.PARSE_ERROR),
        ("[1, 2]", protocol.INVALID_REQUEST),
        ('{"jsonrpc": "1.0", "id": 1, "method": "x"}', protocol.INVALID_REQUEST),
        ('{"jsonrpc": "2.0", "id": 1, "method": "no.such.method", "params": {}}', protocol.METHOD_NOT_FOUND),
        ('{"jsonrpc": "2.0", "id": 1, "method": "devices.ping", "params": [1]}', protocol.INVALID_PARAMS),
    ],
)
async def test_malformed_frames_get_jsonrpc_errors_and_the_tunnel_lives(paired, frame, code):
    _, token = paired
    dev, _ = await connected(token)
    await dev.send(frame)
    reply = await dev.wait_for(lambda m: "error" in m)
    assert reply["error"]["code"] == code
    assert (await dev.call("devices.ping", {}))["result"]["pong"] is True
    await dev.close()


async def test_sustained_abuse_closes_4400(paired):
    _, token = paired
    dev, _ = await connected(token)
    for _ in range(25):
        await dev.send("garbage")
    assert await dev.closed() == protocol.CLOSE_PROTOCOL_ABUSE


async def test_oversized_frame_closes_4400(paired):
    _, token = paired
    dev, _ = await connected(token)
    await dev.send("x" * (protocol.MAX_FRAME_BYTES + 1))
    assert await dev.closed() == protocol.CLOSE_PROTOCOL_ABUSE


# --- heartbeat, replacement, revoke -----------------------------------------------------------

async def test_silent_peer_is_closed_4408(paired, settings):
    settings.DEVICE_HEARTBEAT_SEC = 0.2
    _, token = paired
    dev, reply = await connected(token)
    assert reply["heartbeatSec"] == 0.2
    heartbeat = await dev.comm.receive_output(2)
    assert json.loads(heartbeat["text"])["method"] == protocol.HEARTBEAT
    assert await dev.closed(timeout=3) == protocol.CLOSE_HEARTBEAT_TIMEOUT


async def test_heartbeats_keep_the_tunnel_open(paired, settings):
    settings.DEVICE_HEARTBEAT_SEC = 0.5
    _, token = paired
    dev, _ = await connected(token)
    for _ in range(25):  # 2.5 s: more than 3 beats; generous gaps for a loaded machine
        await dev.send(protocol.notification(protocol.HEARTBEAT))
        await asyncio.sleep(0.1)
    assert (await dev.call("devices.ping", {}))["result"]["pong"] is True
    await dev.close()


async def test_a_newer_connection_replaces_the_older_4409(paired):
    device, token = paired
    old, _ = await connected(token)
    new, _ = await connected(token)
    assert await old.closed() == protocol.CLOSE_REPLACED
    await old.close()
    fresh = await db(Device.objects.get)(pk=device.pk)
    assert fresh.is_online and fresh.connection_count == 2
    await enqueue(device, 1)
    assert (await new.delivers(1))[0]["seq"] == 1
    await new.close()


async def test_revoke_closes_the_live_tunnel_4403(paired, user):
    device, token = paired
    dev, _ = await connected(token)
    await db(services.device_revoke)(device=device, actor=user)
    assert await dev.closed() == protocol.CLOSE_REVOKED
    await dev.close()
    again = FakeDevice(token)
    await again.open()
    assert await again.closed() == protocol.CLOSE_REVOKED


async def test_ephemeral_token_dies_after_the_grace(user, settings):
    settings.DEVICE_EPHEMERAL_GRACE_SEC = 0.3
    device, token = await db(services.device_create)(owner=user, name="probe", kind="probe", ephemeral=True)
    dev = FakeDevice(token)
    await dev.open()
    await dev.hello(kind="probe")
    await dev.close()
    await wait_db(lambda: Device.objects.get(pk=device.pk).status == Device.Status.REVOKED, timeout=5)


async def test_ephemeral_reconnect_within_the_grace_survives(user, settings):
    settings.DEVICE_EPHEMERAL_GRACE_SEC = 0.5
    device, token = await db(services.device_create)(owner=user, name="probe", kind="probe", ephemeral=True)
    dev = FakeDevice(token)
    await dev.open()
    await dev.hello(kind="probe")
    await dev.close()
    dev = FakeDevice(token)
    await dev.open()
    await dev.hello(kind="probe")
    await asyncio.sleep(1.0)  # past the grace while connected: must stay active
    assert (await db(Device.objects.get)(pk=device.pk)).status == Device.Status.ACTIVE
    await dev.close()


async def test_ephemeral_dead_process_is_caught_at_connect(user, settings):
    settings.DEVICE_EPHEMERAL_GRACE_SEC = 1
    device, token = await db(services.device_create)(owner=user, name="probe", kind="probe", ephemeral=True)
    await db(Device.objects.filter(pk=device.pk).update)(disconnected_at=timezone.now() - timedelta(seconds=5))
    dev = FakeDevice(token)
    await dev.open()
    assert await dev.closed() == protocol.CLOSE_REVOKED
    assert (await db(Device.objects.get)(pk=device.pk)).status == Device.Status.REVOKED


# --- device -> platform requests --------------------------------------------------------------

CALLS = []


@rpc.device_method("tests.count")
def _count(device, params):
    CALLS.append(params)
    return {"n": len(CALLS)}


@rpc.device_method("tests.fail")
def _fail(device, params):
    if params.get("how") == "invalid":
        raise ValidationFailed("bad question")
    if params.get("how") == "app":
        raise ApplicationError("mobile reply is off", code="mobile_reply_off", status=409)
    raise RuntimeError("boom")


async def test_device_requests_are_idempotent_by_id(paired):
    device, token = paired
    CALLS.clear()
    dev, _ = await connected(token)
    first = await dev.call("tests.count", {"a": 1}, request_id="req-1")
    again = await dev.call("tests.count", {"a": 1}, request_id="req-1")
    assert first["result"] == again["result"] == {"n": 1}
    assert len(CALLS) == 1
    await dev.close()
    dev, _ = await connected(token)  # a retry after a reconnect
    assert (await dev.call("tests.count", {"a": 1}, request_id="req-1"))["result"] == {"n": 1}
    assert (await dev.call("tests.count", {}, request_id="req-2"))["result"] == {"n": 2}
    assert await db(DeviceRequest.objects.filter(device=device).count)() == 2
    await dev.close()


RAN: list[tuple[str, int]] = []
_running = [0]


@rpc.device_method("tests.where")
def _where(device, params):
    _running[0] += 1
    try:
        time.sleep(0.05)  # long enough for the other requests to be waiting meanwhile
        RAN.append((threading.current_thread().name, _running[0]))
    finally:
        _running[0] -= 1
    return {}


async def test_device_requests_run_one_at_a_time_in_a_thread_of_their_own(paired):
    """Not on Channels' thread-sensitive thread, which every consumer of the process shares (and whose hop
    costs more): devices.consumers.device_request_hop."""
    _, token = paired
    RAN.clear()
    dev, _ = await connected(token)
    for i in range(3):  # sent together: the later ones wait while the first sleeps
        await dev.send(protocol.request("tests.where", {}, f"w{i}"))
    replies = [await dev.wait_for(lambda m, i=i: m.get("id") == f"w{i}" and "method" not in m) for i in range(3)]
    assert all("result" in reply for reply in replies), replies
    assert [name for name, _ in RAN] == ["device-request-db_0"] * 3
    assert [running for _, running in RAN] == [1, 1, 1]  # one at a time, as before
    await dev.close()


@pytest.mark.parametrize("how,code,app_code", [
    ("invalid", protocol.INVALID_PARAMS, "invalid"),
    ("app", protocol.APPLICATION_ERROR, "mobile_reply_off"),
    ("crash", protocol.INTERNAL_ERROR, None),
])
async def test_device_request_errors_are_mapped(paired, how, code, app_code):
    _, token = paired
    dev, _ = await connected(token)
    reply = await dev.call("tests.fail", {"how": how})
    assert reply["error"]["code"] == code
    if app_code:
        assert reply["error"]["data"]["code"] == app_code
    assert (await dev.call("devices.ping", {}))["result"]["pong"] is True
    await dev.close()


# --- platform -> device calls -----------------------------------------------------------------

async def answer_calls(dev: FakeDevice, handler) -> None:
    while True:
        message = await dev.wait_for(lambda m: "method" in m and "id" in m and m["method"] != protocol.HELLO, 10)
        await dev.send(handler(message))


@pytest.fixture(params=["here", "layer"])
def call_route(request, monkeypatch):
    """adevice_call's two routes in one process: straight to the tunnel consumer on this event loop, or
    through the channel layer (as from a worker's own loop, or with relays off). The other route fails the
    test if it is taken. The relay's route is in tests/deviceweb/test_relay.py and test_e2e_probe.py."""
    def not_this_route(*args, **kwargs):
        raise AssertionError(f"not the {request.param!r} route")

    if request.param == "here":
        monkeypatch.setattr(services, "_call_via_layer", not_this_route)
    else:
        monkeypatch.setattr(consumers, "local_tunnel", lambda channel: None)
        monkeypatch.setattr(relay, "enabled", lambda layer: False)  # with Redis, this process's relay would take it
        monkeypatch.setattr(services, "_call_here", not_this_route)
    return request.param


async def test_device_call_round_trip(paired, call_route):
    device, token = paired
    dev, _ = await connected(token)
    responder = asyncio.create_task(answer_calls(dev, lambda m: protocol.result(m["id"], {"pong": True, **m["params"]})))
    try:
        results = await asyncio.gather(*[
            services.adevice_call(device=device, method="bridge.ping", params={"n": n}, timeout=5) for n in range(20)
        ])
        assert sorted(r["n"] for r in results) == list(range(20))
    finally:
        responder.cancel()
    await dev.close()


async def test_device_call_error_is_raised(paired, call_route):
    device, token = paired
    dev, _ = await connected(token)
    responder = asyncio.create_task(answer_calls(dev, lambda m: protocol.error(
        m["id"], protocol.APPLICATION_ERROR, "no such file", {"code": "not_found"})))
    try:
        with pytest.raises(DeviceCallError) as caught:
            await services.adevice_call(device=device, method="probe.read", params={}, timeout=5)
        assert caught.value.code == "not_found" and caught.value.detail == "no such file"
        assert caught.value.status == 502
    finally:
        responder.cancel()
    await dev.close()


async def test_device_call_offline_and_timeout(paired, call_route):
    device, token = paired
    with pytest.raises(DeviceOffline):
        await services.adevice_call(device=device, method="bridge.ping", params={}, timeout=1)
    dev, _ = await connected(token)
    with pytest.raises(DeviceTimeout):
        await services.adevice_call(device=device, method="bridge.ping", params={}, timeout=0.3)
    tunnel = consumers._web_tunnels[(await sync_to_async(Device.objects.get)(pk=device.pk)).channel_name]
    # Straight to the consumer, a call that timed out is forgotten there (its late answer is dropped).
    assert (not tunnel.calls) if call_route == "here" else len(tunnel.calls) == 1
    await dev.close()


async def test_device_call_fails_fast_when_the_tunnel_drops(paired, call_route):
    device, token = paired
    dev, _ = await connected(token)
    call = asyncio.create_task(services.adevice_call(device=device, method="bridge.ping", params={}, timeout=10))
    await dev.wait_for(lambda m: m.get("method") == "bridge.ping")
    started = asyncio.get_running_loop().time()
    await dev.close()
    with pytest.raises(DeviceOffline):
        await call
    assert asyncio.get_running_loop().time() - started < 5


async def test_stream_notifications_are_routed_to_the_opener(paired):
    device, token = paired
    dev, _ = await connected(token)
    layer = get_channel_layer()
    mine = await layer.new_channel()
    tunnel = (await sync_to_async(Device.objects.get)(pk=device.pk)).channel_name  # the live connection's
    await layer.send(tunnel, {"type": "device.stream_open", "stream": "s1", "reply_channel": mine})
    await layer.send(tunnel, {"type": "device.forward", "frame": protocol.notification("web.open", {"stream": "s1"})})
    forwarded = await dev.wait_for(lambda m: m.get("method") == "web.open")
    assert forwarded["params"] == {"stream": "s1"}
    await dev.send(protocol.notification("web.data", {"stream": "s1", "chunk": "aGk="}))
    got = await asyncio.wait_for(layer.receive(mine), 3)
    assert got["type"] == "device.stream" and got["frame"]["params"]["chunk"] == "aGk="
    await dev.close()
    closed = await asyncio.wait_for(layer.receive(mine), 3)
    assert closed == {"type": "device.stream.closed", "stream": "s1"}


def test_enqueued_items_are_stored_as_given_with_consecutive_seqs(user):
    device, _token = services.device_create(owner=user, name="d", kind="bridge")
    items = [("a", {"text": "日本語 \u2028 😀 'quoted' \"double\"", "nested": [{"x": None, "y": 1.5}]}),
             ("b", {}), ("c", {"n": 10**15})]
    rows = services.outbox_enqueue_many(device=device, items=items)
    again = services.outbox_enqueue(device=device, kind="d", payload={"last": True})
    assert [row.seq for row in rows] + [again.seq] == [1, 2, 3, 4] and device.next_seq == 5
    stored = list(OutboxItem.objects.filter(device=device).order_by("seq").values_list("seq", "kind", "payload"))
    assert stored == [(1, "a", items[0][1]), (2, "b", {}), (3, "c", {"n": 10**15}), (4, "d", {"last": True})]
    assert Device.objects.get(pk=device.pk).next_seq == 5
    device.delete()
    with pytest.raises(ApplicationError):
        services.outbox_enqueue(device=device, kind="e", payload={})
    assert not OutboxItem.objects.filter(kind="e").exists()
