"""The bridge's requests (through the devices dispatcher), the switch, phone messages, keep going, state."""

import uuid

import pytest
from django.test import override_settings

from ai1net.accounts.services import user_switch_set
from clients import protocol
from devices.models import Device
from devices.rpc import dispatch
from devices.signals import device_connected
from im.models import Room
from mobile import services
from mobile.models import AgentSession, PhoneMessage, Question
from tests.mobile.factories import ONE_QUESTION, ask, bridge_for, enable_mobile, outbox

pytestmark = pytest.mark.django_db


def call(device, method, params, request_id=None):
    return dispatch(device, request_id or str(uuid.uuid4()), method, params)


def test_session_start_opens_one_room_idempotently(bridge):
    params = {"session_id": "s1", "cwd": "/home/alice/shop", "source": "startup", "host": "laptop"}
    first = call(bridge, "mobile.session_start", params)["result"]
    again = call(bridge, "mobile.session_start", {**params, "source": "resume"})["result"]
    assert first == again == {"room_id": first["room_id"], "mobile_reply": True}
    room = Room.objects.get(pk=first["room_id"])
    assert room.kind == "agent_session" and room.owner == bridge.owner and room.title == "shop"
    assert AgentSession.objects.filter(device=bridge, session_id="s1").count() == 1


def test_question_is_idempotent_per_question_id(bridge):
    call(bridge, "mobile.session_start", {"session_id": "s1"})
    qid = str(uuid.uuid4())
    params = {"question_id": qid, "session_id": "s1", "tool_use_id": "t1", "questions": ONE_QUESTION, "window_sec": 60}
    first = call(bridge, "mobile.question", params)["result"]
    second = call(bridge, "mobile.question", params)["result"]  # a new request id: the service is idempotent
    assert first == second
    assert first["state"] == "pending" and first["mobile_reply"] is True and first["question_id"] == qid
    assert Question.objects.filter(pk=qid).count() == 1


def test_question_without_session_start_registers_the_session(bridge):
    qid = str(uuid.uuid4())
    result = call(bridge, "mobile.question", {"question_id": qid, "session_id": "late", "questions": ONE_QUESTION,
                                              "window_sec": 30})
    assert result["result"]["state"] == "pending"
    assert AgentSession.objects.get(device=bridge, session_id="late").room_id


def test_question_with_the_switch_off_is_mobile_reply_off(bridge, mobile_user):
    user_switch_set(actor=mobile_user, user=mobile_user, switch="mobile_reply", enabled=False)
    bridge.owner.refresh_from_db()
    response = call(bridge, "mobile.question", {"question_id": str(uuid.uuid4()), "session_id": "s1",
                                                "questions": ONE_QUESTION, "window_sec": 30})
    assert response["error"]["code"] == protocol.APPLICATION_ERROR
    assert response["error"]["data"]["code"] == "mobile_reply_off"
    assert Question.objects.count() == 0


def test_a_switch_turned_off_while_the_tunnel_lives_is_seen(bridge, mobile_user):
    """The tunnel consumer holds the Device loaded at connect; the dispatcher must not trust its owner."""
    live = Device.objects.select_related("owner").get(pk=bridge.pk)  # loaded at connect
    assert live.owner.mobile_reply_enabled
    user_switch_set(actor=mobile_user, user=mobile_user, switch="mobile_reply", enabled=False)
    response = call(live, "mobile.question", {"question_id": str(uuid.uuid4()), "session_id": "s1",
                                                "questions": ONE_QUESTION, "window_sec": 30})
    assert response["error"]["data"]["code"] == "mobile_reply_off"


@override_settings(MOBILE_REPLY_ENABLED=False)
def test_question_with_the_global_stop_is_mobile_reply_off(bridge):
    response = call(bridge, "mobile.question", {"question_id": str(uuid.uuid4()), "session_id": "s1",
                                                "questions": ONE_QUESTION, "window_sec": 30})
    assert response["error"]["data"]["code"] == "mobile_reply_off"


@pytest.mark.parametrize(
    "questions",
    [[], [{"question": "Q", "header": "H", "options": [{"label": "only"}], "multiSelect": False}],
     [{"question": "Q", "header": "H", "options": [{"label": "a"}, {"label": "a"}], "multiSelect": False}],
     "not a list"],
)
def test_malformed_questions_are_invalid_params(bridge, questions):
    response = call(bridge, "mobile.question", {"question_id": str(uuid.uuid4()), "session_id": "s1",
                                                "questions": questions, "window_sec": 30})
    assert response["error"]["code"] == protocol.INVALID_PARAMS


def test_a_probe_cannot_ask(mobile_user):
    from devices.services import device_create

    probe, _ = device_create(owner=mobile_user, name="srv", kind="probe")
    response = call(probe, "mobile.session_start", {"session_id": "s1"})
    assert response["error"]["data"]["code"] == "forbidden"


