"""Fuzzing the long-poll fallback (POST /api/devices/bridge/pull and /push) with hostile bodies.

Every answer is 200 (push: a JSON-RPC result or error) or a 4xx whose JSON body names the problem; never a
5xx, never an ERROR in the log.
"""

from __future__ import annotations

import json

import pytest
from django.test import Client
from hypothesis import given
from hypothesis import strategies as st

from clients import protocol
from devices import rpc, services
from tests.fuzz import strategies as hs
from tests.fuzz.conftest import SHARED_FIXTURE

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

PULL, PUSH = "/api/devices/bridge/pull", "/api/devices/bridge/push"
CONTENT_TYPES = st.sampled_from(["application/json", "text/plain", "application/x-www-form-urlencoded",
                                 "multipart/form-data; boundary=x", "application/json; charset=latin-1", ""])


def raw(value) -> bytes:
    return hs.dumps(value).encode("utf-8", "surrogatepass")


pull_bodies = (st.builds(lambda acked: raw({"ackedSeq": acked}), hs.scalars | hs.json_values)
               | st.builds(raw, hs.json_values) | st.binary(max_size=200))
push_bodies = (
    st.builds(lambda i, m, p: raw({"id": i, "method": m, "params": p}), hs.request_ids,
              st.sampled_from(rpc.registered_methods()) | hs.nasty_text | hs.oversize_text | hs.scalars, hs.any_params)
    | st.builds(raw, hs.json_values) | st.binary(max_size=200)
    | st.builds(lambda text: text.encode("utf-8", "surrogatepass"), hs.garbage_text)
)


@pytest.fixture
def bridge(user, settings) -> Client:
    settings.DEVICE_LONGPOLL_HOLD_SEC = 0  # a pull answers at once: each example is one round trip
    user.mobile_reply_enabled = True
    user.save(update_fields=["mobile_reply_enabled"])
    _, token = services.device_create(owner=user, name="poller", kind="bridge")
    return Client(HTTP_AUTHORIZATION=f"Bearer {token}", REMOTE_ADDR="198.51.100.9")


def post(client: Client, path: str, body: bytes, content_type: str):
    """The bytes as they are (Client.post would re-encode them for a charset and fail on non-UTF-8)."""
    return client.generic("POST", path, body, content_type=content_type)


def check(response, body: bytes) -> dict:
    assert response.status_code < 500, (response.status_code, body[:300], response.content[:500])
    assert response["Content-Type"].startswith("application/json"), (body[:300], response.content[:300])
    answer = json.loads(response.content)
    if response.status_code >= 400:
        assert isinstance(answer.get("error"), str) and answer["error"], answer
        assert isinstance(answer.get("detail"), str) and answer["detail"].strip(), answer
    return answer


@SHARED_FIXTURE
@given(body=pull_bodies, content_type=CONTENT_TYPES)
def test_pull_with_hostile_bodies(bridge, error_log, body, content_type):
    mark = len(error_log.records)
    answer = check(post(bridge, PULL, body, content_type), body)
    assert "items" in answer or "error" in answer, answer
    assert not error_log.since(mark), (body[:300], error_log.since(mark))


@SHARED_FIXTURE
@given(body=push_bodies, content_type=CONTENT_TYPES)
def test_push_with_hostile_bodies(bridge, error_log, body, content_type):
    mark = len(error_log.records)
    answer = check(post(bridge, PUSH, body, content_type), body)
    if "id" in answer and "error" in answer:  # a JSON-RPC refusal, as on the tunnel
        assert answer["error"]["code"] != protocol.INTERNAL_ERROR, (body[:300], answer)
        assert answer["error"]["message"].strip(), answer
    assert not error_log.since(mark), (body[:300], error_log.since(mark))


@pytest.mark.parametrize("path", [PULL, PUSH])
def test_a_body_over_the_frame_limit_is_413_unread(bridge, path):
    declared = protocol.MAX_FRAME_BYTES + 1
    response = bridge.generic("POST", path, b"{}", content_type="application/json", CONTENT_LENGTH=str(declared))
    assert response.status_code == 413
    assert response.json()["error"] == "too_large"
