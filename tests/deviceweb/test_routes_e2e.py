"""Device web's routes and frame kinds, end to end with real processes: a large body each way arrives
intact whether the stream is routed in-process (the request lands on the daphne that holds the tunnel)
or through the channel layer (forced here with AI1NET_DEVICE_WEB_IN_PROCESS=0; with Redis, also across
two daphne processes), and whether the bridge speaks binary data frames or, as an older bridge, text."""

from __future__ import annotations

import hashlib
import os

import pytest

from clients import protocol
from devices.models import Device
from tests.deviceweb.conftest import FAST
from tests.deviceweb.support import Bridge, Upstream, browser, enable_device_web
from tests.deviceweb.test_streams_e2e import expected_sha256
from tests.e2e_support import Daphne

pytestmark = pytest.mark.django_db(transaction=True)

MIB = 1024 * 1024


def round_trip(server: Daphne, bridge: Bridge, upstream: Upstream, username: str, password: str) -> None:
    size, upload = 24 * MIB + 12345, os.urandom(9 * MIB + 77)
    with browser(server, username, password, timeout=120) as web:
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
        bridge = Bridge(server, user, tmp_path / "home", [upstream.port], AI1NET_WEB_BINARY=binary)
        capabilities = Device.objects.get(pk=bridge.device.pk).capabilities
        assert (protocol.WEB_BINARY_CAPABILITY in capabilities) == (binary == "1")
        round_trip(server, bridge, upstream, user.username, password)
    finally:
        if bridge is not None:
            bridge.stop()
        upstream.stop()
        server.stop()


def test_across_two_daphne_processes_through_redis(tmp_path, user, password, settings):
    """The request lands on daphne B, the device's tunnel is on daphne A: every frame crosses Redis."""
    if not settings.REDIS_URL:
        pytest.skip("two daphne processes need the Redis channel layer (REDIS_URL)")
    enable_device_web(user)
    a = Daphne(tmp_path, name="daphne-a", **FAST)
    b = Daphne(tmp_path, name="daphne-b", **FAST)
    upstream = Upstream(tmp_path)
    bridge = None
    try:
        bridge = Bridge(a, user, tmp_path / "home", [upstream.port])
        round_trip(b, bridge, upstream, user.username, password)
        round_trip(a, bridge, upstream, user.username, password)
    finally:
        if bridge is not None:
            bridge.stop()
        upstream.stop()
        b.stop()
        a.stop()
