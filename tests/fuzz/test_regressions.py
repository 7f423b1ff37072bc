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
