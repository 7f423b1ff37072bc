"""The device-web stream relay between daphne processes (devices.web.relay), in one process: the relay and
the link that dials it on this test's event loop, a stand-in for the tunnel consumer. The two-process path
is in test_routes_e2e."""

from __future__ import annotations

import asyncio
import json
import socket
import struct

import msgpack
import pytest
from channels.layers import get_channel_layer

from clients import protocol
from devices import consumers
from devices.web import relay, streams

CHUNK = protocol.WEB_BIN_CHUNK_BYTES
WINDOW = protocol.WEB_BIN_WINDOW_BYTES


class FakeTunnel:
    """What the relay uses of a DeviceConsumer that said hello in this process."""

    closing = False
    hello_done = True

    def __init__(self, channel_name: str = "relaytest.tunnel") -> None:
        self.channel_name = channel_name
        self.loop = asyncio.get_running_loop()
        self.streams: dict = {}
        self.forwarded: list = []
        self.got = asyncio.Event()

    async def device_stream_open(self, message: dict) -> None:
        self.streams[message["stream"]] = message["reply_channel"]
        self.forwarded.append(message)
        self.got.set()

    async def device_forward(self, message: dict) -> None:
        self.forwarded.append(message)
        self.got.set()

    async def device_stream_close(self, message: dict) -> None:
        self.streams.pop(message["stream"], None)
        self.forwarded.append(message)
        self.got.set()

    async def devices_outbox(self, message: dict) -> None:
        self.forwarded.append(message)
        self.got.set()

    async def device_call(self, message: dict) -> None:
        self.forwarded.append(message)
        self.got.set()

    async def wait_for(self, count: int) -> None:
        async with asyncio.timeout(5):
            while len(self.forwarded) < count:
                self.got.clear()
                await self.got.wait()


@pytest.fixture
async def tunnel(monkeypatch):
    fake = FakeTunnel()
    monkeypatch.setitem(consumers._web_tunnels, fake.channel_name, fake)
    yield fake
    relay.close_connections()


def stream_message(stream: str, method: str, **params) -> dict:
    return {"type": "device.stream", "stream": stream,
            "frame": {"jsonrpc": "2.0", "method": method, "params": dict(params, stream=stream)}}


async def receive(link: streams.TunnelLink) -> dict:
    return await asyncio.wait_for(link.receive(), 5)


