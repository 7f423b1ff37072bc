"""Answering a question: the nonce, the single winner, named refusals, validation, side effects."""

from datetime import timedelta

import pytest
from django.utils import timezone

from ai1net import sql
from ai1net.accounts.models import AuditEntry
from im.models import Message, Panel
from mobile import services
from mobile.models import Answer, Question
from tests.mobile.factories import TWO_QUESTIONS, ask, bridge_for, enable_mobile, outbox

pytestmark = pytest.mark.django_db


def answer(phone, question, nonce, answers=None, other=None):
    body = {"question_id": str(question.pk), "nonce": nonce, "answers": answers or {"Which framework?": ["Vue"]}}
    if other is not None:
        body["other"] = other
    return phone.post("/api/mobile/answer", body, content_type="application/json")


def test_pending_lists_the_question_with_a_nonce_that_answers_it(phone, bridge):
    question, nonce = ask(bridge)
    body = phone.get("/api/mobile/pending").json()
    assert [q["question_id"] for q in body["questions"]] == [str(question.pk)]
    entry = body["questions"][0]
    assert entry["nonce"] == nonce and len(nonce) >= 22  # 128 bits, base64url
    assert entry["session_id"] == "sess-1" and entry["device_id"] == str(bridge.pk)
    assert entry["room_id"] == str(question.room_id)
    assert entry["questions"][0]["question"] == "Which framework?"
    assert {"created_at", "expires_at"} <= entry.keys()
    # Only a hash is stored, never the nonce itself.
    stored = Question.objects.values().get(pk=question.pk)
    assert nonce not in str(stored)

    response = answer(phone, question, entry["nonce"])
    assert response.status_code == 200, response.json()
    assert response.json() == {"state": "answered"}
    assert phone.get("/api/mobile/pending").json()["questions"] == []


def test_answer_writes_the_answer_the_outbox_item_the_room_message_and_the_audit(phone, bridge, mobile_user,
                                                                                 django_capture_on_commit_callbacks):
    question, nonce = ask(bridge, questions=TWO_QUESTIONS)
    with django_capture_on_commit_callbacks() as callbacks:
        response = answer(phone, question, nonce,
                          answers={"Which framework?": ["React"], "Which checks should run?": ["Lint", "Tests"]},
                          other={"Which framework?": "with TypeScript"})
    assert response.status_code == 200, response.json()
    assert callbacks, "events leave after commit"
    saved = Answer.objects.get(question=question)
    assert saved.actor == mobile_user and saved.via == "phone"
    assert saved.answers == {"Which framework?": ["React"], "Which checks should run?": ["Lint", "Tests"]}
    assert saved.other == {"Which framework?": "with TypeScript"}
    [item] = outbox(bridge, "mobile.answer")
    assert item.payload["question_id"] == str(question.pk)
    assert item.payload["answers"] == saved.answers and item.payload["other"] == saved.other
    assert "answered_at" in item.payload
    assert Message.objects.filter(room=question.room, kind="answer").count() == 1
    assert Panel.objects.get(pk=question.panel_id).state == "answered"
    assert AuditEntry.objects.filter(action="mobile.answer", actor=mobile_user).count() == 1


def test_replay_is_409_already_answered_and_audited(phone, bridge, mobile_user):
    question, nonce = ask(bridge)
    assert answer(phone, question, nonce).status_code == 200
    again = answer(phone, question, nonce)
    assert again.status_code == 409
    assert again.json()["error"] == "already_answered"
    assert len(outbox(bridge, "mobile.answer")) == 1
    assert AuditEntry.objects.filter(action="mobile.answer_refused", actor=mobile_user).count() == 1


def test_wrong_nonce_is_403_bad_nonce(phone, bridge):
    question, _nonce = ask(bridge)
    response = answer(phone, question, "A" * 22)
    assert response.status_code == 403 and response.json()["error"] == "bad_nonce"
    assert Question.objects.get(pk=question.pk).state == "pending"


