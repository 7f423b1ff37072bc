"""Every field declared in clients/limits.py, walked with a value one past its limit, through the entry
point that receives it from outside: refused with 413/400 (HTTP) or JSON-RPC -32602, naming the field
and the limit, and nothing stored."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from clients import limits
from clients.limits import BYTES, CHARS, ITEMS, LIMITS
from devices.consumers import _validate_hello
from devices.models import Device, DeviceRequest, PairingRequest
from devices.rpc import dispatch
from devices.services import device_create
from im.models import Message
from mobile.models import AgentSession, Answer, PhoneMessage, Question
from probes.models import ProbeCommand
from tests.mobile.factories import ONE_QUESTION, ask, bridge_for, enable_mobile

pytestmark = pytest.mark.django_db


def over(name: str, unit_value: Any = "x") -> Any:
    """A value one past the limit ``name``."""
    limit = LIMITS[name]
    if limit.unit == CHARS:
        return "x" * (limit.max + 1)
    if limit.unit == ITEMS:
        return [unit_value] * (limit.max + 1)
    assert limit.unit == BYTES
    return {"data": "x" * limit.max}


class World:
    def __init__(self, client, user) -> None:
        self.user = enable_mobile(user)
        self.client = client
        client.force_login(user)
        self.bridge = bridge_for(user)
        self.question, self.nonce = ask(self.bridge)
        self.session = AgentSession.objects.get(session_id="sess-1")
        self.bridge_token = device_create(owner=user, name="desk2", kind=Device.Kind.BRIDGE)[1]

    def counts(self) -> dict[str, int]:
        # (DeviceRequest keeps each request's response, the refusal too, for idempotency: not the value)
        models = [Device, PairingRequest, AgentSession, Question, Answer, PhoneMessage, Message,
                  ProbeCommand]
        return {m.__name__: m.objects.count() for m in models}

    # --- entry points ---------------------------------------------------------------------------
    def rpc(self, method: str, params: dict, request_id: str | None = None) -> dict:
        return dispatch(self.bridge, request_id or str(uuid.uuid4()), method, params)

    def post(self, path: str, body: Any, **headers: str):
        return self.client.post(path, json.dumps(body), content_type="application/json", **headers)

    def question_params(self, **change: Any) -> dict:
        return {"question_id": str(uuid.uuid4()), "session_id": "sess-1", "tool_use_id": "t-new",
                "questions": ONE_QUESTION, "window_sec": 60, **change}

    def one_question(self, **change: Any) -> list[dict]:
        return [{**ONE_QUESTION[0], **change}]

    def option(self, **change: Any) -> list[dict]:
        options = [dict(o) for o in ONE_QUESTION[0]["options"]]
        options[0].update(change)
        return self.one_question(options=options)

    def answer(self, answers: Any, other: Any = None):
        body = {"question_id": str(self.question.pk), "nonce": self.nonce, "answers": answers}
        if other is not None:
            body["other"] = other
        return self.post("/api/mobile/answer", body)


def rpc_refused(response: dict, field: str, name: str) -> None:
    assert "error" in response, response
    error = response["error"]
    assert error["code"] == -32602, error
    assert error["data"]["code"] == "too_large" and error["data"]["field"] == field, error
    assert error["data"]["limit"] == LIMITS[name].max
    assert field in error["message"] and str(LIMITS[name].max) in error["message"]


def http_refused(response, field: str, name: str) -> None:
    assert response.status_code in (400, 413), (response.status_code, response.content[:300])
    text = response.content.decode()
    assert field in text and str(LIMITS[name].max) in text, text[:500]


def hello_refused(world: World, field: str, name: str, **params: Any) -> None:
    with pytest.raises(limits.LimitExceeded) as caught:
        _validate_hello({"protocolVersion": 1, **params}, world.bridge)
    assert isinstance(caught.value, ValueError)  # the consumer answers ValueError with -32602
    assert caught.value.field == field and str(LIMITS[name].max) in str(caught.value)


def session_start(world: World, field: str, name: str) -> None:
    rpc_refused(world.rpc("mobile.session_start", {"session_id": "sess-new", field: over(name)}), field, name)


def question(world: World, field: str, name: str, **params: Any) -> None:
    rpc_refused(world.rpc("mobile.question", world.question_params(**params)), field, name)


def pairing_case(key: str) -> Callable[[World], None]:
    def case(w: World) -> None:
        body = {"name": "n", "kind": "bridge", key: over(f"device.{key}")}
        http_refused(w.post("/api/devices/pairings", body), key, f"device.{key}")

    return case


def session_case(key: str) -> Callable[[World], None]:
    return lambda w: session_start(w, key, f"session.{key}")


def probe_result(world: World) -> None:
    from probes.services import _finish

    probe = device_create(owner=world.user, name="probe", kind=Device.Kind.PROBE)[0]
    command = ProbeCommand.objects.create(owner=world.user, device=probe, requested_by=world.user, op="read",
                                          args={"path": "a"}, args_hash="0" * 64, state=ProbeCommand.State.SENT)
    _finish(command, state=ProbeCommand.State.DONE, result=over("probe.result"))
    command.refresh_from_db()
    assert command.state == ProbeCommand.State.FAILED and command.result is None
    assert command.error["code"] == "too_large" and str(LIMITS["probe.result"].max) in command.error["detail"]


CASES: dict[str, Callable[[World], None]] = {
    "frame": lambda w: http_refused(
        w.client.post("/api/devices/bridge/push", {"id": "1", "method": "devices.ping",
                                                   "params": {"pad": "x" * LIMITS["frame"].max}},
                      content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {w.bridge_token}"),
        "body", "frame"),
    "rpc.id": lambda w: rpc_refused(w.rpc("devices.ping", {}, request_id=over("rpc.id")), "id", "rpc.id"),
    "rpc.method": lambda w: http_refused(
        w.post("/api/devices/bridge/push", {"id": "1", "method": over("rpc.method"), "params": {}},
               HTTP_AUTHORIZATION=f"Bearer {w.bridge_token}"), "method", "rpc.method"),
    "hello.version": lambda w: hello_refused(w, "version", "hello.version", version=over("hello.version")),
    "hello.capabilities": lambda w: hello_refused(w, "capabilities", "hello.capabilities",
                                                  capabilities=over("hello.capabilities")),
    "hello.capability": lambda w: hello_refused(w, "capabilities[0]", "hello.capability",
                                                capabilities=[over("hello.capability")]),
    "hello.roots": lambda w: hello_refused(w, "roots", "hello.roots", roots=over("hello.roots", "/")),
    "hello.root": lambda w: hello_refused(w, "roots[0]", "hello.root", roots=[over("hello.root")]),
    "hello.ports": lambda w: hello_refused(w, "ports", "hello.ports", ports=over("hello.ports", 20000)),
    **{f"device.{key}": pairing_case(key) for key in ("name", "hostname", "os", "version")},
    "pairing.device_code": lambda w: http_refused(
        w.post("/api/devices/pairings/token", {"device_code": over("pairing.device_code")}), "device_code",
        "pairing.device_code"),
    "session.session_id": lambda w: rpc_refused(
        w.rpc("mobile.session_start", {"session_id": over("session.session_id")}), "session_id",
        "session.session_id"),
    **{f"session.{key}": session_case(key) for key in ("cwd", "source", "host", "title")},
    "session.reason": lambda w: rpc_refused(
        w.rpc("mobile.session_end", {"session_id": "sess-1", "reason": over("session.reason")}), "reason",
        "session.reason"),
    "hook.event": lambda w: rpc_refused(
        w.rpc("mobile.hook_event", {"session_id": "sess-1", "event": over("hook.event")}), "event", "hook.event"),
    "question.question_id": lambda w: question(w, "question_id", "question.question_id",
                                               question_id=over("question.question_id")),
    "question.tool_use_id": lambda w: question(w, "tool_use_id", "question.tool_use_id",
                                               tool_use_id=over("question.tool_use_id")),
    "question.questions": lambda w: question(w, "questions", "question.questions",
                                             questions=over("question.questions", ONE_QUESTION[0])),
    "question.question": lambda w: question(w, "questions[0].question", "question.question",
                                            questions=w.one_question(question=over("question.question"))),
    "question.header": lambda w: question(w, "questions[0].header", "question.header",
                                          questions=w.one_question(header=over("question.header"))),
    "question.options": lambda w: question(w, "questions[0].options", "question.options",
                                           questions=w.one_question(options=over("question.options",
                                                                                 {"label": "a"}))),
    "option.label": lambda w: question(w, "questions[0].options[0].label", "option.label",
                                       questions=w.option(label=over("option.label"))),
    "option.description": lambda w: question(w, "questions[0].options[0].description", "option.description",
                                             questions=w.option(description=over("option.description"))),
    "answer.answers": lambda w: http_refused(
        w.answer({f"q{n}": ["React"] for n in range(LIMITS["answer.answers"].max + 1)}), "answers",
        "answer.answers"),
    "answer.labels": lambda w: http_refused(w.answer({"Which framework?": over("answer.labels", "React")}),
                                            "answers", "answer.labels"),
    "answer.other": lambda w: http_refused(w.answer({"Which framework?": []},
                                                    {"Which framework?": over("answer.other")}),
                                           "other", "answer.other"),
    "answer.desktop": lambda w: rpc_refused(
        w.rpc("mobile.desktop_answer", {"session_id": "sess-1", "question_id": str(w.question.pk),
                                        "answers": {"Which framework?": over("answer.desktop")}}),
        "answers['Which framework?']", "answer.desktop"),
    "message.text": lambda w: http_refused(
        w.post("/api/mobile/sessions/sess-1/messages", {"text": over("message.text")}), "text", "message.text"),
    "message.ids": lambda w: rpc_refused(
        w.rpc("mobile.message_consumed", {"message_ids": over("message.ids", str(uuid.uuid4()))}), "message_ids",
        "message.ids"),
    "room.text": lambda w: http_refused(
        w.post(f"/api/im/rooms/{w.session.room_id}/messages", {"text": over("room.text")}), "text", "room.text"),
    "probe.args": lambda w: _probe_args(),
    "probe.result": probe_result,
    "permission.tool_name": lambda w: rpc_refused(
        w.rpc("mobile.permission", _permission_params(tool_name=over("permission.tool_name"))), "tool_name",
        "permission.tool_name"),
    "permission.tool_input": lambda w: rpc_refused(
        w.rpc("mobile.permission", _permission_params(tool_input=over("permission.tool_input"))), "tool_input",
        "permission.tool_input"),
    "permission.input_hash": lambda w: rpc_refused(
        w.rpc("mobile.permission", _permission_params(input_hash=over("permission.input_hash"))), "input_hash",
        "permission.input_hash"),
    "permission.rendering": lambda w: _permission_rendering(),
}


def _permission_params(**change: Any) -> dict:
    from clients import permission

    tool_input = change.pop("tool_input", {"command": "ls"})
    return {"question_id": str(uuid.uuid4()), "session_id": "sess-1", "tool_name": "Bash", "tool_input": tool_input,
            "input_hash": permission.input_hash(tool_input), "window_sec": 60, **change}


def _permission_rendering() -> None:
    """Derived, not received: what the phone is shown of a tool input is cut to fit, never refused."""
    from clients import permission

    shown = permission.render("Bash", {"command": over("permission.rendering")})
    assert shown["truncated"] and len(shown["text"]) == LIMITS["permission.rendering"].max


def _probe_args() -> None:
    from ai1net.exceptions import PayloadTooLarge
    from probes import ops

    with pytest.raises(PayloadTooLarge) as caught:
        ops.validate("read", over("probe.args"))
    assert caught.value.status == 413 and caught.value.extra["field"] == "args"
    assert str(LIMITS["probe.args"].max) in caught.value.detail


def test_every_declared_limit_has_a_case():
    assert sorted(CASES) == sorted(LIMITS)


# The long-poll views are async: under the sync test client they need a real transaction.
ASYNC_VIEWS = ("frame", "rpc.method")


@pytest.mark.parametrize("name", [
    pytest.param(name, marks=pytest.mark.django_db(transaction=True)) if name in ASYNC_VIEWS else name
    for name in sorted(LIMITS)
])
def test_oversize_is_refused_naming_the_field_and_nothing_is_stored(name, client, user):
    world = World(client, user)
    before = world.counts()
    CASES[name](world)
    after = world.counts()
    if name == "probe.result":  # the command row itself is the test's setup; it holds no result
        after["ProbeCommand"] -= 1
        after["Device"] -= 1
        after["Message"] = before["Message"]  # the studio room notes the refusal
    assert after == before
    assert Question.objects.get(pk=world.question.pk).state == Question.State.PENDING
    for response in DeviceRequest.objects.values_list("response", flat=True):
        assert len(json.dumps(response)) < 2000  # a refusal names the size, never carries the value


def test_exactly_at_the_limit_is_accepted(client, user):
    world = World(client, user)
    question, _ = ask(world.bridge, tool_use_id="t-max", questions=[{**ONE_QUESTION[0], "question": "q" * LIMITS["question.question"].max}])
    assert len(question.questions[0]["question"]) == LIMITS["question.question"].max
    response = client.post("/api/mobile/sessions/sess-1/messages", {"text": "m" * LIMITS["message.text"].max},
                          content_type="application/json")
    assert response.status_code == 201
