"""Through a real daphne with a plain `websockets` client: pairing over HTTP, the bearer handshake,
readable close codes, hello, deliver/ack and resume. (The real bridge client is tested in tests/clients.)"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

import pytest
import websockets
from asgiref.sync import sync_to_async

from clients import protocol
from devices import services
from devices.models import PairingRequest
from tests.e2e_support import Daphne

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


async def hello(ws, acked_seq: int = 0) -> dict:
    await ws.send(protocol.request(protocol.HELLO, {"protocolVersion": 1, "kind": "bridge", "version": "e2e",
                                                    "capabilities": [], "ports": [], "roots": [], "ackedSeq": acked_seq}, "h"))
    while True:
        message = json.loads(await asyncio.wait_for(ws.recv(), 10))
        if message.get("id") == "h":
            return message["result"]


async def delivers(ws, count: int) -> list[dict]:
    got = []
    while len(got) < count:
        message = json.loads(await asyncio.wait_for(ws.recv(), 10))
        if message.get("method") == protocol.DELIVER:
            got.append(message["params"])
    return got


async def test_pair_connect_deliver_resume_revoke(tmp_path, user):
    server = Daphne(tmp_path, AI1NET_PAIRING_INTERVAL_SEC="1", AI1NET_HEARTBEAT_SEC="2")
    try:
        status, started = await sync_to_async(post)(f"{server.url}/api/devices/pairings",
                                                    {"name": "e2e", "kind": "bridge", "hostname": "h", "os": "Linux"})
        assert status == 201 and started["interval"] == 1
        status, body = await sync_to_async(post)(f"{server.url}/api/devices/pairings/token",
                                                 {"device_code": started["device_code"]})
        assert (status, body["error"]) == (400, "authorization_pending")
        await sync_to_async(services.pairing_approve)(user=user, user_code=started["user_code"])
        await asyncio.sleep(1.1)  # the device's polling interval, as a real client waits
        status, body = await sync_to_async(post)(f"{server.url}/api/devices/pairings/token",
                                                 {"device_code": started["device_code"]})
        assert status == 200, body
        assert await sync_to_async(lambda: PairingRequest.objects.get().state)() == "claimed"
        token, device_id = body["device_token"], body["device_id"]
        ws_url = server.url.replace("http", "ws") + protocol.TUNNEL_PATH

        async with websockets.connect(ws_url, additional_headers={"Authorization": "Bearer wrong"}) as ws:
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), 10)
            assert closed.value.rcvd.code == protocol.CLOSE_UNAUTHORIZED

        device = await sync_to_async(lambda: services.Device.objects.get(pk=device_id))()
        async with websockets.connect(ws_url, additional_headers={"Authorization": f"Bearer {token}"}) as ws:
            reply = await hello(ws)
            assert reply["deviceId"] == device_id and reply["heartbeatSec"] == 2
            for i in range(10):  # from this (other) process: the heartbeat tick or a doorbell finds them
                await sync_to_async(services.outbox_enqueue)(device=device, kind="e2e", payload={"i": i})
            items = await delivers(ws, 10)
            assert [i["seq"] for i in items] == list(range(1, 11))
            await ws.send(protocol.notification(protocol.ACK, {"seq": 6}))
        async with websockets.connect(ws_url, additional_headers={"Authorization": f"Bearer {token}"}) as ws:
            assert (await hello(ws, acked_seq=6))["resendFrom"] == 7
            assert [i["seq"] for i in await delivers(ws, 4)] == [7, 8, 9, 10]
            await sync_to_async(services.device_revoke)(device=device, actor=user)
            with pytest.raises(websockets.ConnectionClosed) as closed:
                while True:  # the revocation reaches the other process by its heartbeat check at the latest
                    await asyncio.wait_for(ws.recv(), 10)
            assert closed.value.rcvd.code == protocol.CLOSE_REVOKED
            # daphne 4.2 drops close reasons: clients explain the code with protocol.CLOSE_REASONS
    finally:
        server.stop()
