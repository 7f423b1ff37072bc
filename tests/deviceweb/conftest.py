from __future__ import annotations

import pytest

from tests.deviceweb.support import Bridge, Upstream, enable_device_web, web_port
from tests.e2e_support import Daphne

FAST = {"AI1NET_HEARTBEAT_SEC": "2", "AI1NET_DEVICE_WEB_FIRST_BYTE_SEC": "3"}


@pytest.fixture
def stack(tmp_path, user):
    """daphne + a local service + the user's bridge exposing the service's two ports and one port nobody
    serves: (server, upstream, bridge, dead_port)."""
    enable_device_web(user)
    server = Daphne(tmp_path, **FAST)
    upstream = Upstream(tmp_path)
    dead_port = web_port()
    bridge = None
    try:
        bridge = Bridge(server, user, tmp_path / "home", [upstream.port, upstream.ws_port, dead_port])
        yield server, upstream, bridge, dead_port
    finally:
        if bridge is not None:
            bridge.stop()
        upstream.stop()
        server.stop()
