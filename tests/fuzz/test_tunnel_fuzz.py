"""Fuzzing /ws/device in-process: every device -> platform method with hostile params, and raw garbage frames.

After each hostile frame the same connection must answer a ``devices.ping``: a refusal is a JSON-RPC error
naming the problem (DESIGN.md "The tunnel protocol"), never a dead consumer, and nothing is logged at ERROR.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from channels.layers import DEFAULT_CHANNEL_LAYER, channel_layers
from hypothesis import given, settings
from hypothesis import strategies as st

from clients import protocol
from devices import consumers, rpc, services
from tests.devices.tunnel_support import Device as FakeDevice
from tests.fuzz import strategies as hs
from tests.fuzz.conftest import SHARED_FIXTURE

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

JSONRPC_ERRORS = {protocol.PARSE_ERROR, protocol.INVALID_REQUEST, protocol.METHOD_NOT_FOUND, protocol.INVALID_PARAMS,
                  protocol.APPLICATION_ERROR}
# Methods only test or benchmark modules register (they fail on purpose or need a bench setup).
NOT_PRODUCT = ("tests.", "bench.")
PRODUCT_METHODS = [m for m in rpc.registered_methods() if not m.startswith(NOT_PRODUCT)]
# What a device may send besides the registered requests (clients/protocol.py).
PROTOCOL_NOTIFICATIONS = [protocol.ACK, protocol.HEARTBEAT, protocol.HELLO, protocol.WEB_RESPONSE, protocol.WEB_DATA,
                          protocol.WEB_END, protocol.WEB_RESET, protocol.WEB_CREDIT, protocol.WEB_WS_ACCEPT,
                          protocol.WEB_WS_FRAME, protocol.WEB_WS_CLOSE]


class LiveTunnel:
    """One device connection in an event loop of its own, so that a synchronous @given test can send it
    one hostile example after another and check it is still alive after each."""

    def __init__(self, token: str, **hello: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.token = token
        self.hello = hello
        self.last_frame: str | bytes = ""
        self.device = self.run(self._open())

    async def _open(self) -> FakeDevice:
        device = FakeDevice(self.token)
        await device.open()
        await device.hello(**self.hello)
        return device

    def run(self, coroutine: Any) -> Any:
        return self.loop.run_until_complete(coroutine)

    def exchange(self, frame: str | bytes, request_id: Any = None) -> list[dict[str, Any]]:
        """Send ``frame``, then a ping; the frames that came back until the ping's answer (and the answer
        to ``request_id``, when the frame was a request), heartbeats and deliveries left out."""
        return self.run(self._exchange(frame, request_id))

    async def _exchange(self, frame: str | bytes, request_id: Any) -> list[dict[str, Any]]:
        comm = self.device.comm
        # A dead consumer fails every later example with CancelledError, which Hypothesis does not catch:
        # name the frame that killed it instead.
        assert not comm.future.done(), f"the consumer is gone since {self.last_frame!r:.500}"
        self.last_frame = frame
        # send_input, not send_to: an empty frame is a frame too
        await comm.send_input({"type": "websocket.receive", **({"bytes": frame} if isinstance(frame, bytes) else
                                                               {"text": frame})})
        ping_id = f"ping-{uuid.uuid4()}"
        await comm.send_to(text_data=protocol.request("devices.ping", {}, ping_id))
        waiting = {ping_id} | ({request_id} if request_id is not None else set())
        replies: list[dict[str, Any]] = []
        while waiting:
            try:
                # Not comm.receive_output: its timeout cancels the consumer, and with it every later example.
                output = await asyncio.wait_for(comm.output_queue.get(), 10)
            except TimeoutError:
                raise AssertionError(f"no answer to {waiting} after {frame[:300]!r}; got {replies}") from None
            assert output["type"] == "websocket.send", f"the tunnel closed after {frame[:300]!r}: {output}"
            message = json.loads(output["text"])
            if message.get("method") in (protocol.HEARTBEAT, protocol.DELIVER):
                continue
            waiting.discard(message.get("id"))
            if message.get("id") == ping_id:
                assert message.get("result", {}).get("pong") is True, message
            else:
                replies.append(message)
        return replies

    def close(self) -> None:
        self.run(self.device.close())
        close_loop(self.loop)


def close_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Let the consumer's last tasks (presence writes after a disconnect) finish, then close ``loop``."""
    # They wait a heartbeat (20 s) before they look again; the stream relay's listener (on Redis) serves
    # until its loop closes, and so does each connection it accepted (``_serve``, waiting for the dialler's
    # next message: a doorbell to this process's tunnel dials its own relay). Waited for, the last kept ten
    # examples here 10 s each (the test took 81-103 s on PostgreSQL + Redis, a tenth of that CI run).
    sleepers = ("_TunnelSweep.run", "DeviceConsumer._tick", "Server.serve_forever", "_serve")
    pending = [t for t in asyncio.all_tasks(loop) if t.get_coro().__qualname__ not in sleepers]
    if pending:
        loop.run_until_complete(asyncio.wait(pending, timeout=10))
    left = asyncio.all_tasks(loop)
    for task in left:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.close()
    # The next example runs on a new loop: with a new layer too (channels-redis keeps asyncio locks in it,
    # and one still held for this loop failed the next example's receive: "bound to a different event loop").
    channel_layers.backends.pop(DEFAULT_CHANNEL_LAYER, None)


