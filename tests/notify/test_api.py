"""The notification API: subscription CRUD, the ntfy target, the VAPID key, the service worker, audit."""

from __future__ import annotations

import json
import os
import stat

import pytest
from django.test import Client

from ai1net.accounts.models import AuditEntry
from notify import checks, vapid
from notify.models import NtfyTarget, PushSubscription

pytestmark = pytest.mark.django_db

SUBS = "/api/notify/subscriptions"


def post(client, url, body, method="post"):
    return getattr(client, method)(url, data=json.dumps(body), content_type="application/json")


def test_subscription_crud_is_audited(phone, mobile_user, browser_keys):
    assert phone.get(SUBS).json() == []
    body = browser_keys.subscription("https://push.example.net/send/abc")
    created = post(phone, SUBS, body)
    assert created.status_code == 201, created.content
    assert created.json()["service"] == "push.example.net"
    assert post(phone, SUBS, body).status_code == 200, "the same browser again: no duplicate"
    listed = phone.get(SUBS).json()
    assert [s["endpoint"] for s in listed] == [body["endpoint"]] and listed[0]["failures"] == 0
    stored = PushSubscription.objects.get()
    assert (stored.user, stored.p256dh, stored.auth) == (mobile_user, browser_keys.p256dh, browser_keys.auth)

    gone = post(phone, SUBS, {"endpoint": body["endpoint"]}, method="delete")
    assert gone.status_code == 204
    assert not PushSubscription.objects.exists()
    assert post(phone, SUBS, {"endpoint": body["endpoint"]}, method="delete").status_code == 404
    actions = list(AuditEntry.objects.filter(action__startswith="notify.").order_by("id").values_list("action", "data"))
    assert [a for a, _ in actions] == ["notify.subscription.added", "notify.subscription.removed"]
    assert all("abc" not in json.dumps(data) for _, data in actions), "the endpoint (a capability) is not logged"


def test_delete_by_id_and_only_ones_own(phone, mobile_user, other_user, browser_keys):
    from notify import services

    mine, _ = services.subscription_create(user=mobile_user, endpoint="https://push.example.net/mine",
                                           **browser_keys.subscription("")["keys"])
    theirs, _ = services.subscription_create(user=other_user, endpoint="https://push.example.net/theirs",
                                             **browser_keys.subscription("")["keys"])
    assert phone.delete(f"{SUBS}/{theirs.pk}").status_code == 404
    assert post(phone, SUBS, {"endpoint": theirs.endpoint}, method="delete").status_code == 404
    assert [s["id"] for s in phone.get(SUBS).json()] == [mine.pk]
    assert phone.delete(f"{SUBS}/{mine.pk}").status_code == 204
    assert list(PushSubscription.objects.values_list("pk", flat=True)) == [theirs.pk]


def test_a_browser_that_changes_hands_moves_to_the_new_user(phone, mobile_user, other_user, browser_keys):
    from notify import services

    body = browser_keys.subscription("https://push.example.net/shared-phone")
    services.subscription_create(user=other_user, endpoint=body["endpoint"], **body["keys"])
    assert post(phone, SUBS, body).status_code == 201
    assert PushSubscription.objects.get().user == mobile_user
    entry = AuditEntry.objects.filter(action="notify.subscription.added").order_by("id").last()
    assert entry.data["moved_from_user_id"] == other_user.pk


@pytest.mark.parametrize("change", [
    {"keys": {"p256dh": "AAAA", "auth": "AAAAAAAAAAAAAAAAAAAAAA"}},
    {"keys": {"p256dh": "not base64 !!", "auth": "x"}},
    {"endpoint": "ftp://push.example.net/x"},
    {"endpoint": "https://user:secret@push.example.net/x"},
    {"endpoint": "javascript:alert(1)"},
    {"endpoint": "https://push.example.net/" + "x" * 1100},
])
def test_bad_subscriptions_are_refused(phone, browser_keys, change):
    body = {**browser_keys.subscription("https://push.example.net/ok"), **change}
    response = post(phone, SUBS, body)
    assert response.status_code == 400, response.content
    assert not PushSubscription.objects.exists()


def test_without_debug_private_endpoints_are_refused(phone, browser_keys, settings):
    settings.NOTIFY_ALLOW_PRIVATE_TARGETS = False
    for endpoint in ("http://push.example.net/x", "https://127.0.0.1:9/x", "https://localhost/x",
                     "https://10.1.2.3/x", "https://[::1]/x", "https://169.254.169.254/latest"):
        response = post(phone, SUBS, browser_keys.subscription(endpoint))
        assert response.status_code == 400, endpoint
        assert response.json()["error"] in {"bad_target", "private_target"}, endpoint


def test_the_api_is_for_the_browser_session_with_csrf(mobile_user, browser_keys):
    anonymous = Client()
    assert anonymous.get(SUBS).status_code == 403
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(mobile_user)
    assert post(strict, SUBS, browser_keys.subscription("https://push.example.net/x")).status_code == 403
    assert not PushSubscription.objects.exists()


