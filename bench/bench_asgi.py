"""The ai1net application plus what the benchmark needs (never part of the app):

- ``/ws/echo``: a bare Channels echo consumer (direct send), the baseline;
- ``/ws/echo-layer``: the same echo through a channel-layer group_send (the doorbell's path);
- ``/ws/echo-layer?listen=0``: a sender only (does not join its group): with ``?group=NAME`` on both
  sockets, a message sent on one daphne reaches a socket on another through the layer (one way);
- the device method ``bench.enqueue {n}``: writes n outbox items for the calling device in one
  transaction (one doorbell), so the benchmark can drive the real outbox path inside daphne;
- ``/ws/bench-outbox``: each text frame is a device id; ``services.outbox_enqueue`` writes one item for
  it in the thread of the devices' requests, as a device's request does (``devices.consumers``);
- ``/ws/bench-acks``: the first text frame is a device id; from then on, each time this process has
  recorded an ack of that device (``services.outbox_ack`` returned: committed), the socket gets
  ``{"acked": seq}``. Together: enqueue (durable) -> deliver -> ack -> ack recorded (durable).
- ``/ws/bench-call``: each text frame is a device id; the platform calls that device's ``bench.echo``
  (``services.device_call`` from a worker thread, as the probes' background calls are made) and the
  socket gets the result as JSON.
- floors, the least each tunnel row's path must do, without the product (bench/tunnel.py measures them beside
  the rows): ``/ws/floor-device?key=K`` and ``/ws/floor-outbox?key=K`` for deliver -> ack (each frame on the
  outbox socket: one durable INSERT in a thread as a device's request makes it, its id sent to the device
  socket; the device's ack: one UPDATE with the ack's relaxed commit in a tunnel-like database thread, then
  ``{"acked": id}`` on the outbox socket; across processes, ``?line=1`` on the device socket and ``?to=PORT``
  on the other process's outbox socket send each item over a bare loopback line between the two, and an
  outbox socket of the same key on the device's process gets the acks); ``/ws/floor-connect`` for a connect
  (the bearer token's device read after the accept, one presence write with the hello's relaxed commit on the
  first frame, then the frame echoed);
- ``GET /bench/gc``: the cyclic collector's work in this process since the last such GET (``gc.callbacks``):
  ``{"collections": n, "ms": total, "longest_ms": ..., "full": n, "longest": {"generation", "collected"}}``;
  every socket of the process waits while it runs.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import json
import os
import time
import uuid
from typing import Any
from urllib.parse import parse_qs

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings_bench")

from asgiref.sync import sync_to_async  # noqa: E402
from channels.generic.websocket import AsyncWebsocketConsumer  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.db import connection  # noqa: E402
from django.urls import path, re_path  # noqa: E402
from django.utils import timezone  # noqa: E402

from ai1net import realtime  # noqa: E402
from ai1net.asgi import application as ai1net_application  # noqa: E402
from ai1net.consumers import LoopDispatch  # noqa: E402
from ai1net.db_threads import DatabaseThreads, default_count  # noqa: E402
from devices import services  # noqa: E402
from devices.consumers import _bearer, device_request_hop  # noqa: E402
from devices.models import Device  # noqa: E402
from devices.rpc import device_method  # noqa: E402


def _query(scope: dict[str, Any]) -> dict[str, list[str]]:
    return parse_qs(scope.get("query_string", b"").decode())


class EchoConsumer(AsyncWebsocketConsumer):
    async def receive(self, text_data=None, bytes_data=None):
        await self.send(text_data=text_data)


class LayerEchoConsumer(AsyncWebsocketConsumer):
    async def connect(self):
        query = _query(self.scope)
        self.group = query.get("group", [f"echo.{uuid.uuid4().hex}"])[0]
        self.listen = query.get("listen", ["1"])[0] != "0"
        if self.listen:
            await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def disconnect(self, code):
        if self.listen:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive(self, text_data=None, bytes_data=None):
        await self.channel_layer.group_send(self.group, {"type": "echo.message", "text": text_data})

    async def echo_message(self, message):
        await self.send(text_data=message["text"])


@device_method("bench.enqueue")
def bench_enqueue(device, params):
    n = int(params.get("n", 1))
    services.outbox_enqueue_many(device=device, items=[("bench.item", {"i": i, "pad": "x" * 120}) for i in range(n)])
    return {"n": n}


@functools.cache
def _held_device(device_id: str) -> Device:
    """The device as the product's callers hold it, read once before (an answer's comes with its question):
    a model built for each enqueue (16-21 µs of ``Model.__init__``) was the bench's own cost inside the
    row's timing. The enqueue reads its pk and leaves its next_seq on it."""
    return Device(pk=device_id)


def _enqueue_one(device_id: str) -> None:
    services.outbox_enqueue(device=_held_device(device_id), kind="bench.item", payload={"pad": "x" * 120})


