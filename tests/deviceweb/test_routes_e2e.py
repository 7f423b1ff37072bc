"""Device web's routes and frame kinds, end to end with real processes: a large body each way arrives
intact whether the stream is routed in-process (the request lands on the daphne that holds the tunnel)
or through the channel layer (forced here with AI1NET_DEVICE_WEB_IN_PROCESS=0), or, with Redis, across two
daphne processes (straight to the stream relay of the process that holds the tunnel, devices.web.relay; through
the layer when that relay cannot be reached), and whether the bridge speaks binary data frames or, as an older
bridge, text."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
from collections.abc import Iterator

import pytest
from asgiref.sync import async_to_sync

from clients import protocol
from devices.models import Device
from tests.deviceweb.conftest import FAST
from tests.deviceweb.support import Bridge, Upstream, browser, enable_device_web
from tests.deviceweb.test_streams_e2e import _echo_through, expected_sha256
from tests.e2e_support import Daphne, free_port, relay_bytes_received

pytestmark = pytest.mark.django_db(transaction=True)

MIB = 1024 * 1024


def round_trip(server: Daphne, bridge: Bridge, upstream: Upstream, username: str, password: str) -> None:
    """A large body each way, a chunked one, and a WebSocket echo (test_streams_e2e's) on the same route."""
    size, upload = 24 * MIB + 12345, os.urandom(9 * MIB + 77)
    with browser(server, username, password, timeout=120) as web:
        ws_echo(server, bridge, upstream, web)
        digest, got = hashlib.sha256(), 0
        with web.stream("GET", f"{bridge.prefix}/{upstream.port}/bytes", params={"n": size}) as response:
            assert response.status_code == 200
            for chunk in response.iter_bytes():
                digest.update(chunk)
                got += len(chunk)
        assert got == size and digest.hexdigest() == expected_sha256(size)
        echoed = web.post(f"{bridge.prefix}/{upstream.port}/echo", content=upload).json()
        assert echoed["body_len"] == len(upload)
        assert echoed["body_sha256"] == hashlib.sha256(upload).hexdigest()
        chunked = web.get(f"{bridge.prefix}/{upstream.port}/bytes", params={"n": 3 * MIB + 1, "chunked": 1})
        assert chunked.content == b"".join(_pattern(3 * MIB + 1))


def ws_echo(server: Daphne, bridge: Bridge, upstream: Upstream, web) -> None:
    """Messages each way (more than a credit window of them), the largest one, the closes (test_streams_e2e)."""
    url = f"ws://127.0.0.1:{server.port}{bridge.prefix}/{upstream.ws_port}/echo?room=1"
    async_to_sync(_echo_through)(url, server.url, f"sessionid={web.cookies['sessionid']}")


def _pattern(n: int):
    from tests.deviceweb.upstream import pattern

    return pattern(n)


@pytest.mark.parametrize("binary", ["1", "0"], ids=["binary", "text-fallback"])
@pytest.mark.parametrize("in_process", ["1", "0"], ids=["in-process", "channel-layer"])
def test_a_large_body_each_way_arrives_intact(tmp_path, user, password, binary, in_process):
    enable_device_web(user)
    server = Daphne(tmp_path, AI1NET_DEVICE_WEB_IN_PROCESS=in_process, **FAST)
    upstream = Upstream(tmp_path)
    bridge = None
    try:
        bridge = Bridge(server, user, tmp_path / "home", [upstream.port, upstream.ws_port], AI1NET_WEB_BINARY=binary)
        capabilities = Device.objects.get(pk=bridge.device.pk).capabilities
        assert (protocol.WEB_BINARY_CAPABILITY in capabilities) == (binary == "1")
        round_trip(server, bridge, upstream, user.username, password)
    finally:
        if bridge is not None:
            bridge.stop()
        upstream.stop()
        server.stop()


@contextlib.contextmanager
def tunnel_on_a(tmp_path, user, settings) -> Iterator[tuple[Daphne, Daphne, Bridge, Upstream]]:
    """Two daphne processes on Redis, A and B, and a bridge whose tunnel is on A, exposing a local service."""
    if not settings.REDIS_URL:
        pytest.skip("two daphne processes need the Redis channel layer (REDIS_URL)")
    if shutil.which("ss") is None:
        pytest.skip("ss (iproute2, installed by make deps) is needed to see which connection carried the stream")
    enable_device_web(user)
    with contextlib.ExitStack() as stopping:  # stopped in reverse: the bridge, the service, B, A
        a = Daphne(tmp_path, name="daphne-a", **FAST)
        stopping.callback(a.stop)
        b = Daphne(tmp_path, name="daphne-b", **FAST)
        stopping.callback(b.stop)
        upstream = Upstream(tmp_path)
        stopping.callback(upstream.stop)
        bridge = Bridge(a, user, tmp_path / "home", [upstream.port, upstream.ws_port])
        stopping.callback(bridge.stop)
        yield a, b, bridge, upstream


@pytest.mark.e2e
def test_across_two_daphne_processes_the_stream_goes_straight_to_the_relay_of_the_tunnels_process(
        tmp_path, user, password, settings):
    """The request lands on daphne B, the device's tunnel is on daphne A: the stream's frames cross one TCP
    connection from B to A's relay (not Redis), a WebSocket's as an HTTP body's, and a large body each way
    arrives intact."""
    with tunnel_on_a(tmp_path, user, settings) as (a, b, bridge, upstream):
        address = Device.objects.get(pk=bridge.device.pk).relay
        assert re.fullmatch(r"127\.0\.0\.1:\d+", address), address  # A's, written by the hello
        assert relay_bytes_received(address) == 0
        with browser(b, user.username, password) as web:
            ws_echo(b, bridge, upstream, web)
        # The WebSocket's echoed messages (300 of 10 kB and the largest one) came to B over A's relay.
        assert relay_bytes_received(address) > 3 * MIB
        round_trip(b, bridge, upstream, user.username, password)
        # The download (24 MiB) and the chunked one (3 MiB) came to B over its connection to A's relay.
        assert relay_bytes_received(address) > 30 * MIB
        round_trip(a, bridge, upstream, user.username, password)  # on A itself: in-process, as before


@pytest.mark.e2e
def test_across_two_daphne_processes_an_unreachable_relay_leaves_the_stream_to_the_channel_layer(
        tmp_path, user, password, settings):
    """A stale relay address (the process died, the port is closed): the request on B still works, through
    Redis, and nothing reaches A's relay."""
    with tunnel_on_a(tmp_path, user, settings) as (_a, b, bridge, upstream):
        address = Device.objects.get(pk=bridge.device.pk).relay
        assert address
        Device.objects.filter(pk=bridge.device.pk).update(relay=f"127.0.0.1:{free_port()}")  # nobody listens
        round_trip(b, bridge, upstream, user.username, password)
        assert relay_bytes_received(address) == 0