def test_question_moved_and_desktop_answer_via_rpc(bridge):
    question, _ = ask(bridge)
    moved = call(bridge, "mobile.question_moved", {"question_id": str(question.pk), "reason": "timeout"})
    assert moved == {"result": {"state": "moved_to_desktop"}}
    desk = call(bridge, "mobile.desktop_answer", {"session_id": "sess-1", "tool_use_id": "toolu_01",
                                                  "answers": {"Which framework?": "Vue"}})
    assert desk == {"result": {"state": "answered_on_desktop"}}
    unknown = call(bridge, "mobile.desktop_answer", {"session_id": "sess-1", "tool_use_id": "nope", "answers": {}})
    assert unknown == {"result": {"state": "unknown"}}


def test_another_devices_question_cannot_be_moved(bridge, other_user):
    question, _ = ask(bridge)
    theirs = bridge_for(other_user, "theirs")
    response = call(theirs, "mobile.question_moved", {"question_id": str(question.pk), "reason": "timeout"})
    assert response["error"]["data"]["code"] == "not_found"
    assert Question.objects.get(pk=question.pk).state == "pending"


def test_session_end_cancels_and_tells_the_phone(bridge, django_capture_on_commit_callbacks):
    question, _ = ask(bridge)
    with django_capture_on_commit_callbacks() as callbacks:
        assert call(bridge, "mobile.session_end", {"session_id": "sess-1", "reason": "other"}) == {"result": {}}
    assert Question.objects.get(pk=question.pk).state == "cancelled"
    assert AgentSession.objects.get(device=bridge, session_id="sess-1").state == "ended"
    assert len(callbacks) >= 2


def test_phone_message_is_queued_for_the_bridge_and_consumed_once(phone, bridge):
    ask(bridge)
    response = phone.post("/api/mobile/sessions/sess-1/messages", {"text": "Also update the changelog."},
                          content_type="application/json")
    assert response.status_code == 201, response.json()
    message_id = response.json()["message_id"]
    [item] = outbox(bridge, "mobile.message")
    assert item.payload == {"message_id": message_id, "session_id": "sess-1", "text": "Also update the changelog.",
                            "author": "user"}
    assert phone.get("/api/mobile/state").json()["queue_depth"] == 2  # the question + the message
    assert call(bridge, "mobile.message_consumed", {"message_ids": [message_id]}) == {"result": {}}
    assert PhoneMessage.objects.get(pk=message_id).state == "consumed"
    assert phone.get("/api/mobile/state").json()["queue_depth"] == 1


def test_phone_message_to_someone_elses_or_an_ended_session(phone, bridge, other_user):
    enable_mobile(other_user)
    theirs = bridge_for(other_user, "theirs")
    ask(theirs, session_id="their-session")
    assert phone.post("/api/mobile/sessions/their-session/messages", {"text": "hi"},
                      content_type="application/json").status_code == 404
    ask(bridge)
    services.session_end(device=bridge, session_id="sess-1")
    ended = phone.post("/api/mobile/sessions/sess-1/messages", {"text": "hi"}, content_type="application/json")
    assert ended.status_code == 410 and ended.json()["error"] == "session_ended"


def test_keep_going_goes_to_the_bridge(phone, bridge):
    ask(bridge)
    response = phone.post("/api/mobile/sessions/sess-1/keep_going", {"enabled": True}, content_type="application/json")
    assert response.status_code == 200 and response.json() == {"session_id": "sess-1", "keep_going": True}
    [item] = outbox(bridge, "mobile.keep_going")
    assert item.payload == {"session_id": "sess-1", "enabled": True}
    assert AgentSession.objects.get(session_id="sess-1").keep_going is True


def test_state_lists_bridges_and_sessions(phone, bridge):
    ask(bridge)
    body = phone.get("/api/mobile/state").json()
    assert body["mobile_reply"] is True and body["global_stop"] is False
    assert body["bridges"] == [{"device_id": str(bridge.pk), "name": "laptop", "online": False, "last_seen_at": None}]
    assert body["queue_depth"] == 1
    assert [s["session_id"] for s in body["sessions"]] == ["sess-1"]


