"""The notice on a new question: what it says (nothing of the question), where it goes, pruning."""

from __future__ import annotations

import json
import threading
import time

import http_ece
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from ai1net.accounts.models import AuditEntry
from mobile.models import Question
from notify import dispatch, services
from notify.models import NtfyTarget, PushSubscription
from tests.e2e_support import wait_until
from tests.mobile.factories import TWO_QUESTIONS, ask

SECRET_QUESTIONS = [
    {
        "question": "Delete /srv/prod/db with rm -rf /srv/prod/db?",
        "header": "Danger zone",
        "options": [{"label": "Yes, run sudo rm -rf", "description": "wipes /srv/prod/db"},
                    {"label": "No", "description": "keep the passwords.txt file"}],
        "multiSelect": False,
    },
    *TWO_QUESTIONS,
]


def question_strings(question: Question) -> list[str]:
    """Every string of the question and its session that must never leave in a notice."""
    strings = [question.session.session_id, question.session.cwd, question.session.host, question.session.title,
               question.tool_use_id, str(question.pk)]
    for q in question.questions:
        strings += [q["question"], q["header"]]
        for option in q["options"]:
            strings += [option["label"], option.get("description", "")]
    strings += [word for s in list(strings) for word in s.split() if len(word) >= 4]
    return sorted({s for s in strings if s and s not in {"ai1net"}})


@pytest.fixture
def encrypt_spy(monkeypatch):
    """Records the plaintext handed to the Web Push encryption (RFC 8291) before it is encrypted."""
    plaintexts: list[bytes] = []
    real = http_ece.encrypt

    def spy(content, *args, **kwargs):
        plaintexts.append(bytes(content))
        return real(content, *args, **kwargs)

    monkeypatch.setattr(http_ece, "encrypt", spy)
    return plaintexts


def decrypt(received, browser_keys) -> bytes:
    assert received.headers["content-encoding"] == "aes128gcm"
    return http_ece.decrypt(received.body, private_key=browser_keys.private_key, auth_secret=browser_keys.auth_secret,
                            version="aes128gcm")


@pytest.mark.django_db(transaction=True)
def test_a_new_question_pushes_a_notice_that_carries_no_question_text(mobile_user, bridge, push_service,
                                                                     browser_keys, encrypt_spy):
    services.subscription_create(user=mobile_user, **browser_keys.subscription(f"{push_service.url}/push/phone")["keys"],
                                 endpoint=f"{push_service.url}/push/phone")
    services.ntfy_target_set(user=mobile_user, url=f"{push_service.url}/ai1net-topic",
                             click_url="https://ai1net.example/m/")

    question, _nonce = ask(bridge, questions=SECRET_QUESTIONS)  # commits: the trigger runs for real

    wait_until(lambda: push_service.for_path("/push/phone") and push_service.for_path("/ai1net-topic"),
               timeout=10, message="the push and the ntfy post")
    expected = {"title": "ai1net", "body": "An agent is waiting (1)", "url": "/m/", "count": 1}
    # The plaintext before encryption is exactly the generic notice...
    assert len(encrypt_spy) == 1
    assert json.loads(encrypt_spy[0]) == expected
    # ...and it is what the browser decrypts from what the push service received.
    push = push_service.for_path("/push/phone")[0]
    assert decrypt(push, browser_keys) == encrypt_spy[0]
    ntfy = push_service.for_path("/ai1net-topic")[0]
    for secret in question_strings(question):
        assert secret not in encrypt_spy[0].decode(), secret
        # Ciphertext is random bytes: a short string ("No", "zone") turns up in it by chance, so only strings long
        # enough never to do so are looked for there. The decrypted body above covers every string.
        if len(secret) >= 8:
            assert secret.encode() not in push.body, secret
        ours = " ".join(ntfy.headers[name] for name in ("title", "click", "tags"))
        assert secret not in ntfy.body.decode() and secret not in ours, secret
    assert push.headers["authorization"].startswith("vapid t=")
    assert push.headers["topic"] == "ai1net-waiting" and push.headers["urgency"] == "high"
    assert int(push.headers["ttl"]) > 0
    assert ntfy.body == b"An agent is waiting (1)"
    assert ntfy.headers["title"] == "ai1net" and ntfy.headers["click"] == "https://ai1net.example/m/"
    wait_until(lambda: PushSubscription.objects.get().last_ok is not None, message="last_ok recorded")


