"""Defects the fuzzers found, each pinned by a plain example (fast, both configurations)."""

from __future__ import annotations

import pytest

from clients import protocol
from devices import rpc, services
from devices.models import DeviceRequest


@pytest.mark.parametrize("frame", [
    '{"jsonrpc": "2.0", "id": 1, "method": "devices.ping", "params": {"x": NaN}}',
    '{"jsonrpc": "2.0", "id": 1, "method": "devices.ping", "params": {"x": -Infinity}}',
    '{"jsonrpc": "2.0", "id": 1, "method": "devices.ping", "params": {"x": 1e400}}',
])
def test_nan_and_infinity_are_not_json(frame):
    """Python's json.loads takes them; PostgreSQL's jsonb, JSON.parse and the standard do not."""
    with pytest.raises(protocol.ProtocolError) as caught:
        protocol.parse(frame)
    assert caught.value.code == protocol.PARSE_ERROR
    assert protocol.parse(frame.replace("NaN", "1.5").replace("-Infinity", "2").replace("1e400", "1e300"))


@pytest.mark.django_db
@pytest.mark.parametrize(("request_id", "params", "field"), [
    ("a\x00b", {}, "id"),  # PostgreSQL: "text fields cannot contain NUL (0x00) bytes" -> internal error
    ("r1", {"session_id": "s\x00"}, "params.session_id"),
    ("r2", {"answers": {"k\ud800": "v"}}, "params.answers.k\\ud800"),  # a lone surrogate: not UTF-8
    ("r3", {"questions": [{"options": ["ok", "\x00"]}]}, "params.questions[0].options[1]"),
])
def test_text_no_database_can_store_is_refused_by_name(user, request_id, params, field):
    device, _ = services.device_create(owner=user, name="laptop", kind="bridge")
    response = rpc.dispatch(device, request_id, "mobile.session_start", params)
    assert response["error"]["code"] == protocol.INVALID_PARAMS
    assert response["error"]["data"]["code"] == "bad_text"
    assert response["error"]["data"]["field"] == field
    assert field in response["error"]["message"]
    assert not DeviceRequest.objects.exists()


@pytest.fixture
def poller(user, settings):
    from django.test import Client

    settings.DEVICE_LONGPOLL_HOLD_SEC = 0
    _, token = services.device_create(owner=user, name="poller", kind="bridge")
    return Client(HTTP_AUTHORIZATION=f"Bearer {token}")


@pytest.mark.django_db(transaction=True)
def test_a_pull_acking_past_a_64_bit_seq_is_400_not_500(poller):
    """The database's seq is 64-bit: SQLite raised OverflowError, PostgreSQL a DataError (both 500)."""
    response = poller.post("/api/devices/bridge/pull", {"ackedSeq": 2**63}, content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_params" and "ackedSeq" in response.json()["detail"]
    response = poller.post("/api/devices/bridge/pull", {"ackedSeq": 2**63 - 1}, content_type="application/json")
    assert response.status_code == 200


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("path", ["/api/devices/bridge/pull", "/api/devices/bridge/push"])
def test_a_long_poll_body_nested_past_the_parser_is_400_not_500(poller, path):
    response = poller.post(path, "[" * 100_000 + "]" * 100_000, content_type="application/json")
    assert response.status_code == 400
    assert response.json() == {"error": "parse_error", "detail": "the body is nested too deeply"}


@pytest.mark.django_db(transaction=True)
async def test_tunnel_ack_and_hello_past_a_64_bit_seq_are_refused(user, error_log):
    from asgiref.sync import sync_to_async

    from tests.devices.tunnel_support import Device as FakeDevice

    _, token = await sync_to_async(services.device_create)(owner=user, name="laptop", kind="bridge")
    dev = FakeDevice(token)
    await dev.open()
    await dev.send(protocol.request(protocol.HELLO, {"protocolVersion": 1, "ackedSeq": 2**63}, "h1"))
    reply = await dev.wait_for(lambda m: m.get("id") == "h1")
    assert reply["error"]["code"] == protocol.INVALID_PARAMS and "ackedSeq" in reply["error"]["message"]
    await dev.hello()
    await dev.ack(2**63)  # was written as is: an OverflowError / DataError logged by the ack flush
    reply = await dev.wait_for(lambda m: "error" in m)
    assert reply["error"]["code"] == protocol.INVALID_PARAMS and "seq" in reply["error"]["message"]
    assert (await dev.call("devices.ping", {}))["result"]["pong"] is True
    await dev.close()
    assert not error_log.since(0)



@pytest.mark.parametrize(("body", "status"), [
    (b'{"timeout": 1e300}', 200),  # LocalApi.call waited timeout + 60 s: past the clock's range, a 500
    (b'{"timeout": Infinity}', 400),  # not JSON
    (b"[" * 100_000 + b"]" * 100_000, 400),  # the parser's RecursionError killed the request thread: no answer
])
def test_bridge_api_huge_timeout_or_deep_nesting_is_no_500(tmp_path, error_log, body, status):
    import json

    from tests.fuzz.test_bridge_api_fuzz import Daemon

    daemon = Daemon(tmp_path)
    try:
        answer = daemon.request("POST", "/v1/health", body, daemon.good_headers(body))
        assert answer[0] == status, answer
        assert status == 200 or json.loads(answer[1]) == {"error": "bad_json"}
        assert daemon.healthy()
    finally:
        daemon.stop()
    assert not error_log.since(0)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("version", [2**31, 2**63, 10**30])
async def test_a_hello_with_a_protocol_version_past_its_column_is_refused(user, error_log, version):
    """Written as is, 2**63 crashed the consumer (psycopg: "int too big to convert"; found by the fuzzer in CI)."""
    from asgiref.sync import sync_to_async

    from tests.devices.tunnel_support import Device as FakeDevice

    _, token = await sync_to_async(services.device_create)(owner=user, name="laptop", kind="bridge")
    dev = FakeDevice(token)
    await dev.open()
    await dev.send(protocol.request(protocol.HELLO, {"protocolVersion": version, "kind": "bridge"}, "h1"))
    reply = await dev.wait_for(lambda m: m.get("id") == "h1")
    assert reply["error"]["code"] == protocol.INVALID_PARAMS and "protocolVersion" in reply["error"]["message"]
    await dev.hello()  # the same connection takes a good one
    await dev.close()
    assert not error_log.since(0)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("extra", "field"), [({"roots": ["/a\x00b"]}, "hello.roots[0]"),
                                              ({"capabilities": ["m\x00"]}, "hello.capabilities[0]"),
                                              ({"version": "1\x00"}, "hello.version"),
                                              ({"roots": ["/\ud800"]}, "hello.roots[0]")])
async def test_a_hello_with_text_no_database_can_store_is_refused_by_name(user, error_log, extra, field):
    """PostgreSQL refused the hello's write (roots, capabilities, version are stored): the consumer died of it."""
    from asgiref.sync import sync_to_async

    from tests.devices.tunnel_support import Device as FakeDevice

    _, token = await sync_to_async(services.device_create)(owner=user, name="laptop", kind="bridge")
    dev = FakeDevice(token)
    await dev.open()
    await dev.send(protocol.request(protocol.HELLO, {"protocolVersion": 1, "kind": "bridge", **extra}, "h1"))
    reply = await dev.wait_for(lambda m: m.get("id") == "h1")
    assert reply["error"]["code"] == protocol.INVALID_PARAMS and field in reply["error"]["message"], reply
    await dev.hello()  # the same connection takes a good one
    await dev.close()
    assert not error_log.since(0)
