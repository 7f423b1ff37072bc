"""The ai1net application plus what the benchmark needs (never part of the app):

- ``/ws/echo``: a bare Channels echo consumer (direct send), the baseline;
- ``/ws/echo-layer``: the same echo through a channel-layer group_send (the doorbell's path);
- the device method ``bench.enqueue {n}``: writes n outbox items for the calling device in one
  transaction (one doorbell), so the benchmark can drive the real outbox path inside daphne.
"""

from __future__ import annotations

import os
import uuid

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings_bench")

from channels.generic.websocket import AsyncWebsocketConsumer  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import path, re_path  # noqa: E402

from ai1net.asgi import application as ai1net_application  # noqa: E402
from devices import services  # noqa: E402
from devices.rpc import device_method  # noqa: E402


class EchoConsumer(AsyncWebsocketConsumer):
    async def receive(self, text_data=None, bytes_data=None):
        await self.send(text_data=text_data)


class LayerEchoConsumer(AsyncWebsocketConsumer):
    async def connect(self):
        self.group = f"echo.{uuid.uuid4().hex}"
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def disconnect(self, code):
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


application = ProtocolTypeRouter(
    {
        "http": ai1net_application,
        "websocket": URLRouter(
            [
                path("ws/echo", EchoConsumer.as_asgi()),
                path("ws/echo-layer", LayerEchoConsumer.as_asgi()),
                re_path(r"", ai1net_application),
            ]
        ),
    }
)