@pytest.mark.django_db(transaction=True)
def test_questions_in_a_burst_make_one_notice_then_one_with_the_count(mobile_user, bridge, push_service,
                                                                      browser_keys, encrypt_spy, settings):
    settings.NOTIFY_COALESCE_SEC = 1.0
    endpoint = f"{push_service.url}/push/phone"
    services.subscription_create(user=mobile_user, endpoint=endpoint, **browser_keys.subscription(endpoint)["keys"])
    for n in range(3):
        ask(bridge, tool_use_id=f"toolu_{n}")

    def counts():
        return [json.loads(decrypt(r, browser_keys))["count"] for r in list(push_service.received)]

    wait_until(lambda: counts() and counts()[-1] == 3, timeout=10, message="a push with the count 3")
    time.sleep(1.5)  # a third would have come by now
    # At once for the first question; the rest, however they fall, in at most one more with the count.
    assert len(counts()) <= 2 and counts()[-1] == 3, counts()


def test_the_dispatcher_sends_at_once_then_once_per_window(settings, monkeypatch):
    settings.NOTIFY_COALESCE_SEC = 0.4
    sent: list[tuple[int, float]] = []
    done = threading.Event()

    def record(user_id):
        sent.append((user_id, time.monotonic()))
        if len(sent) >= 3:
            done.set()

    monkeypatch.setattr(dispatch, "send_waiting", record)
    dispatcher = dispatch.Dispatcher()
    start = time.monotonic()
    dispatcher.waiting(1)
    dispatcher.waiting(2)
    wait_until(lambda: len(sent) == 2, timeout=5, message="the first sends, at once")
    for _ in range(5):  # more questions within the window: one more send, at its end
        dispatcher.waiting(1)
    assert done.wait(5)
    time.sleep(0.6)
    by_user = {uid: [at - start for u, at in sent if u == uid] for uid in (1, 2)}
    assert len(by_user[1]) == 2 and by_user[1][0] < 0.2 and 0.35 <= by_user[1][1] < 1.5
    assert len(by_user[2]) == 1 and by_user[2][0] < 0.2
    dispatcher.close()


def test_closing_the_dispatcher_drops_what_is_due_later_and_waits_for_what_runs(settings, monkeypatch):
    settings.NOTIFY_COALESCE_SEC = 0.3
    started, release = threading.Event(), threading.Event()
    sent: list[int] = []

    def slow_send(user_id):
        started.set()
        release.wait(5)
        sent.append(user_id)

    monkeypatch.setattr(dispatch, "send_waiting", slow_send)
    dispatcher = dispatch.Dispatcher()
    dispatcher.waiting(1)
    assert started.wait(5)
    dispatcher.waiting(1)  # coalesced: due at the window's end
    thread = dispatcher._thread
    threading.Timer(0.2, release.set).start()
    dispatcher.close()
    assert sent == [1]  # the running send ended before close returned
    time.sleep(0.5)
    assert sent == [1]  # the one due later never ran
    assert thread is not None and not thread.is_alive()
    dispatcher.waiting(2)  # a closed dispatcher starts afresh
    wait_until(lambda: sent == [1, 2], timeout=5, message="a send after close")
    dispatcher.close()


@pytest.mark.django_db  # send_waiting closes the thread's old connection first: one left open here is checked
def test_a_failing_send_never_reaches_the_caller(monkeypatch):
    def boom(*, user_id):
        raise RuntimeError("push service on fire")

    monkeypatch.setattr(services, "notify_user_waiting", boom)
    assert dispatch.send_waiting(1) is None


@pytest.mark.django_db
def test_404_and_410_prune_the_subscription_other_failures_count(mobile_user, bridge, push_service, browser_keys):
    ask(bridge)  # not committed in this test, so the trigger stays quiet: the send is called directly
    push_service.statuses.update({"/gone": 410, "/missing": 404, "/broken": 500})
    push_service.redirects["/moved"] = f"{push_service.url}/elsewhere"
    for path in ("/gone", "/missing", "/broken", "/moved", "/fine"):
        endpoint = f"{push_service.url}{path}"
        services.subscription_create(user=mobile_user, endpoint=endpoint, **browser_keys.subscription(endpoint)["keys"])

    summary = services.notify_user_waiting(user_id=mobile_user.pk)

    assert summary == {"count": 1, "sent": 1, "pruned": 2, "failed": 2}
    left = {s.endpoint.rsplit("/", 1)[1]: s for s in PushSubscription.objects.all()}
    assert set(left) == {"broken", "moved", "fine"}
    assert left["broken"].failures == 1 and left["moved"].failures == 1 and left["broken"].last_ok is None
    assert left["fine"].failures == 0 and left["fine"].last_ok is not None
    assert not push_service.for_path("/elsewhere"), "redirects are never followed"
    pruned = AuditEntry.objects.filter(action="notify.subscription.pruned")
    assert sorted(e.data["status"] for e in pruned) == [404, 410]
    assert all(e.actor is None and e.subject == mobile_user for e in pruned)

    services.notify_user_waiting(user_id=mobile_user.pk)
    assert PushSubscription.objects.get(endpoint__endswith="/broken").failures == 2


