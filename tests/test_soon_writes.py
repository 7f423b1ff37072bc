"""daphne's connections send in the event loop's next turn (ai1net.soon_writes): a real Twisted TCP transport on a
real loopback socket, on an asyncio reactor of the test's own (not installed: nothing global changes), and a
real daphne for the transports it builds."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from twisted.internet import error, protocol, tcp
from twisted.internet.asyncioreactor import AsyncioSelectorReactor
from twisted.python import failure

from ai1net import soon_writes
from tests.e2e_support import Daphne


class Recorder(protocol.Protocol):
    def __init__(self) -> None:
        self.lost: Any = None

    def connectionLost(self, reason: Any) -> None:  # noqa: N802
        self.lost = reason


class World:
    """A transport (``server``) on one end of a loopback connection, the test's plain socket (``peer``) on the
    other, and a record of the reactor's watch for writability."""

    def __init__(self, *, soon: bool = True) -> None:
        self.loop = asyncio.new_event_loop()
        self.reactor = AsyncioSelectorReactor(self.loop)
        with socket.create_server(("127.0.0.1", 0)) as listener:
            self.peer = socket.create_connection(listener.getsockname())
            accepted, address = listener.accept()
        accepted.setblocking(False)
        self.protocol = Recorder()
        self.server = tcp.Server(accepted, self.protocol, address, SimpleNamespace(_realPortNumber=0), 1, self.reactor)
        self.protocol.makeConnection(self.server)
        self.watched: list[str] = []
        add, remove = self.reactor.addWriter, self.reactor.removeWriter
        self.reactor.addWriter = lambda writer: (self.watched.append("add"), add(writer))[1]
        self.reactor.removeWriter = lambda writer: (self.watched.append("remove"), remove(writer))[1]
        if soon:
            assert soon_writes.apply(self.server, self.loop)

    def turn(self, count: int = 1) -> None:
        for _ in range(count):
            self.loop.run_until_complete(asyncio.sleep(0))

    def received(self, timeout: float = 0.2) -> bytes:
        self.peer.settimeout(timeout)
        try:
            return self.peer.recv(1 << 20)
        except (TimeoutError, ConnectionResetError):
            return b""

    def close(self) -> None:
        self.peer.close()
        if self.server.connected:
            self.server.connectionLost(failure.Failure(error.ConnectionDone()))
        self.loop.close()


@pytest.fixture
def world() -> Iterator[World]:
    made = World()
    yield made
    made.close()


def test_writes_of_one_turn_go_out_together_in_the_next_without_a_watch_for_writability(world):
    world.server.write(b"HTTP/1.1 200 OK\r\n")
    world.server.writeSequence([b"Content-Length: 2\r\n", b"\r\n"])
    world.server.write(b"ok")
    assert world.received(0.05) == b""  # buffered until the loop turns, as Twisted buffers
    world.turn()
    assert world.received() == b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    assert world.watched == []


def test_twisted_without_them_watches_for_writability_on_every_write():
    """What the mixin spares (and the measure the test above relies on)."""
    plain = World(soon=False)
    try:
        plain.server.write(b"ok")
        plain.turn(2)
        assert plain.received() == b"ok"
        assert plain.watched == ["add", "remove"]
    finally:
        plain.close()


def test_what_the_socket_does_not_take_is_left_to_the_watch_and_arrives_whole_in_order(world):
    world.server.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
    world.peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    body = bytes(range(256)) * (16 * 1024)  # 4 MiB: more than the socket takes at once
    world.server.write(body)
    world.turn()
    assert world.watched == ["add"]
    got = bytearray()
    deadline = time.monotonic() + 30
    while len(got) < len(body) and time.monotonic() < deadline:
        world.turn()
        got += world.received(0.05)
    assert bytes(got) == body
    assert world.watched == ["add", "remove"]
    world.server.write(b"more")  # the socket has room again: back to the next turn
    world.turn()
    assert world.received() == b"more"
    assert world.watched == ["add", "remove"]


def test_lose_connection_sends_what_was_written_then_closes(world):
    world.server.write(b"last words")
    world.server.loseConnection()
    world.turn(3)
    assert world.received() == b"last words"
    assert world.received() == b""  # the end of the stream
    assert world.protocol.lost is not None and world.protocol.lost.check(error.ConnectionDone)


def test_a_write_to_a_peer_that_reset_loses_the_connection(world):
    world.peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    world.peer.close()  # with a reset, which the transport has not read yet: the flush meets it first
    world.server.write(b"x" * 100_000)
    world.turn(3)
    assert world.protocol.lost is not None and world.protocol.lost.check(error.ConnectionLost), world.protocol.lost
    assert not world.server.connected


def test_an_aborted_connection_sends_nothing_more(world):
    world.server.write(b"never")
    world.server.abortConnection()
    world.turn(3)
    assert world.received() == b""
    assert world.protocol.lost is not None and world.protocol.lost.check(error.ConnectionAborted)
    assert "add" not in world.watched


def test_only_a_tcp_connection_is_given_them(world):
    assert soon_writes.apply(object(), world.loop) is False
    assert soon_writes.apply(world.server, world.loop) is False  # already has them


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("head_timeout", ["10", "0"])
def test_daphne_gives_its_connections_soon_writes_with_deadlines_or_without(tmp_path, head_timeout):
    server = Daphne(tmp_path, app="tests.twisted_log_asgi:application", AI1NET_HTTP_HEAD_TIMEOUT_SEC=head_timeout)
    try:
        classes = httpx.get(f"{server.url}/test/transport", timeout=10).json()
        assert "SoonWrites" in classes and "Server" in classes, classes
        assert httpx.get(f"{server.url}/healthz", timeout=10).is_success
    finally:
        server.stop()
    assert "Traceback" not in server.log(), server.log()[-3000:]

