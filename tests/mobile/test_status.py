"""The status card on the home page and the same figures in GET /api/mobile/state."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from mobile import services
from mobile.models import Question
from tests.mobile.factories import ONE_QUESTION, ask

pytestmark = pytest.mark.django_db


def _settle(bridge, phone) -> None:
    q1, nonce = ask(bridge)
    phone.post("/api/mobile/answer", {"question_id": str(q1.pk), "nonce": nonce,
                                      "answers": {"Which framework?": ["Vue"]}}, content_type="application/json")
    q2, _ = ask(bridge, tool_use_id="t2")
    services.desktop_answer_record(device=bridge, session_id="sess-1", question_id=str(q2.pk),
                                   answers={"Which framework?": "React"})
    q3, _ = ask(bridge, tool_use_id="t3")
    services.question_move(device=bridge, question_id=str(q3.pk), reason="timeout")
    q4, _ = ask(bridge, tool_use_id="t4", window_sec=1)
    Question.objects.filter(pk=q4.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    ask(bridge, tool_use_id="t5")  # still waiting
    # Yesterday's question counts for nothing today.
    old, _ = ask(bridge, tool_use_id="t6", questions=ONE_QUESTION)
    Question.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=2),
                                              expires_at=timezone.now() - timedelta(days=2))


def test_state_has_todays_counts(phone, bridge):
    _settle(bridge, phone)
    state = phone.get("/api/mobile/state").json()
    assert state["today"] == {"asked": 5, "answered_on_phone": 1, "answered_on_desktop": 1,
                              "moved_to_desktop": 1, "expired": 1}
    assert [(b["name"], b["online"]) for b in state["bridges"]] == [("laptop", False)]


def test_home_shows_one_card_with_switch_bridges_and_counts(phone, bridge):
    _settle(bridge, phone)
    page = phone.get("/").content.decode()
    assert page.count('data-testid="mobile-status-card"') == 1
    assert re.search(r'data-testid="mobile-switch">on<', page)
    assert re.search(r"laptop\s*<span class=\"badge offline\">offline</span>", page)
    counts = dict(re.findall(r'data-count="(\w+)">(\d+) ', page))
    assert counts == {"asked": "5", "answered_on_phone": "1", "answered_on_desktop": "1",
                      "moved_to_desktop": "1", "expired": "1"}


def test_home_card_when_mobile_reply_is_off(client, user):
    client.force_login(user)
    page = client.get("/").content.decode()
    assert re.search(r'data-testid="mobile-switch">off<', page)
    assert "No bridge paired yet." in page