@pytest.mark.django_db
def test_nothing_is_sent_while_nothing_waits(mobile_user, bridge, push_service, browser_keys):
    endpoint = f"{push_service.url}/push"
    services.subscription_create(user=mobile_user, endpoint=endpoint, **browser_keys.subscription(endpoint)["keys"])
    assert services.notify_user_waiting(user_id=mobile_user.pk)["sent"] == 0
    question, _ = ask(bridge)
    Question.objects.filter(pk=question.pk).update(state=Question.State.ANSWERED)
    assert services.notify_user_waiting(user_id=mobile_user.pk) == {"count": 0, "sent": 0, "pruned": 0, "failed": 0}
    assert push_service.received == []


@pytest.mark.django_db
def test_without_vapid_keys_web_push_is_off_and_ntfy_still_goes(mobile_user, bridge, push_service, browser_keys,
                                                                 settings):
    settings.VAPID_KEY_FILE = None  # debug off, no keys in the environment
    endpoint = f"{push_service.url}/push"
    services.subscription_create(user=mobile_user, endpoint=endpoint, **browser_keys.subscription(endpoint)["keys"])
    services.ntfy_target_set(user=mobile_user, url=f"{push_service.url}/topic", click_url="http://testserver/m/")
    ask(bridge)
    assert services.notify_user_waiting(user_id=mobile_user.pk)["sent"] == 1
    assert [r.path for r in push_service.received] == ["/topic"]


@pytest.mark.django_db
def test_a_stored_target_that_became_private_is_not_contacted(mobile_user, bridge, push_service, browser_keys,
                                                              settings):
    endpoint = f"{push_service.url}/push"
    services.subscription_create(user=mobile_user, endpoint=endpoint, **browser_keys.subscription(endpoint)["keys"])
    NtfyTarget.objects.create(user=mobile_user, url=f"{push_service.url}/topic", click_url="https://x.example/m/")
    settings.NOTIFY_ALLOW_PRIVATE_TARGETS = False
    ask(bridge)
    assert services.notify_user_waiting(user_id=mobile_user.pk)["failed"] == 2
    assert push_service.received == []
    assert PushSubscription.objects.get().failures == 1 and NtfyTarget.objects.get().failures == 1


@pytest.mark.django_db(transaction=True)
def test_a_question_saved_without_its_device_loaded_still_notifies(mobile_user, bridge, push_service, browser_keys):
    endpoint = f"{push_service.url}/push/phone"
    services.subscription_create(user=mobile_user, endpoint=endpoint, **browser_keys.subscription(endpoint)["keys"])
    question, _ = ask(bridge)
    wait_until(lambda: push_service.for_path("/push/phone"), timeout=10, message="the first push")
    push_service.received.clear()
    time.sleep(0.4)  # past the coalescing window of the first notice
    copy = Question.objects.get(pk=question.pk)  # device not loaded: the receiver must not query for it
    copy.pk = None
    copy.id = "00000000-0000-4000-8000-000000000001"
    with CaptureQueriesContext(connection) as queries:
        copy.save(force_insert=True)
    assert len(queries) == 1, [q["sql"] for q in queries]
    wait_until(lambda: push_service.for_path("/push/phone"), timeout=10, message="the push")
    assert json.loads(decrypt(push_service.received[0], browser_keys))["count"] == 2


@pytest.mark.django_db
def test_the_question_path_runs_no_notify_query(mobile_user, bridge, push_service, browser_keys):
    endpoint = f"{push_service.url}/push/phone"
    services.subscription_create(user=mobile_user, endpoint=endpoint, **browser_keys.subscription(endpoint)["keys"])
    with CaptureQueriesContext(connection) as queries:
        ask(bridge)
    assert not [q["sql"] for q in queries if "notify_" in q["sql"]]
