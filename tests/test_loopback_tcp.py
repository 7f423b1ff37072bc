"""Connections whose peer is on this machine are sent without pacing (clients.common.loopback): daphne's
(behind a proxy on its host), the stream relay's between processes, a bridge's or a probe's tunnel to a
platform on the same machine and a bridge's connection to its local service.

Each test asks for an algorithm the system does not use by default, so a connection has it only if the code
under test chose it."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
from pathlib import Path

import pytest

from clients.common import loopback

pytestmark = pytest.mark.skipif(not hasattr(socket, "TCP_CONGESTION"), reason="TCP_CONGESTION is Linux's")

PROC = Path("/proc/sys/net/ipv4")


def system_default() -> str:
    return loopback.system_algorithm()


@pytest.fixture
def chosen(monkeypatch) -> str:
    """An algorithm other than the system's default, asked for through the environment (reno where it can be)."""
    others = [name for name in (PROC / "tcp_available_congestion_control").read_text().split()
              if name != system_default()]
    if not others:
        pytest.skip("this kernel offers one congestion control algorithm only")
    name = "reno" if "reno" in others else others[0]
    monkeypatch.setenv(loopback.ENV, name)
    return name


def algorithm_of(sock: socket.socket) -> str:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).split(b"\0", 1)[0].decode()


@contextlib.contextmanager
def connected_pair(host: str = "127.0.0.1"):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as server:
        server.bind((host, 0))
        server.listen(1)
        client = socket.create_connection(server.getsockname()[:2])
        accepted, _ = server.accept()
        with client, accepted:
            yield client, accepted


def ss_algorithm(local_port: int, peer_port: int) -> str:
    """The algorithm of this machine's connection from 127.0.0.1:local_port to 127.0.0.1:peer_port, as ``ss``
    shows it (the other process's socket, which the test cannot ask itself)."""
    out = subprocess.run(["ss", "-tinH", "state", "established", "src", f"127.0.0.1:{local_port}",
                          "dst", f"127.0.0.1:{peer_port}"], capture_output=True, text=True, check=True).stdout
    names = set((PROC / "tcp_available_congestion_control").read_text().split())
    found = [word for word in out.split() if word in names]
    assert found, f"no connection 127.0.0.1:{local_port} -> {peer_port} in: {out!r}"
    return found[0]


@pytest.mark.parametrize(("host", "expected"), [
    ("127.0.0.1", True), ("127.8.9.10", True), ("::1", True), ("::ffff:127.0.0.1", True),
    ("10.0.0.1", False), ("192.168.1.20", False), ("::ffff:10.0.0.1", False), ("2001:db8::1", False),
    ("fe80::1%eth0", False), ("localhost", False), ("", False), (None, False),
])
def test_only_addresses_of_this_machine_count_as_loopback(host, expected):
    assert loopback.is_loopback(host) is expected


def test_a_loopback_connection_gets_the_algorithm_and_its_peer_keeps_its_own(chosen):
    with connected_pair() as (client, accepted):
        assert algorithm_of(client) == algorithm_of(accepted) == system_default()
        assert loopback.unpaced(client) is True
        assert algorithm_of(client) == chosen
        assert algorithm_of(accepted) == system_default()


def test_an_ipv6_loopback_connection_gets_it_too(chosen):
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no ::1 on this machine")
    with connected_pair("::1") as (client, _):
        assert loopback.unpaced(client) and algorithm_of(client) == chosen


def test_an_empty_setting_or_an_unknown_algorithm_leaves_the_connection_as_it_was(chosen, monkeypatch):
    with connected_pair() as (client, _):
        monkeypatch.setenv(loopback.ENV, "")
        assert loopback.unpaced(client) is False
        monkeypatch.setenv(loopback.ENV, "no-such-algorithm")
        assert loopback.unpaced(client) is False
        assert algorithm_of(client) == system_default()


def test_sockets_that_are_not_connected_tcp_are_left_alone(chosen):
    assert loopback.unpaced(None) is False
    with socket.socket() as unconnected:
        assert loopback.unpaced(unconnected) is False
        assert algorithm_of(unconnected) == system_default()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.connect(("127.0.0.1", 9))
        assert loopback.unpaced(udp) is False


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_daphne_sends_to_a_client_on_this_machine_without_pacing_with_or_without_deadlines(tmp_path, chosen):
    from tests.e2e_support import Daphne

    cases = [("chosen", {loopback.ENV: chosen}, chosen),
             ("no-deadlines", {loopback.ENV: chosen, "AI1NET_HTTP_HEAD_TIMEOUT_SEC": "0"}, chosen),
             ("unset", {loopback.ENV: ""}, system_default())]
    servers = []
    try:
        for name, env, expected in cases:
            daphne = Daphne(tmp_path, name=name, **env)
            servers.append((daphne, expected))
            with socket.create_connection(("127.0.0.1", daphne.port)) as client:
                client.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                assert client.recv(65536).startswith(b"HTTP/1.1 200"), name  # the connection is made and served
                assert ss_algorithm(daphne.port, client.getsockname()[1]) == expected, name
    finally:
        for daphne, _ in servers:
            daphne.stop()


async def test_the_tunnel_to_a_platform_on_this_machine_is_sent_without_pacing(chosen):
    from tests.clients.fakes import FakeTunnelServer
    from tests.clients.test_tunnel import Device, finish, start, until

    async with FakeTunnelServer() as server:
        tunnel = Device().tunnel(server)
        task = start(tunnel)
        try:
            await until(lambda: server.hellos, message="the hello")
            sock = tunnel._ws.transport.get_extra_info("socket")
            assert algorithm_of(sock) == chosen
        finally:
            await finish(tunnel, task)


async def test_the_stream_relay_between_processes_is_sent_without_pacing_both_ways(chosen, settings):
    from devices.web import relay

    address = await relay.serve()
    connection = await relay.Connection.open(address)
    try:
        sock = connection.transport.get_extra_info("socket")
        assert algorithm_of(sock) == chosen
        local_port, relay_port = sock.getsockname()[1], int(address.rpartition(":")[2])
        await asyncio.sleep(0)
        assert ss_algorithm(relay_port, local_port) == chosen  # the relay's side, accepted
    finally:
        connection.transport.close()


async def test_the_bridge_sends_to_its_local_service_without_pacing(chosen):
    from clients.bridge.upstream import open_upstream

    server = await asyncio.start_server(lambda reader, writer: None, "127.0.0.1", 0)
    upstream = await open_upstream(server.sockets[0].getsockname()[1], 64 * 1024)
    try:
        assert algorithm_of(upstream.transport.get_extra_info("socket")) == chosen
    finally:
        upstream.close()
        server.close()
        await server.wait_closed()
