from __future__ import annotations

import pytest

from ai1net.accounts.models import AuditEntry

from .helpers import code_step, password_step, totp_code, totp_device

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator(django_user_model, password):
    return django_user_model.objects.create_superuser(username="root", password=password)


@pytest.fixture
def verified_admin(client, operator, password):
    device = totp_device(operator)
    password_step(client, "root", password)
    assert code_step(client, totp_code(device)).status_code == 302
    return client


def test_admin_refused_without_otp(client, operator):
    client.force_login(operator)
    response = client.get("/admin/")
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")
    # The admin's own login sends a staff member without a device to set one up, never into the admin.
    response = client.get(response["Location"])
    assert response.status_code == 302 and response["Location"] == "/accounts/"
    assert client.get("/admin/accounts/user/").status_code == 302


def test_admin_refused_after_password_only(client, operator, password):
    totp_device(operator)
    password_step(client, "root", password)
    assert client.get("/admin/").status_code == 302


def test_admin_open_with_verified_otp(verified_admin):
    response = verified_admin.get("/admin/")
    assert response.status_code == 200
    assert b"ai1net operators" in response.content


def test_anonymous_admin_goes_to_platform_login(client):
    response = client.get("/admin/login/?next=/admin/")
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/?next=")


def test_user_list_shows_and_filters_switches(verified_admin, user, other_user):
    other_user.mobile_reply_enabled = True
    other_user.save()
    page = verified_admin.get("/admin/accounts/user/")
    assert page.status_code == 200
    assert b"column-mobile_reply_enabled" in page.content and b"column-device_web_enabled" in page.content
    filtered = verified_admin.get("/admin/accounts/user/?mobile_reply_enabled__exact=1")
    assert b"mallory" in filtered.content and b">alice<" not in filtered.content


def test_bulk_actions_switch_and_audit(verified_admin, operator, user, other_user):
    response = verified_admin.post(
        "/admin/accounts/user/",
        {"action": "mobile_reply_on", "_selected_action": [user.pk, other_user.pk]},
        REMOTE_ADDR="203.0.113.5",
    )
    assert response.status_code == 302
    user.refresh_from_db()
    other_user.refresh_from_db()
    assert user.mobile_reply_enabled and other_user.mobile_reply_enabled
    entries = AuditEntry.objects.filter(action="accounts.switch.mobile_reply")
    assert {e.subject_id for e in entries} == {user.pk, other_user.pk}
    assert all(e.actor_id == operator.pk and e.ip == "203.0.113.5" and e.data["new"] is True for e in entries)

    verified_admin.post("/admin/accounts/user/", {"action": "device_web_off", "_selected_action": [user.pk]})
    assert not AuditEntry.objects.filter(action="accounts.switch.device_web").exists(), "no change, no entry"


def test_change_form_switch_is_audited(verified_admin, operator, user):
    page = verified_admin.get(f"/admin/accounts/user/{user.pk}/change/")
    assert page.status_code == 200
    form = page.context["adminform"].form
    data = {k: v for k, v in form.initial.items() if v is not None and k not in ("groups", "user_permissions",
                                                                                  "password")}
    data.update({"username": user.username, "date_joined_0": "2026-01-01", "date_joined_1": "00:00:00",
                 "device_web_enabled": "on", "is_active": "on"})
    data.pop("date_joined", None)
    data.pop("last_login", None)
    data.pop("mobile_reply_enabled", None)
    response = verified_admin.post(f"/admin/accounts/user/{user.pk}/change/", data)
    assert response.status_code == 302, response.context["adminform"].form.errors if response.context else ""
    user.refresh_from_db()
    assert user.device_web_enabled
    entry = AuditEntry.objects.get(action="accounts.switch.device_web")
    assert entry.actor_id == operator.pk and entry.subject_id == user.pk


def test_banner_while_global_stop(verified_admin, settings):
    assert b"Emergency stop in force" not in verified_admin.get("/admin/").content
    settings.DEVICE_WEB_ENABLED = False
    content = verified_admin.get("/admin/").content
    assert b"Emergency stop in force" in content and b"AI1NET_DEVICE_WEB=0" in content


def test_audit_log_admin_is_read_only(verified_admin, user):
    from ai1net.accounts import services

    entry = services.audit_record(actor=user, action="test.event", data={"x": 1})
    assert verified_admin.get("/admin/accounts/auditentry/").status_code == 200
    assert verified_admin.get(f"/admin/accounts/auditentry/{entry.pk}/change/").status_code == 200
    assert verified_admin.get("/admin/accounts/auditentry/add/").status_code == 403
    assert verified_admin.post(f"/admin/accounts/auditentry/{entry.pk}/delete/", {"post": "yes"}).status_code == 403
    response = verified_admin.post(f"/admin/accounts/auditentry/{entry.pk}/change/", {"action": "forged"})
    assert response.status_code == 403
    assert AuditEntry.objects.get(pk=entry.pk).action == "test.event"
