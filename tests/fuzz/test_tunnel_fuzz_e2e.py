"""A short fuzz of /ws/device through a real daphne: hostile frames over a real WebSocket, the same tunnel
alive after each (it answers a ping), and no traceback in daphne's log."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clients import protocol
from devices import consumers, rpc, services
from devices.models import Device
from tests.e2e_support import Daphne, wait_until
from tests.fuzz import strategies as hs
from tests.fuzz.conftest import SHARED_FIXTURE
from tests.fuzz.test_tunnel_fuzz import PRODUCT_METHODS, assert_refusal_named

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

LOG_ALARMS = ("Traceback", "Exception inside application", "Internal Server Error")


class RealTunnel:
    def __init__(self, server: Daphne, token: str) -> None:
        from websockets.sync.client import connect

        self.server = server
        self.ws = connect(f"ws://127.0.0.1:{server.port}{protocol.TUNNEL_PATH}",
                          additional_headers={"Authorization": f"Bearer {token}"}, max_size=None)
        self.ws.send(protocol.request(protocol.HELLO, {"protocolVersion": 1, "kind": "bridge", "version": "e2e"}, "h"))
        assert "result" in json.loads(self.ws.recv(timeout=10))

    def exchange(self, frame: str | bytes, request_id: Any = None) -> list[dict[str, Any]]:
        self.ws.send(frame)
        ping_id = f"ping-{uuid.uuid4()}"
        self.ws.send(protocol.request("devices.ping", {}, ping_id))
        waiting = {ping_id} | ({request_id} if request_id is not None else set())
        replies = []
        while waiting:
            message = json.loads(self.ws.recv(timeout=10))
            if message.get("method") in (protocol.HEARTBEAT, protocol.DELIVER):
                continue
            waiting.discard(message.get("id"))
            if message.get("id") == ping_id:
                assert message["result"]["pong"] is True, message
            else:
                replies.append(message)
        return replies


@pytest.fixture
def tunnel(tmp_path, user):
    # ABUSE_LIMIT is read in daphne's process: there, 20 bad frames in 10 s close the tunnel (4400). Each
    # example sends one, spaced by its ping, so the fuzz stays under it by keeping to 15 examples per window.
    user.mobile_reply_enabled = True
    user.save(update_fields=["mobile_reply_enabled"])
    device, token = services.device_create(owner=user, name="fuzzed-e2e", kind="bridge")
    server = Daphne(tmp_path)
    live = RealTunnel(server, token)
    yield live
    live.ws.close()
    # Stopped once the disconnect is handled: else daphne waits out its 10 s application close timeout.
    wait_until(lambda: not Device.objects.filter(pk=device.pk).values_list("channel_name", flat=True).get(),
               timeout=10, message="the device offline")
    log = server.log()
    server.stop()
    assert not [alarm for alarm in LOG_ALARMS if alarm in log], log[-3000:]


utf8_frames = (hs.garbage_text | st.builds(
    lambda m, i, p: hs.dumps({"jsonrpc": "2.0", "id": i, "method": m, "params": p}),
    st.sampled_from(PRODUCT_METHODS), st.uuids().map(str), hs.any_params)).filter(
    lambda text: text.encode("utf-8", "surrogatepass").decode("utf-8", "replace") == text)


@settings(SHARED_FIXTURE, max_examples=consumers.ABUSE_LIMIT - 5)
@given(frame=utf8_frames | hs.garbage_bytes)
def test_hostile_frames_through_daphne(tunnel, frame):
    request_id = None
    if isinstance(frame, str) and hs.strict_json(frame):
        message = json.loads(frame)
        if isinstance(message, dict) and message.get("method") in rpc.registered_methods():
            request_id = message.get("id") if isinstance(message.get("id"), str) else None
    for reply in tunnel.exchange(frame, request_id):
        if "error" in reply:
            assert_refusal_named(reply)
