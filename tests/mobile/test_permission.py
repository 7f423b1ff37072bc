"""Tool-permission requests on the platform: hash binding both ways, single use, expiry, 404 for another
user's request, CSRF, the rendering the phone gets, and the audit rows."""

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from ai1net.accounts.models import AuditEntry
from clients import permission
from devices.rpc import dispatch
from mobile import services
from mobile.models import Question
from tests.mobile.factories import enable_mobile, outbox

pytestmark = pytest.mark.django_db

BASH = {"command": "rm -rf build && make", "description": "rebuild"}
ALLOW = {permission.question_text("Bash"): [permission.ALLOW]}


def request(device, tool_name="Bash", tool_input=None, input_hash=None, window_sec=300):
    tool_input = BASH if tool_input is None else tool_input
    services.session_start(device=device, session_id="sess-1", cwd="/home/alice/project")
    qid = str(uuid.uuid4())
    response = dispatch(device, str(uuid.uuid4()), "mobile.permission", {
        "question_id": qid, "session_id": "sess-1", "tool_use_id": "toolu_9", "tool_name": tool_name,
        "tool_input": tool_input, "input_hash": input_hash or permission.input_hash(tool_input),
        "window_sec": window_sec})
    return qid, response


def decide(phone, entry, answers=None, input_hash=None, other=None):
    body = {"question_id": entry["question_id"], "nonce": entry["nonce"], "answers": answers or ALLOW,
            "input_hash": entry["input_hash"] if input_hash is None else input_hash}
    if other is not None:
        body["other"] = other
    return phone.post("/api/mobile/answer", body, content_type="application/json")


def only_pending(phone):
    [entry] = phone.get("/api/mobile/pending").json()["questions"]
    return entry


def test_the_phone_sees_the_tool_the_command_and_three_options(phone, bridge):
    qid, response = request(bridge)
    assert response["result"]["state"] == "pending", response
    entry = only_pending(phone)
    assert entry["question_id"] == qid and entry["kind"] == "permission" and entry["tool_name"] == "Bash"
    assert entry["input_hash"] == permission.input_hash(BASH)
    assert entry["rendering"] == {"kind": "command", "text": "# rebuild\nrm -rf build && make", "truncated": False}
    assert [o["label"] for o in entry["questions"][0]["options"]] == list(permission.OPTIONS)


def test_edit_is_rendered_as_a_unified_diff_as_plain_text(phone, bridge):
    edit = {"file_path": "/p/a.html", "old_string": "<b>old</b>\n", "new_string": "<script>x()</script>\n"}
    request(bridge, tool_name="Edit", tool_input=edit)
    rendering = only_pending(phone)["rendering"]
    assert rendering["kind"] == "diff"
    assert rendering["text"].splitlines() == ["--- a//p/a.html", "+++ b//p/a.html", "@@ -1 +1 @@", "-<b>old</b>",
                                              "+<script>x()</script>"]


def test_a_hash_that_is_not_the_inputs_is_refused_by_the_platform(bridge):
    _qid, response = request(bridge, input_hash="0" * 64)
    assert response["error"]["data"]["code"] == "input_mismatch"
    assert not Question.objects.exists()


def test_oversize_input_is_refused_and_the_rendering_is_cut(bridge, phone):
    huge = {"command": "x" * (permission.limits.LIMITS["permission.tool_input"].max + 1)}
    _qid, response = request(bridge, tool_input=huge)
    assert response["error"]["data"]["code"] in ("too_large", "payload_too_large"), response
    long = {"command": "y" * 30_000}
    request(bridge, tool_input=long)
    rendering = only_pending(phone)["rendering"]
    assert rendering["truncated"] is True and len(rendering["text"]) == 20_000


def test_allow_burns_once_and_carries_the_hash_and_decision_to_the_bridge(phone, bridge, mobile_user):
    request(bridge)
    entry = only_pending(phone)
    response = decide(phone, entry)
    assert (response.status_code, response.json()) == (200, {"state": "answered"})
    [item] = outbox(bridge, "mobile.answer")
    assert item.payload["input_hash"] == permission.input_hash(BASH) and item.payload["decision"] == "allow"
    again = decide(phone, entry, answers={permission.question_text("Bash"): [permission.DENY]})
    assert (again.status_code, again.json()["error"]) == (409, "already_answered")
    assert len(outbox(bridge, "mobile.answer")) == 1
    [audit] = AuditEntry.objects.filter(action="mobile.answer", actor=mobile_user)
    assert audit.data["decision"] == "allow" and audit.data["input_hash"] == entry["input_hash"]
    assert AuditEntry.objects.filter(action="mobile.answer_refused", actor=mobile_user).count() == 1


