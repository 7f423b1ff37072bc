"""daphne caps WebSocket messages at 1 MiB by default, both ways; the tunnel's frames may be as large
as clients.protocol.MAX_FRAME_BYTES (ai1net.asgi.tunnel_message_limit). Through a real daphne started
with its default options, as an operator would."""

from __future__ import annotations

import asyncio
import json

import pytest
import websockets
from asgiref.sync import sync_to_async

from clients import protocol
from devices import services
from tests.devices.test_e2e_tunnel import delivers, hello
from tests.e2e_support import Daphne

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


async def test_frames_just_under_the_cap_pass_through_daphne_both_ways(tmp_path, user):
    assert protocol.MAX_FRAME_BYTES > 1024 * 1024  # what daphne allows unless told otherwise
    server = Daphne(tmp_path, AI1NET_HEARTBEAT_SEC="5")
    try:
        device, token = await sync_to_async(services.device_create)(owner=user, name="big", kind="bridge")
        url = server.url.replace("http", "ws") + protocol.TUNNEL_PATH
        async with websockets.connect(url, additional_headers={"Authorization": f"Bearer {token}"},
                                      max_size=None) as ws:
            await hello(ws)
            # Device -> platform: one frame of MAX_FRAME_BYTES - 1 bytes reaches the consumer, which
            # answers it (an unknown method) instead of daphne dropping the connection (1009).
            empty = protocol.request("e2e.nothing", {"pad": ""}, "big")
            frame = protocol.request("e2e.nothing", {"pad": "x" * (protocol.MAX_FRAME_BYTES - 1 - len(empty))}, "big")
            assert len(frame.encode()) == protocol.MAX_FRAME_BYTES - 1
            await ws.send(frame)
            while True:
                message = json.loads(await asyncio.wait_for(ws.recv(), 20))
                if message.get("id") == "big":
                    break
            assert message["error"]["code"] == protocol.METHOD_NOT_FOUND

            # Platform -> device: an outbox item whose deliver frame is just under the cap.
            blob = "y" * (protocol.MAX_FRAME_BYTES - 1024)
            await sync_to_async(services.outbox_enqueue)(device=device, kind="e2e.big", payload={"blob": blob})
            [item] = await delivers(ws, 1)
            assert item["payload"]["blob"] == blob
            await ws.send(protocol.notification(protocol.ACK, {"seq": item["seq"]}))
    finally:
        server.stop()