async def test_a_relayed_stream_carries_the_same_messages_both_ways_over_one_shared_connection(tunnel):
    address = await relay.serve()
    assert address.startswith("127.0.0.1:")
    link = relay.RelayLink(tunnel.channel_name, address, get_channel_layer(), binary=True)
    await link.open(protocol.WEB_OPEN, {"port": 20001, "method": "GET", "path": "/"})
    assert not link.via_layer and link.opened
    opened = tunnel.forwarded[0]
    assert opened["type"] == "device.stream_open" and opened["stream"] == link.stream
    assert json.loads(opened["frame"])["params"] == {"port": 20001, "method": "GET", "path": "/", "binary": True,
                                                     "stream": link.stream}
    sink = tunnel.streams[link.stream]
    assert not isinstance(sink, str) and hasattr(sink, "put")  # the consumer hands frames to it (_to_stream)

    await link.data(0, b"up" * 1000)  # browser -> device: a binary data frame
    await tunnel.wait_for(2)
    assert protocol.parse_web_binary(tunnel.forwarded[1]["bytes"]) == (
        protocol.WEB_BIN_DATA, link.stream, 0, b"up" * 1000)

    body = bytes(range(256)) * (CHUNK // 256)
    sink.put(stream_message(link.stream, protocol.WEB_RESPONSE, status=200, headers=[["a", "b"]]))
    sink.put(stream_message(link.stream, protocol.WEB_DATA, seq=0, raw=body))
    head, data = await receive(link), await receive(link)
    assert head["frame"]["method"] == protocol.WEB_RESPONSE and head["frame"]["params"]["status"] == 200
    assert data["frame"]["params"]["raw"] == body and data["stream"] == link.stream

    # Text frames (a bridge without web.binary): a header larger than the dialler's read buffer; and a burst
    # of small messages read together.
    text = "QUJD" * (300 * 1024) + "QQ=="  # 921,601 bytes in base64
    sink.put(stream_message(link.stream, protocol.WEB_DATA, seq=1, data=text))
    for seq in range(2, 42):
        sink.put(stream_message(link.stream, protocol.WEB_DATA, seq=seq, raw=b"%d" % seq))
    assert (await receive(link))["frame"]["params"]["data"] == text
    # Counted as the reader will return it (the decoded length, to the byte; small frames at their minimum).
    assert sink.in_flight == CHUNK + 921_601 + 40 * (WINDOW // 64)
    for seq in range(2, 42):
        assert (await receive(link))["frame"]["params"] == {"seq": seq, "raw": b"%d" % seq, "stream": link.stream}
    await link.frame(protocol.WEB_CREDIT, {"bytes": WINDOW})

    # A second stream to the same process shares the connection.
    other = relay.RelayLink(tunnel.channel_name, address, get_channel_layer(), binary=True)
    await other.open(protocol.WEB_OPEN, {"port": 20001})
    assert other.connection is link.connection and len(link.connection.links) == 2
    await other.close(protocol.WEB_RESET_CANCELLED)
    await tunnel.wait_for(6)
    assert json.loads(tunnel.forwarded[4]["frame"])["params"]["reason"] == protocol.WEB_RESET_CANCELLED
    assert tunnel.forwarded[5] == {"type": "device.stream_close", "stream": other.stream, "ack": False}

    # The device's last word ends the stream on both sides (the consumer forgets it by itself).
    sink.put(stream_message(link.stream, protocol.WEB_END))
    assert (await receive(link))["frame"]["method"] == protocol.WEB_END
    assert link.stream not in link.connection.links and not sink.served.streams


async def test_the_relay_resets_a_device_that_sends_past_its_credit_and_keeps_one_that_does_not(tunnel):
    link = relay.RelayLink(tunnel.channel_name, await relay.serve(), get_channel_layer(), binary=True)
    await link.open(protocol.WEB_OPEN, {"port": 20001})
    sink = tunnel.streams[link.stream]
    chunk = b"x" * CHUNK
    for seq in range(WINDOW // CHUNK):  # a whole window
        sink.put(stream_message(link.stream, protocol.WEB_DATA, seq=seq, raw=chunk))
    for _ in range(WINDOW // CHUNK):
        assert (await receive(link))["frame"]["method"] == protocol.WEB_DATA
    await link.frame(protocol.WEB_CREDIT, {"bytes": WINDOW})  # handed on: the credit passes the relay
    await tunnel.wait_for(2)
    assert sink.in_flight == 0
    for seq in range(3 * WINDOW // CHUNK):  # then three windows without credit
        sink.put(stream_message(link.stream, protocol.WEB_DATA, seq=seq, raw=chunk))
    for _ in range(WINDOW // CHUNK + 1):  # a window and a chunk pass; what follows is never buffered
        assert (await receive(link))["frame"]["method"] == protocol.WEB_DATA
    reset = await receive(link)
    assert reset["frame"]["method"] == protocol.WEB_RESET
    assert reset["frame"]["params"]["reason"] == protocol.WEB_RESET_FLOW
    await tunnel.wait_for(3)
    assert json.loads(tunnel.forwarded[2]["frame"])["params"]["reason"] == protocol.WEB_RESET_FLOW  # the device too
    assert link.stream not in tunnel.streams and not sink.served.streams
    assert link.connection.transport.get_write_buffer_size() == 0


async def handshake(address: str, *, tag: bytes | None = None) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = address.split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    hello = await reader.readexactly(len(relay.MAGIC) + relay.NONCE_BYTES)
    assert hello.startswith(relay.MAGIC)
    good = relay._tag(b"dial", hello[len(relay.MAGIC):])
    writer.write(relay.MAGIC + (good if tag is None else tag) + b"n" * relay.NONCE_BYTES)
    return reader, writer


async def closed_at_once(reader: asyncio.StreamReader) -> bool:
    async with asyncio.timeout(3):
        return await reader.read(1 << 16) == b""


async def test_the_relay_closes_a_connection_with_a_bad_secret_or_garbage_at_once(tunnel, settings):
    address = await relay.serve()
    reader, writer = await handshake(address, tag=b"\0" * relay.TAG_BYTES)
    assert await closed_at_once(reader)  # no answer, no message read
    writer.close()

    settings.SECRET_KEY = "another deployment's secret key, 50 characters long at least"
    reader, writer = await handshake(address)  # a tag made with another key
    settings.SECRET_KEY = settings.SECRET_KEY + "!"
    assert await closed_at_once(reader)
    writer.close()

    host, port = address.split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"x" * 100)
    assert (await reader.readexactly(len(relay.MAGIC) + relay.NONCE_BYTES)).startswith(relay.MAGIC)
    assert await closed_at_once(reader)
    writer.close()


def framed(header: bytes, payload: bytes = b"") -> bytes:
    return struct.pack(">II", len(header), len(payload)) + header + payload


@pytest.mark.parametrize("sent", [
    struct.pack(">II", 0xFFFFFFFF, 0),  # 4 GiB announced: refused before reading (or allocating) any of it
    struct.pack(">II", relay.MAX_MESSAGE_BYTES + 1, 0),
    struct.pack(">II", 100, relay.MAX_MESSAGE_BYTES),  # header + payload past the bound
    struct.pack(">II", 0, 0),
    framed(b"\xc1\xc1\xc1"),  # not msgpack
    framed(msgpack.packb([1])),  # not a map
    framed(msgpack.packb({"type": "device.stream_open"})),  # no stream
    framed(msgpack.packb({"type": "nonsense", "stream": "s"})),
    framed(msgpack.packb({"type": "device.forward", "stream": "mine", "frame": "{}"}), b"xyz"),  # stray payload
    framed(msgpack.packb({"type": relay.DOORBELL, "stream": ""})),  # a doorbell for no tunnel
    framed(msgpack.packb({"type": relay.DOORBELL, "stream": "", "tunnel": "relaytest.tunnel", "frames": [[1]]})),
    framed(msgpack.packb({"type": relay.DOORBELL, "stream": "", "tunnel": "relaytest.tunnel", "frames": "x"})),
    framed(msgpack.packb({"type": relay.CALL, "stream": "", "call_id": "c1", "method": "m", "params": {}})),
    framed(msgpack.packb({"type": relay.CALL, "stream": "", "tunnel": "relaytest.tunnel", "call_id": 1,
                          "method": "m", "params": {}})),
    framed(msgpack.packb({"type": relay.CALL, "stream": "", "tunnel": "relaytest.tunnel", "call_id": "c" * 65,
                          "method": "m", "params": {}})),
    framed(msgpack.packb({"type": relay.CALL, "stream": "", "tunnel": "relaytest.tunnel", "call_id": "c1",
                          "method": "m", "params": [1]})),
], ids=["4GiB", "max+1", "sum-past-max", "zero", "garbage", "list", "no-stream", "unknown-type", "stray-payload",
        "doorbell-no-tunnel", "doorbell-bad-frame", "doorbell-frames-not-a-list", "call-no-tunnel",
        "call-id-not-text", "call-id-too-long", "call-params-not-a-map"])
async def test_the_relay_closes_a_connection_that_breaks_the_framing(tunnel, sent):
    address = await relay.serve()
    reader, writer = await handshake(address)
    await reader.readexactly(relay.TAG_BYTES)  # authenticated
    link = relay.RelayLink(tunnel.channel_name, address, get_channel_layer(), binary=True)
    await link.open(protocol.WEB_OPEN, {"port": 20001})  # another connection, unharmed below
    writer.write(relay.pack({"type": "device.stream_open", "stream": "mine", "tunnel": tunnel.channel_name}))
    answer = relay.pack({"type": relay.OPENED, "stream": "mine"})
    assert await reader.readexactly(len(answer)) == answer
    writer.write(sent)
    await writer.drain()
    assert await closed_at_once(reader)
    writer.close()
    await asyncio.sleep(0.05)
    assert "mine" not in tunnel.streams  # the stream of the connection that broke is forgotten
    assert json.loads(tunnel.forwarded[-1]["frame"])["params"]["reason"] == protocol.WEB_RESET_CANCELLED
    assert link.stream in tunnel.streams and not link.connection.closed


async def test_a_tunnel_not_held_there_falls_back_to_the_channel_layer(tunnel):
    layer = get_channel_layer()
    link = relay.RelayLink("relaytest.elsewhere", await relay.serve(), layer, binary=True)
    await link.open(protocol.WEB_OPEN, {"port": 20001})
    assert link.via_layer and link.opened and not tunnel.forwarded
    sent = await asyncio.wait_for(layer.receive("relaytest.elsewhere"), 5)
    assert sent["type"] == "device.stream_open" and sent["reply_channel"] == link.reply
    assert json.loads(sent["frame"])["method"] == protocol.WEB_OPEN
    await link.frame(protocol.WEB_CREDIT, {"bytes": 100})
    assert (await asyncio.wait_for(layer.receive("relaytest.elsewhere"), 5))["type"] == "device.forward"
    await layer.send(link.reply, stream_message(link.stream, protocol.WEB_END))
    assert (await receive(link))["frame"]["method"] == protocol.WEB_END


def dead_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def test_a_relay_that_cannot_be_reached_or_does_not_authenticate_falls_back_to_the_channel_layer(tunnel):
    layer = get_channel_layer()

    async def impostor(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(relay.MAGIC + b"n" * relay.NONCE_BYTES)  # looks like a relay, cannot answer the dialler
        await reader.readexactly(len(relay.MAGIC) + relay.TAG_BYTES + relay.NONCE_BYTES)
        writer.write(b"\0" * relay.TAG_BYTES)
        await writer.drain()
        await reader.read()

    impostors = await asyncio.start_server(impostor, "127.0.0.1", 0)
    async with impostors:
        for address in (f"127.0.0.1:{dead_port()}", f"127.0.0.1:{impostors.sockets[0].getsockname()[1]}",
                        "not an address"):
            link = relay.RelayLink(tunnel.channel_name, address, layer, binary=True)
            await link.open(protocol.WEB_OPEN, {"port": 20001})
            assert link.via_layer and link.opened, address
            sent = await asyncio.wait_for(layer.receive(tunnel.channel_name), 5)
            assert sent["type"] == "device.stream_open" and sent["stream"] == link.stream
    assert not tunnel.forwarded  # nothing went to the impostor's "tunnel"


async def test_a_relay_lost_after_the_open_ends_the_stream_as_the_tunnel_closing_would(tunnel):
    link = relay.RelayLink(tunnel.channel_name, await relay.serve(), get_channel_layer(), binary=True)
    await link.open(protocol.WEB_OPEN, {"port": 20001})
    link.connection.transport.abort()  # the tunnel's process went away
    assert (await receive(link))["type"] == "device.stream.closed"
    with pytest.raises(streams.LinkLost):
        await link.frame(protocol.WEB_CREDIT, {"bytes": 1})
    assert relay._pools[asyncio.get_running_loop()] == {}  # the next stream dials again


async def test_a_doorbell_goes_to_the_tunnel_over_the_kept_connection_and_falls_back_when_it_cannot(
        tunnel, monkeypatch):
    monkeypatch.setattr(relay, "enabled", lambda layer: True)  # scaled out (the layer may be in memory here)
    address = await relay.serve()
    frames = [[7, '{"jsonrpc":"2.0","method":"deliver","params":{"seq":7}}']]
    assert await relay.send_to_tunnel(address, tunnel.channel_name, {"type": relay.DOORBELL, "frames": frames})
    assert await relay.send_to_tunnel(address, tunnel.channel_name, {"type": relay.DOORBELL})
    await tunnel.wait_for(2)
    assert tunnel.forwarded == [{"type": relay.DOORBELL, "frames": frames}, {"type": relay.DOORBELL}]
    connection = relay._pools[asyncio.get_running_loop()][address]
    assert isinstance(connection, relay.Connection) and not connection.links  # kept, shared with streams

    # A tunnel no longer held there: taken and dropped (its device's next hello reads the outbox).
    assert await relay.send_to_tunnel(address, "relaytest.gone", {"type": relay.DOORBELL})
    assert await relay.send_to_tunnel(address, tunnel.channel_name, {"type": relay.DOORBELL})
    await tunnel.wait_for(3)
    assert len(tunnel.forwarded) == 3 and not connection.closed

    # Not a doorbell, no relay to reach, relays off: the caller sends through the channel layer.
    assert not await relay.send_to_tunnel(address, tunnel.channel_name, {"type": "devices.close", "code": 4403})
    assert not await relay.send_to_tunnel(f"127.0.0.1:{dead_port()}", tunnel.channel_name, {"type": relay.DOORBELL})
    monkeypatch.setattr(relay, "enabled", lambda layer: False)
    assert not await relay.send_to_tunnel(address, tunnel.channel_name, {"type": relay.DOORBELL})
    await asyncio.sleep(0.05)
    assert len(tunnel.forwarded) == 3


async def test_a_call_goes_to_the_tunnel_over_the_kept_connection_and_its_reply_comes_back(tunnel, monkeypatch):
    monkeypatch.setattr(relay, "enabled", lambda layer: True)  # scaled out (the layer may be in memory here)
    address = await relay.serve()
    call = {"type": relay.CALL, "call_id": "p-1", "method": "probe.read", "params": {"path": "a.txt"}}
    calling = asyncio.create_task(relay.call(address, tunnel.channel_name, call))
    await tunnel.wait_for(1)
    sent = tunnel.forwarded[0]
    assert {key: sent[key] for key in call} == call and not isinstance(sent["reply_channel"], str)
    reply = {"type": relay.CALL_REPLY, "call_id": "p-1", "response": {"result": {"text": "hello"}}}
    sent["reply_channel"].put(reply)  # as the tunnel consumer answers it (_call_reply)
    assert await asyncio.wait_for(calling, 5) == dict(reply, stream="")
    connection = relay._pools[asyncio.get_running_loop()][address]
    assert isinstance(connection, relay.Connection) and not connection.calls  # kept, nothing left waiting

    # A tunnel no longer held there answers as a closed tunnel does, at once.
    gone = await asyncio.wait_for(relay.call(address, "relaytest.gone", dict(call, call_id="p-2")), 5)
    assert gone["call_id"] == "p-2" and gone["response"]["error"]["data"]["code"] == "device_offline"

    # Sent, then the connection to the tunnel's process is lost: CallLost (the device may have run it).
    calling = asyncio.create_task(relay.call(address, tunnel.channel_name, dict(call, call_id="p-3")))
    await tunnel.wait_for(2)
    connection.transport.abort()
    with pytest.raises(relay.CallLost):
        await asyncio.wait_for(calling, 5)


async def test_a_call_takes_the_channel_layer_when_the_relay_cannot_take_it(tunnel, monkeypatch):
    call = {"type": relay.CALL, "call_id": "p-1", "method": "probe.read", "params": {}}
    monkeypatch.setattr(relay, "enabled", lambda layer: True)
    address = await relay.serve()
    assert await relay.call(f"127.0.0.1:{dead_port()}", tunnel.channel_name, call) is None
    # A worker thread's short-lived event loop would leave a kept connection behind when it closes.
    assert await asyncio.to_thread(asyncio.run, relay.call(address, tunnel.channel_name, call)) is None
    monkeypatch.setattr(relay, "enabled", lambda layer: False)
    assert await relay.call(address, tunnel.channel_name, call) is None
    await asyncio.sleep(0.05)
    assert not tunnel.forwarded


@pytest.mark.parametrize("result", [
    2 ** 70,  # past msgpack's 64 bits
    [1e10] * ((relay.MAX_MESSAGE_BYTES // 9) + 1),  # 6 bytes a float in JSON ("1e10,"), 9 in msgpack: too large
], ids=["big-integer", "expands-past-the-bound"])
async def test_a_device_answer_that_cannot_be_relayed_fails_its_call_and_spares_the_connection(tunnel, monkeypatch,
                                                                                             result):
    monkeypatch.setattr(relay, "enabled", lambda layer: True)
    address = await relay.serve()
    link = relay.RelayLink(tunnel.channel_name, address, get_channel_layer(), binary=True)
    await link.open(protocol.WEB_OPEN, {"port": 20001})  # another stream on the same connection
    sink = tunnel.streams[link.stream]
    calling = asyncio.create_task(relay.call(address, tunnel.channel_name, {
        "type": relay.CALL, "call_id": "p-1", "method": "probe.read", "params": {}}))
    await tunnel.wait_for(2)
    tunnel.forwarded[1]["reply_channel"].put({"type": relay.CALL_REPLY, "call_id": "p-1",
                                              "response": {"result": result}})
    reply = await asyncio.wait_for(calling, 5)
    assert reply["response"]["error"]["data"]["code"] == "device_error"
    # A stream's frame alike: that stream is reset, the connection and its other streams live on.
    sink.put(stream_message(link.stream, protocol.WEB_RESPONSE, status=200, headers=[], extra=result))
    reset = await receive(link)
    assert reset["frame"]["method"] == protocol.WEB_RESET
    assert reset["frame"]["params"]["reason"] == protocol.WEB_RESET_UPSTREAM_ERROR
    assert not link.connection.closed
    calling = asyncio.create_task(relay.call(address, tunnel.channel_name, {
        "type": relay.CALL, "call_id": "p-2", "method": "m", "params": {}}))
    await tunnel.wait_for(3)
    tunnel.forwarded[2]["reply_channel"].put({"type": relay.CALL_REPLY, "call_id": "p-2", "response": {"result": 1}})
    assert (await asyncio.wait_for(calling, 5))["response"] == {"result": 1}  # the same connection still carries