class _Lean(LoopDispatch, AsyncWebsocketConsumer):
    """No close_old_connections trip per message (as our consumers): the bench's scaffolding should cost
    as little as it can; the ORM call below closes old connections around itself."""


class EnqueueConsumer(_Lean):
    async def receive(self, text_data=None, bytes_data=None):
        # As a device's request enqueues (devices.consumers: its thread, its hop): the hand-over to the tunnel
        # leaves with the thread's result (ai1net.realtime.collecting).
        await realtime.collecting(device_request_hop, _enqueue_one)(text_data)


class CallConsumer(_Lean):
    async def receive(self, text_data=None, bytes_data=None):
        # Not thread-sensitive: as probes.services runs its calls, in a worker whose device_call
        # (async_to_sync) runs the call on this loop.
        result = await sync_to_async(services.device_call, thread_sensitive=False)(
            device=Device(pk=text_data), method="bench.echo", params={"pad": "x" * 120}, timeout=30)
        await self.send(text_data=json.dumps(result))


_ack_watchers: dict[str, tuple[asyncio.AbstractEventLoop, Any]] = {}


class AckWatchConsumer(_Lean):
    device_id = ""

    async def receive(self, text_data=None, bytes_data=None):
        self.device_id = text_data
        _ack_watchers[text_data] = (asyncio.get_running_loop(), self)
        await self.send(text_data="ready")

    async def disconnect(self, code):
        _ack_watchers.pop(self.device_id, None)


_outbox_ack = services.outbox_ack


def _watched_outbox_ack(*, device_id: Any, seq: int, **kwargs: Any) -> None:
    _outbox_ack(device_id=device_id, seq=seq, **kwargs)
    watcher = _ack_watchers.get(str(device_id))
    if watcher is not None:
        loop, consumer = watcher
        frame = json.dumps({"acked": seq})
        loop.call_soon_threadsafe(lambda: asyncio.ensure_future(consumer.send(text_data=frame)))


services.outbox_ack = _watched_outbox_ack  # the tunnel looks it up at call time

# --- floors --------------------------------------------------------------------------------------
# Threads as the product's: one for a device's requests (device_request_hop), the tunnel's count for its own.
_floor_request_db = DatabaseThreads(1, "floor-request-db")
_floor_tunnel_db = DatabaseThreads(default_count(), "floor-tunnel-db")
_floor_devices: dict[str, Any] = {}
_floor_outboxes: dict[str, Any] = {}
_FLOOR_TABLE = {
    "sqlite": "CREATE TABLE IF NOT EXISTS bench_floor_item (id integer PRIMARY KEY AUTOINCREMENT, "
              "payload text NOT NULL, acked boolean NOT NULL DEFAULT FALSE)",
    "postgresql": "CREATE TABLE IF NOT EXISTS bench_floor_item (id bigserial PRIMARY KEY, payload text NOT NULL, "
                  "acked boolean NOT NULL DEFAULT FALSE)",
}


def _relaxed(update: str) -> str:
    """On PostgreSQL the statement relaxes its own commit, as the product's ack and hello do."""
    return services._relaxing_own_commit(update) if connection.vendor == "postgresql" else update


def _floor_create_table() -> None:
    with connection.cursor() as cursor:
        cursor.execute(_FLOOR_TABLE[connection.vendor])


def _floor_insert(payload: str) -> int:
    with connection.cursor() as cursor:  # autocommit: the statement commits durably by itself
        cursor.execute("INSERT INTO bench_floor_item (payload) VALUES (%s) RETURNING id", [payload])
        return int(cursor.fetchone()[0])