def test_expired_is_410(phone, bridge):
    question, nonce = ask(bridge)
    Question.objects.filter(pk=question.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    response = answer(phone, question, nonce)
    assert response.status_code == 410 and response.json()["error"] == "expired"
    assert Question.objects.get(pk=question.pk).state == "expired"
    assert outbox(bridge, "mobile.answer") == []
    assert [i.payload for i in outbox(bridge, "mobile.question_closed")] == [
        {"question_id": str(question.pk), "state": "expired"}]


def test_expired_questions_leave_pending_lazily(phone, bridge):
    question, _ = ask(bridge)
    Question.objects.filter(pk=question.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    body = phone.get("/api/mobile/pending?recent=1").json()
    assert body["questions"] == []
    assert [(q["question_id"], q["state"]) for q in body["recent"]] == [(str(question.pk), "expired")]
    assert "nonce" not in body["recent"][0]


def test_another_users_question_is_404(client, bridge, other_user):
    question, nonce = ask(bridge)
    enable_mobile(other_user)
    client.force_login(other_user)
    response = answer(client, question, nonce)
    assert response.status_code == 404
    assert client.get("/api/mobile/pending").json()["questions"] == []
    assert Question.objects.get(pk=question.pk).state == "pending"


def test_unknown_question_is_404(phone, bridge):
    question, nonce = ask(bridge)
    response = phone.post("/api/mobile/answer", {"question_id": "not-a-uuid", "nonce": nonce, "answers": {}},
                          content_type="application/json")
    assert response.status_code == 404


def test_desktop_answer_first_then_phone_gets_answered_on_desktop(phone, bridge):
    question, nonce = ask(bridge)
    result = services.desktop_answer_record(device=bridge, session_id="sess-1", tool_use_id="toolu_01",
                                            answers={"Which framework?": "React"})
    assert result == {"state": "answered_on_desktop"}
    assert Answer.objects.get(question=question).via == "desktop"
    response = answer(phone, question, nonce)
    assert response.status_code == 409 and response.json()["error"] == "answered_on_desktop"
    # ...and the phone answer, had it come first, would have won over the desk:
    q2, n2 = ask(bridge, tool_use_id="toolu_02")
    assert answer(phone, q2, n2).status_code == 200
    assert services.desktop_answer_record(device=bridge, session_id="sess-1", question_id=str(q2.pk),
                                          answers={"Which framework?": "React"}) == {"state": "answered"}
    assert Answer.objects.get(question=q2).answers == {"Which framework?": ["Vue"]}


def test_moved_to_desktop_is_409(phone, bridge):
    question, nonce = ask(bridge)
    assert services.question_move(device=bridge, question_id=str(question.pk), reason="timeout") == {
        "state": "moved_to_desktop"}
    response = answer(phone, question, nonce)
    assert response.status_code == 409 and response.json()["error"] == "moved_to_desktop"


def test_session_ended_is_410_session_ended(phone, bridge):
    question, nonce = ask(bridge)
    services.session_end(device=bridge, session_id="sess-1", reason="prompt_input_exit")
    assert Question.objects.get(pk=question.pk).state == "cancelled"
    assert [i.payload for i in outbox(bridge, "mobile.question_closed")] == [
        {"question_id": str(question.pk), "state": "cancelled"}]
    response = answer(phone, question, nonce)
    assert response.status_code == 410 and response.json()["error"] == "session_ended"
    assert question.room.__class__.objects.get(pk=question.room_id).state == "closed"


@pytest.mark.parametrize(
    ("answers", "other", "code"),
    [
        ({"Which framework?": ["Svelte"]}, None, "unknown_label"),
        ({"Which framework?": ["React", "Vue"]}, None, "single_select"),
        ({"Which colour?": ["Red"]}, None, "unknown_question"),
        ({}, None, "unanswered"),
        ({}, {"Which framework?": "   "}, "unanswered"),
    ],
)
def test_answers_are_checked_against_the_question(phone, bridge, answers, other, code):
    question, nonce = ask(bridge)
    body = {"question_id": str(question.pk), "nonce": nonce, "answers": answers}
    if other is not None:
        body["other"] = other
    response = phone.post("/api/mobile/answer", body, content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"] == code
    assert Question.objects.get(pk=question.pk).state == "pending"


def test_unknown_label_is_named(phone, bridge):
    question, nonce = ask(bridge)
    response = answer(phone, question, nonce, answers={"Which framework?": ["Svelte"]})
    assert "Svelte" in response.json()["detail"]


def test_free_text_alone_answers_a_question(phone, bridge):
    question, nonce = ask(bridge)
    response = answer(phone, question, nonce, answers={}, other={"Which framework?": "Neither; plain HTML"})
    assert response.status_code == 200
    assert outbox(bridge, "mobile.answer")[0].payload["other"] == {"Which framework?": "Neither; plain HTML"}


def test_panel_action_is_the_same_code_path(phone, bridge):
    question, nonce = ask(bridge)
    url = f"/api/im/rooms/{question.room_id}/panels/{question.panel_id}/actions"
    response = phone.post(url, {"action": "answer", "data": {"nonce": nonce, "answers": {"Which framework?": "React"}}},
                          content_type="application/json")
    assert response.status_code == 200, response.json()
    assert response.json() == {"state": "answered"}
    assert outbox(bridge, "mobile.answer")[0].payload["answers"] == {"Which framework?": ["React"]}
    again = phone.post(url, {"action": "answer", "data": {"nonce": nonce, "answers": {"Which framework?": "React"}}},
                       content_type="application/json")
    assert again.status_code == 409 and again.json()["error"] == "already_answered"
    assert "nonce" not in str(question.panel.actions.values_list("data", flat=True))


def test_answer_needs_csrf_from_a_browser(client, bridge, mobile_user):
    from django.test import Client

    question, nonce = ask(bridge)
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(mobile_user)
    response = answer(browser, question, nonce)
    assert response.status_code == 403
    assert Question.objects.get(pk=question.pk).state == "pending"


def test_api_tokens_cannot_answer(client, bridge, mobile_user):
    from ai1net.accounts.services import api_token_create

    question, nonce = ask(bridge)
    _token, raw = api_token_create(user=mobile_user, name="agent")
    response = client.post("/api/mobile/answer", {"question_id": str(question.pk), "nonce": nonce,
                                                  "answers": {"Which framework?": ["Vue"]}},
                           content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert response.status_code in (401, 403)
    assert Question.objects.get(pk=question.pk).state == "pending"


def test_two_bridges_two_users_stay_apart(client, bridge, other_user):
    enable_mobile(other_user)
    theirs = bridge_for(other_user, "desk")
    ask(theirs, session_id="theirs")
    mine, _ = ask(bridge)
    client.force_login(bridge.owner)
    assert [q["question_id"] for q in client.get("/api/mobile/pending").json()["questions"]] == [str(mine.pk)]


@pytest.mark.django_db
def test_own_question_reads_the_question_its_session_and_device_in_one_statement(bridge, mobile_user, other_user,
                                                                                  django_assert_num_queries):
    """The answer POST's read, written out: the same objects select_related would give, owner-scoped."""
    from mobile import selectors

    question, _nonce = ask(bridge)
    with django_assert_num_queries(1):
        own = selectors.own_question(user=mobile_user, question_id=question.pk)
        assert own.session.session_id == "sess-1" and own.device.pk == bridge.pk
    reference = Question.objects.select_related("session", "device").get(pk=question.pk)
    for field in Question._meta.concrete_fields:
        assert getattr(own, field.attname) == getattr(reference, field.attname), field.name
    assert own.questions == reference.questions and own.expires_at == reference.expires_at
    assert own.device.owner_id == mobile_user.pk and own.device.name == reference.device.name
    assert selectors.own_question(user=other_user, question_id=question.pk) is None


@pytest.mark.django_db
def test_user_needs_otp_in_one_statement(mobile_user, django_assert_num_queries):
    from django_otp.plugins.otp_totp.models import TOTPDevice

    from ai1net.accounts.models import BackupCode, BackupCodeDevice
    from ai1net.accounts.selectors import user_needs_otp

    with django_assert_num_queries(1):
        assert user_needs_otp(mobile_user) is False
    totp = TOTPDevice.objects.create(user=mobile_user, name="phone", confirmed=False)
    assert user_needs_otp(mobile_user) is False  # an enrolment not confirmed yet
    codes = BackupCodeDevice.objects.create(user=mobile_user, name="Backup codes", confirmed=True)
    assert user_needs_otp(mobile_user) is False  # a backup-code device with no codes left
    BackupCode.objects.create(device=codes, code_hash="x" * 64)
    assert user_needs_otp(mobile_user) is True
    BackupCode.objects.all().delete()
    TOTPDevice.objects.filter(pk=totp.pk).update(confirmed=True)
    assert user_needs_otp(mobile_user) is True


@pytest.mark.django_db
def test_the_sessions_user_comes_with_whether_they_need_otp(mobile_user, django_assert_num_queries, rf):
    """``User.objects.get(pk=...)`` (the session's user) answers user_needs_otp in the same statement, and an
    HTTP request's check at its start uses that answer instead of a statement of its own."""
    from django_otp.plugins.otp_totp.models import TOTPDevice

    from ai1net.accounts.models import BackupCode, BackupCodeDevice, User
    from im.access import http_otp_satisfied

    def loaded() -> User:
        with django_assert_num_queries(1):
            return User.objects.get(pk=mobile_user.pk)

    request = rf.get("/")
    request.user = loaded()
    assert request.user.needs_otp_at_load is False and request.user.username == mobile_user.username
    with django_assert_num_queries(0):
        assert http_otp_satisfied(request) is True
    codes = BackupCodeDevice.objects.create(user=mobile_user, name="Backup codes", confirmed=True)
    BackupCode.objects.create(device=codes, code_hash="x" * 64)
    assert loaded().needs_otp_at_load is True
    BackupCode.objects.all().delete()
    TOTPDevice.objects.create(user=mobile_user, name="phone", confirmed=True)
    request.user = loaded()
    assert request.user.needs_otp_at_load is True
    request.user.is_verified = lambda: False
    with django_assert_num_queries(0):
        assert http_otp_satisfied(request) is False
    # Read any other way, the user carries no answer and the check asks the database.
    request.user = User.objects.filter(pk=mobile_user.pk).first()
    request.user.is_verified = lambda: False
    assert request.user.needs_otp_at_load is None
    with django_assert_num_queries(1):
        assert http_otp_satisfied(request) is False


@pytest.mark.django_db
def test_one_by_reads_what_the_orm_reads(bridge, django_assert_num_queries):
    from mobile.models import AgentSession

    question, _nonce = ask(bridge)
    with django_assert_num_queries(2):
        session = sql.one_by(AgentSession, device=bridge, session_id="sess-1")
        again = sql.one_by(Question, id=question.pk)
    reference = AgentSession.objects.get(device=bridge, session_id="sess-1")
    assert [getattr(session, f.attname) for f in AgentSession._meta.concrete_fields] == [
        getattr(reference, f.attname) for f in AgentSession._meta.concrete_fields]
    assert again.questions == question.questions and again.expires_at == question.expires_at
    assert sql.one_by(AgentSession, device=bridge, session_id="nope") is None


@pytest.mark.django_db
def test_an_answer_is_one_transaction_without_savepoints_of_its_own(bridge, mobile_user, django_assert_max_num_queries):
    """Every SAVEPOINT is two more round trips to PostgreSQL on the phone's wait: the answer's nested writes
    (outbox, room message, audit) join its transaction instead."""
    question, nonce = ask(bridge)
    with django_assert_max_num_queries(20) as captured:
        services.answer_submit(actor=mobile_user, question_id=question.pk, nonce=nonce,
                               answers={question.questions[0]["question"]: question.questions[0]["options"][0]["label"]})
    savepoints = [q["sql"] for q in captured.captured_queries if q["sql"].lstrip().upper().startswith("SAVEPOINT")]
    # Under pytest-django the test's own transaction makes the answer's atomic block one savepoint.
    assert len(savepoints) == 1, savepoints