def test_switch_off_hides_everything_and_tells_the_bridge(phone, bridge, mobile_user,
                                                          django_capture_on_commit_callbacks):
    question, nonce = ask(bridge)
    with django_capture_on_commit_callbacks(execute=True):
        user_switch_set(actor=mobile_user, user=mobile_user, switch="mobile_reply", enabled=False)
    for url in ["/m/", "/api/mobile/pending", "/api/mobile/state"]:
        assert phone.get(url).status_code == 404, url
    for url, body in [("/api/mobile/answer", {"question_id": str(question.pk), "nonce": nonce,
                                              "answers": {"Which framework?": ["Vue"]}}),
                      ("/api/mobile/sessions/sess-1/messages", {"text": "hi"}),
                      ("/api/mobile/sessions/sess-1/keep_going", {"enabled": True})]:
        assert phone.post(url, body, content_type="application/json").status_code == 404, url
    assert [item.payload for item in outbox(bridge, "mobile.switch")] == [{"enabled": False}]
    assert Question.objects.get(pk=question.pk).state == "moved_to_desktop"
    with django_capture_on_commit_callbacks(execute=True):
        user_switch_set(actor=mobile_user, user=mobile_user, switch="mobile_reply", enabled=True)
    assert [item.payload for item in outbox(bridge, "mobile.switch")] == [{"enabled": False}, {"enabled": True}]
    assert phone.get("/m/").status_code == 200


@override_settings(MOBILE_REPLY_ENABLED=False)
def test_global_stop_hides_the_page_and_api(phone, bridge):
    assert phone.get("/m/").status_code == 404
    assert phone.get("/api/mobile/pending").status_code == 404


def test_a_connecting_bridge_hears_the_switch(bridge, mobile_user):
    device_connected.send(sender=type(bridge), device=bridge, hello={})
    assert [item.payload for item in outbox(bridge, "mobile.switch")] == [{"enabled": True}]


def test_anonymous_gets_no_phone_page(client):
    response = client.get("/m/")
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]
    assert client.get("/api/mobile/pending").status_code in (401, 403)


def test_phone_page_renders_for_a_user_with_mobile_reply(phone):
    response = phone.get("/m/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "mobile.js" in html and 'data-testid="sessions"' in html


def test_a_reconnecting_bridge_is_not_told_twice(bridge, mobile_user):
    for _ in range(3):
        device_connected.send(sender=type(bridge), device=bridge, hello={})
    assert [item.payload for item in outbox(bridge, "mobile.switch")] == [{"enabled": True}]
    mobile_user.mobile_reply_enabled = False
    mobile_user.save()
    bridge.owner.refresh_from_db()
    device_connected.send(sender=type(bridge), device=bridge, hello={})
    assert [item.payload for item in outbox(bridge, "mobile.switch")] == [{"enabled": True}, {"enabled": False}]


def test_a_reconnect_that_changes_nothing_is_one_read(bridge, mobile_user, django_assert_num_queries):
    device_connected.send(sender=type(bridge), device=bridge, hello={})
    # The bridge holds the switch and nothing waits for it: one statement, however long its outbox.
    with django_assert_num_queries(1):
        device_connected.send(sender=type(bridge), device=bridge, hello={})
    assert [item.payload for item in outbox(bridge, "mobile.switch")] == [{"enabled": True}]


def test_an_unverified_two_factor_session_is_sent_to_verify(phone, bridge, mobile_user):
    from django_otp.plugins.otp_totp.models import TOTPDevice

    question, _ = ask(bridge)
    TOTPDevice.objects.create(user=mobile_user, name="phone", confirmed=True)
    page = phone.get("/m/")
    assert page.status_code == 302 and "/accounts/login/" in page["Location"]
    response = phone.get("/api/mobile/pending")
    assert response.status_code == 403 and response.json()["error"] == "otp_required"
    rooms = phone.get(f"/api/im/rooms/{question.room_id}/messages")
    assert rooms.status_code == 403 and rooms.json()["error"] == "otp_required"


def test_deleting_a_user_takes_their_sessions_rooms_and_questions(bridge, mobile_user):
    ask(bridge)
    mobile_user.delete()
    assert Question.objects.count() == 0 and AgentSession.objects.count() == 0 and Room.objects.count() == 0


def test_hook_events_show_in_the_sessions_room(bridge):
    call(bridge, "mobile.session_start", {"session_id": "s1"})
    assert call(bridge, "mobile.hook_event", {"session_id": "s1", "event": "PostToolUse", "tool_use_id": "t1"})[
        "result"] == {"recorded": True}
    assert call(bridge, "mobile.hook_event", {"session_id": "s1", "event": "Stop"})["result"] == {"recorded": True}
    room = AgentSession.objects.get(device=bridge, session_id="s1").room
    events = [m.body["event"] for m in room.messages.filter(kind="event").order_by("seq")]
    assert events[-2:] == ["PostToolUse", "Stop"]
    refused = call(bridge, "mobile.hook_event", {"session_id": "s1", "event": "rm -rf"})
    assert refused["error"]["code"] == protocol.INVALID_PARAMS
    assert call(bridge, "mobile.hook_event", {"session_id": "unknown", "event": "Stop"})["result"] == {
        "recorded": False}
