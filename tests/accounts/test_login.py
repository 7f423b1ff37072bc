from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from ai1net.accounts import ratelimit, services
from ai1net.accounts.views import PENDING_KEY, PENDING_TTL

from .helpers import code_step, logged_in_user_id, password_step, totp_code, totp_device

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _no_otp_throttle(settings):
    # django-otp's own back-off would refuse a right code right after a wrong one; our limits stay on.
    settings.OTP_TOTP_THROTTLE_FACTOR = 0


def test_login_without_otp_goes_straight_in(client, user, password):
    response = password_step(client, "alice", password, next_url="/accounts/")
    assert response.status_code == 302 and response["Location"] == "/accounts/"
    assert logged_in_user_id(client) == str(user.pk)


def test_wrong_password_refused(client, user):
    response = password_step(client, "alice", "nope")
    assert response.status_code == 200
    assert b"Wrong username or password" in response.content
    assert logged_in_user_id(client) is None


def test_login_with_otp_needs_the_code(client, user, password):
    device = totp_device(user)
    response = password_step(client, "alice", password)
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/code/")
    assert logged_in_user_id(client) is None, "the password alone must not log in"
    assert client.get("/accounts/").status_code == 302

    response = code_step(client, totp_code(device))
    assert response.status_code == 302
    assert logged_in_user_id(client) == str(user.pk)
    page = client.get("/accounts/")
    assert page.status_code == 200 and b"Verified with two-factor" in page.content


def test_wrong_otp_code_refused(client, user, password):
    device = totp_device(user)
    password_step(client, "alice", password)
    wrong = f"{(int(totp_code(device)) + 1) % 1_000_000:06d}"
    response = code_step(client, wrong)
    assert response.status_code == 200 and b"not right" in response.content
    assert logged_in_user_id(client) is None


def test_expired_otp_code_refused(client, user, password):
    device = totp_device(user)
    password_step(client, "alice", password)
    response = code_step(client, totp_code(device, offset=-300))
    assert response.status_code == 200
    assert logged_in_user_id(client) is None
    # The current code still works afterwards.
    assert code_step(client, totp_code(device)).status_code == 302


def test_reused_otp_code_refused(client, user, password):
    device = totp_device(user)
    code = totp_code(device)
    password_step(client, "alice", password)
    assert code_step(client, code).status_code == 302
    client.post("/accounts/logout/")
    assert logged_in_user_id(client) is None
    password_step(client, "alice", password)
    response = code_step(client, code)
    assert response.status_code == 200
    assert logged_in_user_id(client) is None


def test_backup_code_works_once(client, user, password):
    totp_device(user)
    codes = services.backup_codes_generate(user=user)
    assert len(codes) == services.BACKUP_CODE_COUNT
    password_step(client, "alice", password)
    assert code_step(client, codes[0]).status_code == 302
    assert logged_in_user_id(client) == str(user.pk)
    client.post("/accounts/logout/")
    password_step(client, "alice", password)
    assert code_step(client, codes[0]).status_code == 200
    assert logged_in_user_id(client) is None
    assert code_step(client, codes[1].upper()).status_code == 302  # case and dash do not matter


def test_pending_second_step_expires(client, user, password):
    device = totp_device(user)
    password_step(client, "alice", password)
    session = client.session
    session[PENDING_KEY] = {**session[PENDING_KEY], "at": session[PENDING_KEY]["at"] - PENDING_TTL - 1}
    session.save()
    response = code_step(client, totp_code(device))
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")
    assert logged_in_user_id(client) is None


def test_next_must_stay_on_site(client, user, password):
    response = password_step(client, "alice", password, next_url="https://evil.example/")
    assert response["Location"] == "/"


def test_failed_logins_rate_limited_per_account(client, user, password):
    for _ in range(ratelimit.LOGIN_PER_ACCOUNT.limit):
        assert password_step(client, "alice", "wrong").status_code == 200
    response = password_step(client, "alice", password)
    assert response.status_code == 429
    assert b"Too many failed attempts" in response.content
    assert logged_in_user_id(client) is None


def test_failed_logins_rate_limited_per_address(client, user, password, django_user_model):
    for i in range(ratelimit.LOGIN_PER_ADDRESS.limit):
        password_step(client, f"someone{i}", "wrong")
    response = password_step(client, "alice", password)
    assert response.status_code == 429
    # Another address is not affected.
    assert password_step(client.__class__(REMOTE_ADDR="10.0.0.9"), "alice", password).status_code == 302


def test_otp_attempts_rate_limited(client, user, password):
    device = totp_device(user)
    password_step(client, "alice", password)
    wrong = f"{(int(totp_code(device)) + 1) % 1_000_000:06d}"
    for _ in range(ratelimit.OTP_PER_ACCOUNT.limit):
        assert code_step(client, wrong).status_code == 200
    response = code_step(client, totp_code(device))
    assert response.status_code == 429
    assert b"Too many failed attempts" in response.content
    assert logged_in_user_id(client) is None


def test_inactive_user_cannot_log_in(client, user, password):
    get_user_model().objects.filter(pk=user.pk).update(is_active=False)
    assert password_step(client, "alice", password).status_code == 200
    assert logged_in_user_id(client) is None


def test_otp_session_ok_for_websocket_code(client, user, password):
    from importlib import import_module

    from django.conf import settings

    from ai1net.accounts.selectors import otp_session_ok

    store = import_module(settings.SESSION_ENGINE).SessionStore
    assert otp_session_ok(user, store()) is True, "no two-factor: a plain login is enough"
    device = totp_device(user)
    assert otp_session_ok(user, store()) is False
    password_step(client, "alice", password)
    code_step(client, totp_code(device))
    assert otp_session_ok(user, store(session_key=client.session.session_key)) is True
