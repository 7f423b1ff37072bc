"""A closed connection of a real daphne leaves no reference cycle of ours, daphne's, autobahn's or Twisted's
behind (ai1net.connection_cycles): the cyclic collector finds nothing of them after device tunnels, a refused
one, the phone's and the devices page's sockets and their upgraded requests' HTTP channels are done."""

from __future__ import annotations

import asyncio
import collections
import json
import time
import urllib.request

import pytest
import websockets
from asgiref.sync import sync_to_async

from clients import protocol
from devices import services
from tests.devices.test_e2e_tunnel import hello
from tests.e2e_support import Daphne, logged_in

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

LIBRARIES = ("daphne", "autobahn", "twisted", "channels", "asyncio", "django", "ai1net", "devices", "mobile")


def gc_state(server: Daphne) -> dict:
    with urllib.request.urlopen(f"{server.url}/test/gc", timeout=10) as response:  # noqa: S310 - loopback
        return json.loads(response.read())


def session_cookie(server: Daphne, username: str, password: str) -> str:
    with logged_in(server.url, username, password) as client:
        return "; ".join(f"{name}={value}" for name, value in client.cookies.items())


async def test_closed_sockets_leave_no_reference_cycles(tmp_path, user, password):
    device, token = await sync_to_async(services.device_create)(owner=user, name="desk", kind="bridge")
    user.mobile_reply_enabled = True  # the phone's socket opens only then
    await sync_to_async(user.save)(update_fields=["mobile_reply_enabled"])
    server = Daphne(tmp_path, app="tests.gc_asgi:application")
    try:
        cookie = {"Cookie": await sync_to_async(session_cookie)(server, user.username, password)}
        await sync_to_async(gc_state)(server)  # what start-up and the login's HTTP requests left
        ws_url = server.url.replace("http", "ws") + protocol.TUNNEL_PATH
        for _ in range(5):
            async with websockets.connect(ws_url, additional_headers={"Authorization": f"Bearer {token}"}) as ws:
                assert (await hello(ws))["deviceId"] == str(device.pk)
        async with websockets.connect(ws_url, additional_headers={"Authorization": "Bearer wrong"}) as ws:
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), 10)
            assert closed.value.rcvd.code == protocol.CLOSE_UNAUTHORIZED
        # The browser's sockets: the devices page's (answers a ping) and the phone's (sends its snapshot first).
        browser = {"additional_headers": cookie, "origin": server.url}
        async with websockets.connect(server.url.replace("http", "ws") + "/ws/devices", **browser) as ws:
            await asyncio.wait_for(await ws.ping(), 10)
        async with websockets.connect(server.url.replace("http", "ws") + "/ws/mobile", **browser) as ws:
            assert isinstance(json.loads(await asyncio.wait_for(ws.recv(), 10)), dict)

        garbage: collections.Counter = collections.Counter()
        exceptions: list[str] = []
        deadline = time.monotonic() + 15
        while True:  # daphne lets go of closed sockets once a second; what they leave shows up then
            state = await sync_to_async(gc_state)(server)
            garbage.update(state["garbage"])
            exceptions += state["exceptions"]
            if state["open_sockets"] == 0:
                break
            assert time.monotonic() < deadline, f"sockets still open: {state}"
            await asyncio.sleep(0.3)
        ours = {name: n for name, n in garbage.items() if name.split(".")[0] in LIBRARIES}
        assert not ours, f"closed connections left objects in reference cycles: {garbage.most_common(20)}"
        assert sum(garbage.values()) < 20, (garbage.most_common(20), exceptions)
    finally:
        server.stop()