def test_deny_with_a_reason_and_allow_for_the_session(phone, bridge):
    request(bridge)
    entry = only_pending(phone)
    text = permission.question_text("Bash")
    assert decide(phone, entry, answers={text: [permission.DENY]}, other={text: "not on main"}).status_code == 200
    [item] = outbox(bridge, "mobile.answer")
    assert item.payload["decision"] == "deny" and item.payload["other"] == {text: "not on main"}
    assert permission.deny_reason("Bash", item.payload["other"]).endswith("not on main")
    request(bridge)
    entry = only_pending(phone)
    assert decide(phone, entry, answers={text: [permission.ALLOW_SESSION]}).status_code == 200
    assert outbox(bridge, "mobile.answer")[-1].payload["decision"] == "allow_session"


def test_a_decision_for_another_input_is_refused_and_audited(phone, bridge, mobile_user):
    request(bridge)
    entry = only_pending(phone)
    response = decide(phone, entry, input_hash=permission.input_hash({"command": "true"}))
    assert (response.status_code, response.json()["error"]) == (409, "input_mismatch")
    missing = decide(phone, entry, input_hash="")
    assert missing.status_code == 409
    assert Question.objects.get(pk=entry["question_id"]).state == "pending"
    assert outbox(bridge, "mobile.answer") == []
    refused = AuditEntry.objects.filter(action="mobile.answer_refused", actor=mobile_user)
    assert [a.data["reason"] for a in refused] == ["input_mismatch", "input_mismatch"]
    assert decide(phone, entry).status_code == 200  # the nonce was not burned by the refusals


def test_no_option_or_free_text_alone_is_no_decision(phone, bridge):
    request(bridge)
    entry = only_pending(phone)
    text = permission.question_text("Bash")
    response = decide(phone, entry, answers={text: []}, other={text: "hmm"})
    assert (response.status_code, response.json()["error"]) == (400, "decision_required")


def test_expired_is_410_and_another_users_is_404(phone, bridge, client, other_user):
    qid, _ = request(bridge)
    entry = only_pending(phone)
    enable_mobile(other_user)
    from django.test import Client

    mallory = Client()
    mallory.force_login(other_user)
    assert decide(mallory, entry).status_code == 404
    Question.objects.filter(pk=qid).update(expires_at=timezone.now() - timedelta(seconds=1))
    late = decide(phone, entry)
    assert (late.status_code, late.json()["error"]) == (410, "expired")
    assert outbox(bridge, "mobile.answer") == []


def test_a_decision_needs_csrf_from_a_browser(bridge, mobile_user, phone):
    from django.test import Client

    request(bridge)
    entry = only_pending(phone)
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(mobile_user)
    assert decide(browser, entry).status_code == 403
    assert Question.objects.get(pk=entry["question_id"]).state == "pending"


def test_the_bridge_moving_it_tells_a_late_phone_plainly(phone, bridge):
    qid, _ = request(bridge)
    entry = only_pending(phone)
    dispatch(bridge, str(uuid.uuid4()), "mobile.question_moved", {"question_id": qid, "reason": "timeout"})
    late = decide(phone, entry)
    assert (late.status_code, late.json()["error"]) == (409, "moved_to_desktop")


def test_the_desk_answering_first_is_named_to_a_late_phone(phone, bridge):
    qid, _ = request(bridge)
    entry = only_pending(phone)
    result = dispatch(bridge, str(uuid.uuid4()), "mobile.desktop_answer",
                      {"session_id": "sess-1", "question_id": qid, "answers": {}})["result"]
    assert result == {"state": "answered_on_desktop"}
    late = decide(phone, entry)
    assert (late.status_code, late.json()["error"]) == (409, "answered_on_desktop")
    assert AuditEntry.objects.filter(action="mobile.desktop_answer").count() == 1
    assert outbox(bridge, "mobile.answer") == []
