"""The device-web tests' own local service (tests/deviceweb/support.Upstream) survives a port race."""

from __future__ import annotations

import socket

import httpx
import pytest

from tests.deviceweb import support

pytestmark = pytest.mark.e2e


def test_the_local_service_starts_again_on_other_ports_when_its_port_was_taken(tmp_path, monkeypatch):
    taken = socket.socket()
    taken.bind(("127.0.0.1", support.web_port()))
    taken.listen()
    port = taken.getsockname()[1]
    picks = [port]  # the first pick is taken between the check and the service's bind
    real = support.web_port
    monkeypatch.setattr(support, "web_port", lambda avoid=(): picks.pop() if picks else real(avoid))
    upstream = support.Upstream(tmp_path)
    try:
        assert upstream.alive and upstream.port != port and upstream.ws_port not in (port, upstream.port)
        assert "address already in use" in (tmp_path / "upstream-0.log").read_text()
        assert httpx.get(f"{upstream.url}/small", timeout=5).text == "ok"
    finally:
        upstream.stop()
        taken.close()
