"""What one tunnel costs the database: statements per connect, per delivered item, per ack (issue 10).

The tunnel's ORM calls run in worker threads (each its own connection), so the statements are counted
for every connection at once: ``CursorWrapper._execute`` is wrapped for the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator

import pytest
from asgiref.sync import sync_to_async
from django.db import connection
from django.db.backends.utils import CursorWrapper

from devices import services
from devices.models import Device, OutboxItem
from tests.devices.tunnel_support import Device as FakeDevice

pytestmark = [pytest.mark.django_db(transaction=True)]

db = sync_to_async


@pytest.fixture(autouse=True)
def _isolated(isolated_device_signals):
    """Count the tunnel's own statements: other apps' receivers are theirs to count."""


class Statements:
    def __init__(self) -> None:
        self.sql: list[str] = []
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.sql)

    def clear(self) -> None:
        with self.lock:
            self.sql.clear()


def work(sql: list[str]) -> list[str]:
    """The statements that read or write (not BEGIN / SAVEPOINT / RELEASE of a transaction, nor the SET LOCAL
    of an ack's commit mode on PostgreSQL)."""
    return [s for s in sql if not s.lstrip().upper().startswith(("BEGIN", "SAVEPOINT", "RELEASE", "SET LOCAL"))]


@pytest.fixture
def statements(monkeypatch) -> Statements:
    seen = Statements()
    execute, executemany = CursorWrapper._execute, CursorWrapper._executemany

    def counted(self, sql, *args, **kwargs):
        with seen.lock:
            seen.sql.append(sql)
        return execute(self, sql, *args, **kwargs)

    def counted_many(self, sql, *args, **kwargs):
        with seen.lock:
            seen.sql.append(sql)
        return executemany(self, sql, *args, **kwargs)

    monkeypatch.setattr(CursorWrapper, "_execute", counted)
    monkeypatch.setattr(CursorWrapper, "_executemany", counted_many)
    return seen


async def settle(seconds: float = 0.3) -> None:
    await asyncio.sleep(seconds)  # background writes (signals, coalesced acks) finish


async def test_statements_per_connect_and_disconnect(user, statements):
    device, token = await db(services.device_create)(owner=user, name="d", kind="bridge")
    statements.clear()
    dev = FakeDevice(token)
    await dev.open()
    await dev.hello()
    await settle()
    connect = list(statements.sql)
    print("connect:", *connect, sep="\n  ")
    statements.clear()
    await dev.close()
    await settle()
    disconnect = list(statements.sql)
    print("disconnect:", *disconnect, sep="\n  ")
    assert len(work(connect)) <= 2, connect  # the token's device (with its owner), the hello's one UPDATE
    assert len(work(disconnect)) <= 1, disconnect
    if connection.vendor == "postgresql":
        # The hello's presence write is one statement that relaxes its own commit: no BEGIN, SET LOCAL or COMMIT.
        # The disconnect's commits durably (a device that does not come back never says it again).
        assert len(connect) == 2 and "set_config('synchronous_commit', 'off', true)" in connect[1], connect
        assert len(disconnect) == 1 and "synchronous_commit" not in disconnect[0], disconnect
    fresh = await db(Device.objects.get)(pk=device.pk)
    assert fresh.connection_count == 1 and not fresh.is_online and fresh.disconnected_at is not None


async def test_a_reconnect_with_unsent_items_reads_the_outbox_once(user, statements):
    device, token = await db(services.device_create)(owner=user, name="d", kind="bridge")
    await db(services.outbox_enqueue_many)(device=device, items=[("k", {"i": i}) for i in range(3)])
    statements.clear()
    dev = FakeDevice(token)
    await dev.open()
    await dev.hello()
    assert [i["seq"] for i in await dev.delivers(3)] == [1, 2, 3]
    await settle()
    assert len(work(statements.sql)) <= 3, statements.sql  # token, hello, one read of the outbox
    await dev.close()


async def test_an_item_enqueued_in_this_process_is_sent_without_reading_it_back(user, statements):
    device, token = await db(services.device_create)(owner=user, name="d", kind="bridge")
    dev = FakeDevice(token)
    await dev.open()
    await dev.hello()
    await settle()
    statements.clear()
    await db(services.outbox_enqueue)(device=device, kind="k", payload={"n": 1})
    enqueue = len(statements)
    item = (await dev.delivers(1))[0]
    assert item == {"seq": 1, "kind": "k", "payload": {"n": 1}}
    await dev.ack(1)
    await settle(0.5)  # the coalesced ack is written in the background
    after = statements.sql[enqueue:]
    assert await db(lambda: OutboxItem.objects.get(device=device, seq=1).acked_at is not None)()
    assert await db(lambda: Device.objects.get(pk=device.pk).acked_seq)() == 1
    print("enqueue:", *statements.sql[:enqueue], "deliver + ack:", *after, sep="\n  ")
    assert not [s for s in after if s.lstrip().upper().startswith("SELECT")], after  # no read-back
    assert len(work(after)) <= 2, after  # the ack: the items and the device's acked_seq ...
    assert len(after) - len(work(after)) <= 1, after  # ... in one transaction (PostgreSQL: one commit)
    if connection.vendor == "postgresql":  # one statement, one round trip: no BEGIN, no SET LOCAL
        assert len(after) == 1 and "synchronous_commit" in after[0], after
    await dev.close()


def test_an_enqueue_outside_a_transaction_opens_none_on_postgresql(user):
    """On PostgreSQL the seqs' UPDATE and the item's INSERT are one statement, which commits by itself: an enqueue
    outside a transaction is that one round trip (no BEGIN, no COMMIT). Inside one, it joins it."""
    from django.db import transaction
    from django.test.utils import CaptureQueriesContext

    device, _token = services.device_create(owner=user, name="d", kind="bridge")
    with CaptureQueriesContext(connection) as captured:
        services.outbox_enqueue(device=device, kind="k", payload={"n": 1})
    sql = [query["sql"] for query in captured.captured_queries]
    if connection.vendor == "postgresql":
        assert len(sql) == 1 and "INSERT INTO" in sql[0], sql
    assert OutboxItem.objects.get(device=device, seq=1).payload == {"n": 1}
    with contextlib.suppress(RuntimeError), transaction.atomic():
        services.outbox_enqueue(device=device, kind="k", payload={"n": 2})
        raise RuntimeError("the caller's transaction fails")
    assert not OutboxItem.objects.filter(device=device, seq=2).exists()
    assert Device.objects.get(pk=device.pk).next_seq == 2


def test_the_token_read_compiled_once_gives_what_the_orm_gives(user):
    from devices import selectors

    device, token = services.device_create(owner=user, name="d", kind="bridge")
    Device.objects.filter(pk=device.pk).update(capabilities=["mobile"], ports=[20001], channel_name="c")
    for _ in range(2):  # the first call compiles, the second reuses
        got = selectors.device_by_token(raw_token=token)
        expected = Device.objects.select_related("owner").get(pk=device.pk)
        assert got is not None and got.pk == device.pk
        for field in Device._meta.concrete_fields:
            assert getattr(got, field.attname) == getattr(expected, field.attname), field.name
        assert got.owner.pk == user.pk and got.owner.username == user.username  # no query: selected with it
        assert Device.owner.is_cached(got)
    assert selectors.device_by_token(raw_token="ai1d_unknown") is None
    assert selectors.device_by_token(raw_token="") is None


@contextlib.asynccontextmanager
async def bridge_with_receiver(user, receiver) -> AsyncIterator[str]:
    """A bridge that holds the switch already (mobile reply enqueues nothing when it connects), with
    ``receiver`` on ``device_connected`` for the block; yields its token."""
    from devices import signals
    from mobile.models import BridgeSwitchSent

    device, token = await db(services.device_create)(owner=user, name="d", kind="bridge")
    await db(BridgeSwitchSent.objects.create)(device=device, enabled=False)
    signals.device_connected.connect(receiver, weak=False, dispatch_uid="t-connect-receiver")
    try:
        yield token
    finally:
        signals.device_connected.disconnect(dispatch_uid="t-connect-receiver")


async def test_what_a_connect_receiver_enqueues_is_sent_without_reading_the_outbox(user, statements):
    def enqueue_on_connect(sender, device, **kwargs):
        services.outbox_enqueue(device=device, kind="hello.state", payload={"on": True})

    async with bridge_with_receiver(user, enqueue_on_connect) as token:  # the only receiver that enqueues
        statements.clear()
        dev = FakeDevice(token)
        await dev.open()
        await dev.hello()
        item = (await dev.delivers(1))[0]
        assert item == {"seq": 1, "kind": "hello.state", "payload": {"on": True}}
        await settle()
        assert not [s for s in statements.sql if "devices_outboxitem" in s and s.lstrip().startswith("SELECT")]
        await dev.close()


async def test_a_receiver_changing_its_device_does_not_change_the_hellos(user, statements):
    """The receivers run in the database thread while the hello goes on on the loop: each gets a copy."""
    def meddle(sender, device, **kwargs):
        device.next_seq += 5  # at once, without a database trip: before the loop reads it

    async with bridge_with_receiver(user, meddle) as token:
        statements.clear()
        dev = FakeDevice(token)
        await dev.open()
        await dev.hello()
        await settle()
        assert not [s for s in statements.sql if "devices_outboxitem" in s], statements.sql
        await dev.close()


async def test_items_from_concurrent_producers_in_this_process_arrive_once_each_in_order(user):
    """Hand-overs can reach the tunnel out of commit order (threads race after commit): what does not
    follow what was sent makes it read the outbox; nothing is sent twice, nothing is skipped."""
    device, token = await db(services.device_create)(owner=user, name="d", kind="bridge")
    dev = FakeDevice(token)
    await dev.open()
    await dev.hello()

    def produce(n: int, tag: str) -> None:
        try:
            for i in range(n):
                services.outbox_enqueue(device=device, kind="k", payload={"tag": tag, "i": i})
        finally:
            # The worker thread's connection, as tests/mobile/test_concurrency.py's threads close theirs: left
            # checked out of PostgreSQL's pool, it kept the test database from being dropped after the run.
            connection.close()

    producers = [sync_to_async(produce, thread_sensitive=False)(40, tag) for tag in "abcd"]
    receiver = asyncio.ensure_future(dev.delivers(160, timeout=20))
    await asyncio.gather(*producers)
    got = await receiver
    assert [item["seq"] for item in got] == list(range(1, 161))
    assert sorted((item["payload"]["tag"], item["payload"]["i"]) for item in got) == sorted(
        (tag, i) for tag in "abcd" for i in range(40))
    await dev.ack(160)
    assert await dev.nothing(0.5)  # and nothing comes again
    await dev.close()


async def test_a_lost_hand_over_is_found_by_the_sweep(user, settings, monkeypatch):
    from devices import live

    settings.DEVICE_HEARTBEAT_SEC = 0.3
    device, token = await db(services.device_create)(owner=user, name="d", kind="bridge")
    dev = FakeDevice(token)
    await dev.open()
    await dev.hello()
    monkeypatch.setattr(live, "hand_over", lambda channel_name, frames: False)  # as if its loop had missed it
    await db(services.outbox_enqueue)(device=device, kind="k", payload={})
    assert (await dev.delivers(1, timeout=3))[0]["seq"] == 1
    await dev.close()


def test_the_device_read_by_id_compiled_once_gives_what_the_orm_gives(user):
    from devices import selectors

    device, _token = services.device_create(owner=user, name="d", kind="bridge")
    for _ in range(2):
        got = selectors.device_with_owner(device_id=device.pk)
        expected = Device.objects.select_related("owner").get(pk=device.pk)
        assert [getattr(got, f.attname) for f in Device._meta.concrete_fields] == [
            getattr(expected, f.attname) for f in Device._meta.concrete_fields]
        assert Device.owner.is_cached(got) and got.owner.username == user.username
    assert selectors.device_with_owner(device_id=Device._meta.pk.get_default()) is None


def test_a_device_request_compiles_no_query_once_warm(user, monkeypatch):
    """Every request a device makes (a hook's event, a question) reads its record and its device and writes
    the record: statements written once, not compiled by Django per request."""
    from django.db.models.sql.compiler import SQLCompiler, SQLInsertCompiler

    from devices.models import DeviceRequest
    from devices.rpc import dispatch

    device, _token = services.device_create(owner=user, name="d", kind="bridge")
    assert dispatch(device, "warm", "devices.ping", {})["result"]["pong"] is True
    compiled: list[str] = []

    def counting(real):
        def counted(self, *args, **kwargs):
            compiled.append(type(self).__name__)
            return real(self, *args, **kwargs)
        return counted

    for compiler in (SQLCompiler, SQLInsertCompiler):
        monkeypatch.setattr(compiler, "as_sql", counting(compiler.as_sql))
    assert dispatch(device, "r1", "devices.ping", {}) == {"result": {"pong": True, "device_id": str(device.pk)}}
    assert dispatch(device, "r1", "devices.ping", {}) == {"result": {"pong": True, "device_id": str(device.pk)}}
    assert compiled == []
    monkeypatch.undo()
    assert DeviceRequest.objects.get(device=device, request_id="r1").response["result"]["pong"] is True
