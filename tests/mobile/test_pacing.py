"""Limits on phone -> agent messages: no self-excitation, a daily budget, a quiet period after each
injection, a rate-limited waiting line (in order, and the phone sees its place)."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from ai1net.accounts.services import api_token_create
from devices.rpc import dispatch
from mobile import pacing, services
from mobile.models import AgentSession, PhoneMessage
from tests.mobile.factories import ask, outbox

pytestmark = pytest.mark.django_db


@pytest.fixture
def limits(settings):
    settings.MOBILE_MESSAGE_DAILY_BUDGET = 100
    settings.MOBILE_MESSAGE_QUIET_SEC = 0
    settings.MOBILE_MESSAGE_RATE = 100
    settings.MOBILE_MESSAGE_RATE_WINDOW_SEC = 60
    settings.MOBILE_MESSAGE_QUEUE_MAX = 20
    return settings


def send(phone, text, session_id="sess-1"):
    return phone.post(f"/api/mobile/sessions/{session_id}/messages", {"text": text}, content_type="application/json")


def consume(bridge, *message_ids):
    return dispatch(bridge, str(uuid.uuid4()), "mobile.message_consumed", {"message_ids": list(message_ids)})


def texts(bridge) -> list[str]:
    return [item.payload["text"] for item in outbox(bridge, "mobile.message")]


def test_the_agents_own_words_never_come_back(phone, bridge, limits, user):
    ask(bridge)  # the agent asked "Which framework?" in the session's room
    echo = send(phone, "  which   FRAMEWORK? ")
    assert (echo.status_code, echo.json()["error"]) == (400, "agent_echo")
    assert not PhoneMessage.objects.exists() and texts(bridge) == []
    # Only a person's phone session writes messages: an API token (an agent) cannot.
    _token, raw = api_token_create(user=user, name="agent")
    phone.logout()
    by_token = phone.post("/api/mobile/sessions/sess-1/messages", {"text": "go"},
                          content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert by_token.status_code in (401, 403, 404)
    assert not PhoneMessage.objects.exists()
    phone.force_login(user)
    ok = send(phone, "Use React.")
    assert ok.status_code == 201
    [item] = outbox(bridge, "mobile.message")
    assert item.payload["author"] == "user"  # the bridge injects nothing else


def test_a_daily_budget_per_session(phone, bridge, limits):
    limits.MOBILE_MESSAGE_DAILY_BUDGET = 2
    ask(bridge)
    assert send(phone, "one").status_code == 201
    assert send(phone, "two").status_code == 201
    third = send(phone, "three")
    assert (third.status_code, third.json()["error"]) == (429, "message_budget")
    assert "at most 2 messages a day" in third.json()["detail"]
    assert PhoneMessage.objects.count() == 2 and texts(bridge) == ["one", "two"]
    # Yesterday's do not count; another session has its own budget.
    PhoneMessage.objects.update(created_at=timezone.now() - timedelta(days=1, hours=1))
    assert send(phone, "three").status_code == 201
    ask(bridge, session_id="sess-2")
    assert send(phone, "elsewhere", session_id="sess-2").status_code == 201


def test_a_quiet_period_after_each_injection(phone, bridge, limits):
    limits.MOBILE_MESSAGE_QUIET_SEC = 30
    ask(bridge)
    first = send(phone, "first").json()
    assert first["state"] == "queued" and "position" not in first
    assert consume(bridge, first["message_id"]) == {"result": {}}
    injected_at = PhoneMessage.objects.get(pk=first["message_id"]).consumed_at
    second = send(phone, "second").json()
    assert second["state"] == "waiting" and second["position"] == 1
    assert second["release_at"] == (injected_at + timedelta(seconds=30)).isoformat()
    assert texts(bridge) == ["first"]
    session = AgentSession.objects.get(session_id="sess-1")
    assert pacing.messages_release(session=session) == []  # still quiet
    PhoneMessage.objects.filter(pk=first["message_id"]).update(consumed_at=injected_at - timedelta(seconds=31))
    assert phone.get("/api/mobile/state").status_code == 200  # a phone read releases what is due
    assert texts(bridge) == ["first", "second"]
    assert PhoneMessage.objects.get(pk=second["message_id"]).state == "queued"


def test_a_rate_limited_waiting_line_keeps_order_and_shows_the_place(phone, bridge, limits):
    limits.MOBILE_MESSAGE_RATE = 2
    limits.MOBILE_MESSAGE_QUEUE_MAX = 3
    ask(bridge)
    replies = [send(phone, f"m{n}").json() for n in range(1, 6)]
    assert [r["state"] for r in replies] == ["queued", "queued", "waiting", "waiting", "waiting"]
    assert [r.get("position") for r in replies] == [None, None, 1, 2, 3]
    full = send(phone, "m6")
    assert (full.status_code, full.json()["error"]) == (429, "message_queue_full")
    assert texts(bridge) == ["m1", "m2"]
    [session] = phone.get("/api/mobile/state").json()["sessions"]
    assert [(w["text"], w["position"]) for w in session["waiting_messages"]] == [("m3", 1), ("m4", 2), ("m5", 3)]
    # The window moves on: the next two go, in order; the last still waits, now first in line.
    PhoneMessage.objects.filter(released_at__isnull=False).update(released_at=timezone.now() - timedelta(seconds=61))
    services.messages_release_due(user=bridge.owner)
    assert texts(bridge) == ["m1", "m2", "m3", "m4"]
    [session] = phone.get("/api/mobile/state").json()["sessions"]
    assert [(w["text"], w["position"]) for w in session["waiting_messages"]] == [("m5", 1)]


def test_waiting_messages_go_when_the_bridge_connects_and_not_after_the_session_ended(phone, bridge, limits):
    from devices.signals import device_connected

    limits.MOBILE_MESSAGE_RATE = 1
    ask(bridge)
    send(phone, "a")
    send(phone, "b")
    PhoneMessage.objects.filter(released_at__isnull=False).update(released_at=timezone.now() - timedelta(seconds=61))
    device_connected.send(sender=type(bridge), device=bridge, hello={})
    assert texts(bridge) == ["a", "b"]
    send(phone, "c")
    services.session_end(device=bridge, session_id="sess-1")
    PhoneMessage.objects.filter(released_at__isnull=False).update(released_at=timezone.now() - timedelta(seconds=61))
    services.messages_release_due(user=bridge.owner)
    assert texts(bridge) == ["a", "b"]