def _floor_ack(item_id: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(_relaxed("UPDATE bench_floor_item SET acked = TRUE WHERE id = %s"), [item_id])


_device_table = Device._meta.db_table


def _floor_device_id(raw_token: str) -> Any:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id FROM {_device_table} WHERE token_hash = %s", [services.hash_secret(raw_token)])  # noqa: S608
        row = cursor.fetchone()
    return row[0] if row else None


def _floor_seen(device_id: Any) -> None:
    now = Device._meta.get_field("last_seen_at").get_db_prep_save(timezone.now(), connection)
    with connection.cursor() as cursor:
        cursor.execute(_relaxed(f"UPDATE {_device_table} SET last_seen_at = %s WHERE id = %s"),  # noqa: S608
                       [now, device_id])


class _Keyed(_Lean):
    """A socket found by its ``?key=`` in its class's ``registry`` (each subclass names its own dict)."""

    registry: dict[str, Any]

    async def connect(self):
        self.key = _query(self.scope).get("key", [""])[0]
        self.registry[self.key] = self
        await self.accept()

    async def disconnect(self, code):
        if self.registry.get(self.key) is self:
            del self.registry[self.key]


class _FloorLine:
    """The bare route between two daphne processes for the cross-process floor: this process listens on a
    loopback port (started once); each line ``key<TAB>frame`` from another process goes to that key's device
    socket here. One kept connection per sending socket, as the product's stream relay keeps one."""

    server: asyncio.AbstractServer | None = None

    @classmethod
    async def port(cls) -> int:
        if cls.server is None:
            cls.server = await asyncio.start_server(cls._serve, "127.0.0.1", 0)
        return cls.server.sockets[0].getsockname()[1]

    @staticmethod
    async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                key, frame = line.decode().rstrip("\n").split("\t", 1)
                device = _floor_devices.get(key)
                if device is not None:
                    await device.send(text_data=frame)
        finally:
            writer.close()


class FloorDeviceConsumer(_Keyed):
    """With ``?line=1``, its first frame is ``{"port": n}``: where another process sends this key's items."""

    registry = _floor_devices

    async def connect(self):
        await super().connect()
        if _query(self.scope).get("line") == ["1"]:
            await self.send(text_data=json.dumps({"port": await _FloorLine.port()}))

    async def receive(self, text_data=None, bytes_data=None):
        item_id = json.loads(text_data)["seq"]
        await _floor_tunnel_db.call(_floor_ack, item_id)
        await _floor_outboxes[self.key].send(text_data=json.dumps({"acked": item_id}))


class FloorOutboxConsumer(_Keyed):
    """With ``?to=PORT``, each item goes to the device socket of another process on this machine, over a
    line to that port (``_FloorLine``); that process's outbox socket of the same key gets the acks."""

    registry = _floor_outboxes
    line: asyncio.StreamWriter | None = None

    async def connect(self):
        await _floor_request_db.call(_floor_create_table)
        port = _query(self.scope).get("to")
        if port:
            _, self.line = await asyncio.open_connection("127.0.0.1", int(port[0]))
        await super().connect()

    async def disconnect(self, code):
        if self.line is not None:
            self.line.close()
        await super().disconnect(code)

    async def receive(self, text_data=None, bytes_data=None):
        item_id = await _floor_request_db.call(_floor_insert, text_data)
        frame = json.dumps({"method": "deliver", "params": {"seq": item_id, "payload": text_data}})
        if self.line is not None:
            self.line.write(f"{self.key}\t{frame}\n".encode())
        else:
            await _floor_devices[self.key].send(text_data=frame)


class FloorConnectConsumer(_Lean):
    device_id: Any = None

    async def connect(self):
        await self.accept()
        self.device_id = await _floor_tunnel_db.call(_floor_device_id, _bearer(self.scope))
        if self.device_id is None:
            await self.close(code=4401)

    async def receive(self, text_data=None, bytes_data=None):
        await _floor_tunnel_db.call(_floor_seen, self.device_id)
        await self.send(text_data=text_data)


if os.environ.get("BENCH_SWITCH_INTERVAL"):
    import sys

    sys.setswitchinterval(float(os.environ["BENCH_SWITCH_INTERVAL"]))

if os.environ.get("BENCH_NO_RECEIVERS") == "1":
    # To see the tunnel's own floor: the other apps' device_connected/disconnected receivers off.
    from devices import signals

    signals.device_connected.receivers = []
    signals.device_disconnected.receivers = []

class CollectorWatch:
    def __init__(self) -> None:
        self.started = 0.0
        self.reset()
        gc.callbacks.append(self.callback)

    def reset(self) -> dict[str, Any]:
        figures = getattr(self, "figures", None)
        self.figures: dict[str, Any] = {"collections": 0, "ms": 0.0, "longest_ms": 0.0, "full": 0,
                                        "longest": None}
        return figures or self.figures

    def callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self.started = time.perf_counter()
            return
        ms = (time.perf_counter() - self.started) * 1000
        figures = self.figures
        figures["collections"] += 1
        figures["ms"] += ms
        if ms > figures["longest_ms"]:
            figures["longest_ms"] = ms
            figures["longest"] = {"generation": info["generation"], "collected": info["collected"]}
        figures["full"] += info["generation"] == 2


collector_watch = CollectorWatch()


async def http_application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["path"] == "/bench/gc":
        body = json.dumps(collector_watch.reset()).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})
        return
    await ai1net_application(scope, receive, send)


application = ProtocolTypeRouter(
    {
        "http": http_application,
        "websocket": URLRouter(
            [
                path("ws/echo", EchoConsumer.as_asgi()),
                path("ws/echo-layer", LayerEchoConsumer.as_asgi()),
                path("ws/bench-outbox", EnqueueConsumer.as_asgi()),
                path("ws/bench-acks", AckWatchConsumer.as_asgi()),
                path("ws/bench-call", CallConsumer.as_asgi()),
                path("ws/floor-device", FloorDeviceConsumer.as_asgi()),
                path("ws/floor-outbox", FloorOutboxConsumer.as_asgi()),
                path("ws/floor-connect", FloorConnectConsumer.as_asgi()),
                re_path(r"", ai1net_application),
            ]
        ),
    }
)
