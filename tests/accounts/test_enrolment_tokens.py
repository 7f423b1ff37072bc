from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model
from django.test import RequestFactory
from django.utils import timezone
from django_otp.plugins.otp_totp.models import TOTPDevice
from rest_framework.exceptions import AuthenticationFailed

from ai1net.accounts.authentication import ApiTokenAuthentication
from ai1net.accounts.models import ApiToken, AuditEntry, BackupCode, BackupCodeDevice
from ai1net.accounts.services import hash_secret

from .helpers import code_step, password_step, totp_code

pytestmark = pytest.mark.django_db


def _enrol(api):
    assert api.post("/accounts/two-factor/start/").status_code == 302
    page = api.get("/accounts/")
    assert page.status_code == 200
    device = TOTPDevice.objects.get(confirmed=False)
    return page, device


def test_enrol_shows_qr_and_secret_then_confirms(api, user):
    page, device = _enrol(api)
    html = page.content.decode()
    assert "<svg" in html and "otp-secret" in html
    secret = re.search(r'class="otp-secret">([A-Z2-7=]+)<', html).group(1)
    assert secret in device.config_url and device.config_url.startswith("otpauth://totp/ai1net")

    wrong = f"{(int(totp_code(device)) + 1) % 1_000_000:06d}"
    assert api.post("/accounts/two-factor/confirm/", {"code": wrong}).status_code == 400
    device.refresh_from_db()
    assert not device.confirmed

    response = api.post("/accounts/two-factor/confirm/", {"code": totp_code(device)})
    assert response.status_code == 200
    device.refresh_from_db()
    assert device.confirmed
    codes = re.findall(r"\b[a-z2-9]{5}-[a-z2-9]{5}\b", response.content.decode())
    assert len(codes) == 10
    # Stored hashed only.
    stored = set(BackupCode.objects.values_list("code_hash", flat=True))
    assert stored == {hash_secret(c.replace("-", "")) for c in codes}
    assert b"Verified with two-factor" in api.get("/accounts/").content
    assert AuditEntry.objects.filter(action="accounts.otp.enrolled", subject=user).exists()


def test_next_login_asks_for_code_after_enrolment(client, api, user, password):
    _, device = _enrol(api)
    api.post("/accounts/two-factor/confirm/", {"code": totp_code(device)})
    api.post("/accounts/logout/")
    response = password_step(client, "alice", password)
    assert response["Location"].startswith("/accounts/login/code/")


def test_remove_two_factor(api, user):
    _, device = _enrol(api)
    api.post("/accounts/two-factor/confirm/", {"code": totp_code(device)})
    assert api.post("/accounts/two-factor/remove/").status_code == 302
    assert not TOTPDevice.objects.filter(user=user).exists()
    assert not BackupCodeDevice.objects.filter(user=user).exists()
    assert AuditEntry.objects.filter(action="accounts.otp.removed").exists()


def test_remove_needs_a_verified_session(client, user, password):
    TOTPDevice.objects.create(user=user, name="app", confirmed=True)
    client.force_login(user)  # logged in but never verified
    response = client.post("/accounts/two-factor/remove/")
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/code/")
    assert TOTPDevice.objects.filter(user=user).exists()


def test_api_token_needs_verified_login(api, user):
    response = api.post("/accounts/tokens/", {"name": "agent"})
    assert response.status_code == 403
    assert not ApiToken.objects.exists()


def test_api_token_shown_once_stored_hashed_and_revocable(client, user, password):
    device = TOTPDevice.objects.create(user=user, name="app", confirmed=True)
    password_step(client, "alice", password)
    code_step(client, totp_code(device))
    response = client.post("/accounts/tokens/", {"name": "claude"})
    assert response.status_code == 200
    raw = re.search(r'class="new-token">(ai1_[A-Za-z0-9_\-]+)<', response.content.decode()).group(1)
    token = ApiToken.objects.get()
    assert token.token_hash == hash_secret(raw) and raw not in str(ApiToken.objects.values().get())
    assert raw.encode() not in client.get("/accounts/").content, "shown once"

    auth = ApiTokenAuthentication()
    request = RequestFactory().get("/", HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert auth.authenticate(request)[0] == user

    assert client.post(f"/accounts/tokens/{token.pk}/revoke/").status_code == 302
    with pytest.raises(AuthenticationFailed):
        auth.authenticate(RequestFactory().get("/", HTTP_AUTHORIZATION=f"Bearer {raw}"))
    assert client.post(f"/accounts/tokens/{token.pk}/revoke/").status_code == 404


def test_a_tokens_last_use_is_written_once_a_minute_not_per_request(user):
    from ai1net.accounts import services

    token, raw = services.api_token_create(user=user, name="agent")
    first = services.api_token_authenticate(raw=raw).last_used_at
    assert first is not None and ApiToken.objects.get().last_used_at == first
    assert services.api_token_authenticate(raw=raw).last_used_at == first  # a burst: no write
    assert ApiToken.objects.get().last_used_at == first
    ApiToken.objects.update(last_used_at=first - services.TOKEN_USE_RESOLUTION)
    later = services.api_token_authenticate(raw=raw).last_used_at
    assert later > first and ApiToken.objects.get().last_used_at == later


def test_a_token_is_refused_once_revoked_or_its_user_deactivated(user, django_assert_num_queries):
    from ai1net.accounts import services

    token, raw = services.api_token_create(user=user, name="agent")
    ApiToken.objects.update(last_used_at=timezone.now())
    with django_assert_num_queries(2):  # the token by its hash, its user by key; the last use is recent
        found = services.api_token_authenticate(raw=raw)
    assert found.pk == token.pk and found.user == user and found.user.username == "alice"
    assert services.api_token_authenticate(raw=raw + "x") is None
    get_user_model().objects.filter(pk=user.pk).update(is_active=False)
    assert services.api_token_authenticate(raw=raw) is None
    get_user_model().objects.filter(pk=user.pk).update(is_active=True)
    services.api_token_revoke(user=user, token_id=token.pk)
    assert services.api_token_authenticate(raw=raw) is None


def test_someone_elses_token_is_404(api, other_user):
    from ai1net.accounts import services

    token, _ = services.api_token_create(user=other_user, name="theirs")
    assert api.post(f"/accounts/tokens/{token.pk}/revoke/").status_code == 404
    token.refresh_from_db()
    assert token.revoked_at is None


def test_enrolment_and_removal_end_other_sessions(client, api, user):
    from django.test import Client

    other = Client()
    other.force_login(user)
    assert other.get("/accounts/").status_code == 200
    _, device = _enrol(api)
    api.post("/accounts/two-factor/confirm/", {"code": totp_code(device)})
    assert other.get("/accounts/").status_code == 302, "a session from before enrolment must end"
    assert api.get("/accounts/").status_code == 200, "the enrolling session stays"

    user.refresh_from_db()
    third = Client()
    third.force_login(user)
    assert third.get("/accounts/").status_code == 200
    assert api.post("/accounts/two-factor/remove/").status_code == 302
    assert third.get("/accounts/").status_code == 302
    assert api.get("/accounts/").status_code == 200