@pytest.fixture
def tunnel(user, monkeypatch, error_log) -> Iterator[LiveTunnel]:
    # Sustained abuse closes the tunnel (4400, its own test in tests/devices); here every example is one
    # malformed frame on the same connection, so the close would end the fuzzing, not find a defect.
    monkeypatch.setattr(consumers, "ABUSE_LIMIT", 10**9)
    user.mobile_reply_enabled = True  # else the question methods refuse before they look at their params
    user.save(update_fields=["mobile_reply_enabled"])
    device, token = services.device_create(owner=user, name="fuzzed", kind="bridge")
    live = LiveTunnel(token)
    yield live
    live.close()


def assert_refusal_named(reply: dict[str, Any]) -> None:
    """A JSON-RPC error with a standard code and a message that says what was wrong."""
    assert reply.get("jsonrpc") == "2.0", reply
    error = reply.get("error")
    assert isinstance(error, dict), reply
    assert error.get("code") in JSONRPC_ERRORS, reply
    assert isinstance(error.get("message"), str) and error["message"].strip(), reply
    assert error["message"] != "internal error", reply


def assert_no_errors_logged(error_log, mark: int, frame: Any) -> None:
    logged = error_log.since(mark)
    assert not logged, f"{frame!r:.500} logged: {logged}"


def test_every_registered_method_is_fuzzed():
    """A method registered after collection (lazily, or by a module imported later) would be skipped."""
    assert PRODUCT_METHODS, "no device methods registered"
    assert sorted(m for m in rpc.registered_methods() if not m.startswith(NOT_PRODUCT)) == PRODUCT_METHODS


@pytest.mark.parametrize("method", PRODUCT_METHODS)
@settings(SHARED_FIXTURE, max_examples=25)  # per method: together they are what one fuzz file may cost
@given(params=hs.any_params, request_id=hs.request_ids)
def test_registered_method_with_hostile_params(tunnel, error_log, method, params, request_id):
    mark = len(error_log.records)
    frame = hs.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
    valid_id = request_id is not None and isinstance(request_id, str | int) and not isinstance(request_id, bool)
    if not hs.strict_json(frame):  # NaN or Infinity somewhere: not JSON, so no id to answer to
        replies = tunnel.exchange(frame)
        assert [r["error"]["code"] for r in replies] == [protocol.PARSE_ERROR], (frame[:300], replies)
        assert_refusal_named(replies[0])
    elif valid_id:
        replies = tunnel.exchange(frame, request_id)
        mine = [r for r in replies if r.get("id") == request_id]
        assert mine, (frame[:300], replies)
        if "error" in mine[0]:
            assert_refusal_named(mine[0])
    else:  # not an id a response can carry: refused as an invalid request
        replies = tunnel.exchange(frame)
        assert replies and all("error" in r for r in replies), (frame[:300], replies)
        for reply in replies:
            assert_refusal_named(reply)
    assert_no_errors_logged(error_log, mark, frame)


@SHARED_FIXTURE
@given(method=st.sampled_from(PROTOCOL_NOTIFICATIONS) | hs.nasty_text.filter(bool),
       params=hs.notification_params | hs.any_params)
def test_notifications_with_hostile_params(tunnel, error_log, method, params):
    mark = len(error_log.records)
    frame = hs.dumps({"jsonrpc": "2.0", "method": method, "params": params})
    for reply in tunnel.exchange(frame):
        assert_refusal_named(reply)
    assert_no_errors_logged(error_log, mark, frame)


@SHARED_FIXTURE
@given(frame=hs.garbage_text | hs.garbage_bytes)
def test_garbage_frames_are_refused_and_the_tunnel_lives(tunnel, error_log, frame):
    mark = len(error_log.records)
    for reply in tunnel.exchange(frame):
        assert_refusal_named(reply)
    assert_no_errors_logged(error_log, mark, frame)


@SHARED_FIXTURE
@given(params=hs.hello_params | hs.any_params)
def test_hostile_hello_is_refused_and_a_good_one_still_works(user, error_log, params):
    """Before hello: a refused hello leaves the connection waiting for a good one."""
    mark = len(error_log.records)
    device, token = services.device_create(owner=user, name="hello-fuzzed", kind="bridge")
    loop = asyncio.new_event_loop()

    async def go() -> None:
        dev = FakeDevice(token)
        await dev.open()
        try:
            request_id = str(uuid.uuid4())
            await dev.send(hs.dumps({"jsonrpc": "2.0", "id": request_id, "method": protocol.HELLO,
                                     "params": params}))
            reply = await dev.wait_for(lambda m: "method" not in m, timeout=10)
            if "error" in reply:
                assert_refusal_named(reply)
                assert reply["id"] in (request_id, None), reply
                await dev.hello()  # the same connection takes a good hello next
        finally:
            await dev.close()

    try:
        loop.run_until_complete(go())
    finally:
        close_loop(loop)
    assert_no_errors_logged(error_log, mark, params)