def test_ntfy_target_set_read_clear(phone, mobile_user, settings):
    assert phone.get("/api/notify/ntfy").json()["url"] is None
    response = post(phone, "/api/notify/ntfy", {"url": "https://ntfy.example.net/my-secret-topic"}, method="put")
    assert response.status_code == 200, response.content
    assert response.json()["click_url"] == "http://testserver/m/"
    settings.PUBLIC_URL = "https://ai1net.example"
    post(phone, "/api/notify/ntfy", {"url": "https://ntfy.example.net/other"}, method="put")
    target = NtfyTarget.objects.get(user=mobile_user)
    assert (target.url, target.click_url) == ("https://ntfy.example.net/other", "https://ai1net.example/m/")
    assert phone.delete("/api/notify/ntfy").status_code == 204
    assert not NtfyTarget.objects.exists()
    assert phone.delete("/api/notify/ntfy").status_code == 204
    actions = list(AuditEntry.objects.filter(action__startswith="notify.").order_by("id").values_list("action", flat=True))
    assert actions == ["notify.ntfy.set", "notify.ntfy.set", "notify.ntfy.cleared"]


@pytest.mark.parametrize("url", ["http://ntfy.example.net/t", "https://u:p@ntfy.example.net/t", "file:///etc/passwd",
                                 "https://ntfy.example.net/", "https://127.0.0.1/t", "https://192.168.1.2/t",
                                 "https://0x7f.1/t", "https://2130706433/t", "https://[::ffff:127.0.0.1]/t",
                                 "https://metadata.internal/t", "gopher://ntfy.example.net/t"])
def test_ntfy_refuses_other_schemes_credentials_and_private_addresses(phone, settings, url):
    settings.NOTIFY_ALLOW_PRIVATE_TARGETS = False
    response = post(phone, "/api/notify/ntfy", {"url": url}, method="put")
    assert response.status_code == 400, url
    assert not NtfyTarget.objects.exists()


def test_ntfy_accepts_a_public_https_topic(phone, settings):
    settings.NOTIFY_ALLOW_PRIVATE_TARGETS = False
    response = post(phone, "/api/notify/ntfy", {"url": "https://93.184.216.34/topic"}, method="put")
    assert response.status_code == 200, response.content


def test_vapid_public_key_is_made_once_and_kept(phone, settings):
    first = phone.get("/api/notify/vapid-public-key").json()
    assert first["enabled"] is True and len(first["public_key"]) == 87
    vapid._cache.clear()
    assert phone.get("/api/notify/vapid-public-key").json() == first, "read back from the file"
    assert stat.S_IMODE(os.stat(settings.VAPID_KEY_FILE).st_mode) == 0o600


def test_vapid_keys_from_the_environment(phone, settings, tmp_path):
    made = json.loads(_make_key_file(tmp_path).read_text())
    settings.VAPID_KEY_FILE = None
    settings.VAPID_PRIVATE_KEY = made["private_key"]
    assert phone.get("/api/notify/vapid-public-key").json() == {"enabled": True, "public_key": made["public_key"]}
    assert checks.vapid_keys_check() == []


def test_without_keys_and_debug_off_push_is_off_without_a_warning(phone, settings):
    settings.VAPID_KEY_FILE = None
    assert phone.get("/api/notify/vapid-public-key").json() == {"enabled": False, "public_key": ""}
    assert checks.vapid_keys_check() == []


def test_deploy_check_names_a_half_configured_pair(settings, tmp_path):
    made = json.loads(_make_key_file(tmp_path).read_text())
    settings.VAPID_PUBLIC_KEY = made["public_key"]
    assert [w.id for w in checks.vapid_keys_check()] == ["notify.W001"]
    settings.VAPID_PRIVATE_KEY = "not-a-key"
    assert [w.id for w in checks.vapid_keys_check()] == ["notify.W002"]
    other = json.loads(_make_key_file(tmp_path / "other").read_text())
    settings.VAPID_PRIVATE_KEY = other["private_key"]
    assert [w.id for w in checks.vapid_keys_check()] == ["notify.W002"], "a public key of another pair"
    settings.VAPID_PUBLIC_KEY = ""
    settings.VAPID_SUBJECT = "mailto:ai1net@localhost"
    assert [w.id for w in checks.vapid_keys_check()] == ["notify.W003"]


def _make_key_file(folder):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "made.json"
    vapid._from_file(path)
    return path


def test_the_service_worker_is_served_under_m(client):
    response = client.get("/m/sw.js")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/javascript")
    assert response["Service-Worker-Allowed"] == "/m/"
    assert b"showNotification" in response.content and b"notificationclick" in response.content


def test_the_phone_page_has_the_toggle(phone):
    page = phone.get("/m/").content.decode()
    assert 'data-testid="notify-toggle"' in page and "notify/notify.js" in page
