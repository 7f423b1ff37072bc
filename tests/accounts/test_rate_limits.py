"""The shared limiter (ai1net.accounts.ratelimit) and the accounts surfaces it guards: login, login codes,
the first-run set-up link and API bearer tokens. Limits are shrunk per test to keep them fast."""

from __future__ import annotations

import threading

import pytest
from django.core.cache import cache
from django.http import HttpResponse
from django.test import Client

from ai1net.accounts import ratelimit, services, views
from ai1net.accounts.models import AuditEntry
from ai1net.accounts.ratelimit import Limit
from ai1net.exceptions import RateLimited
from tests.e2e_support import wait_until

from .helpers import code_step, logged_in_user_id, password_step, totp_code, totp_device

pytestmark = pytest.mark.django_db

SMALL = Limit("test.small", 3, 60)


def lockouts(scope: str) -> int:
    return AuditEntry.objects.filter(action="security.rate_limited", data__scope=scope).count()


@pytest.fixture
def shrink(monkeypatch):
    """Replace a named limit of the module by a small one (callers read it at call time)."""
    def apply(name: str, limit: int = 3, window: int = 60) -> Limit:
        small = Limit(getattr(ratelimit, name).scope, limit, window)
        monkeypatch.setattr(ratelimit, name, small)
        return small
    return apply


# --- the module --------------------------------------------------------------------------------

def test_the_failure_that_reaches_the_limit_refuses_the_next_and_is_audited_once():
    pair = (SMALL, "10.1.1.1")
    for _ in range(SMALL.limit - 1):
        ratelimit.fail(pair)
        ratelimit.check(pair)
    assert ratelimit.fail(pair, ip="10.1.1.1") == [SMALL]
    with pytest.raises(RateLimited) as refused:
        ratelimit.check(pair, what="Too many tries.")
    wait = refused.value.extra["retry_after"]
    assert 55 <= wait <= 60 and refused.value.status == 429
    assert refused.value.detail.startswith("Too many tries. Try again in ")
    for _ in range(5):  # more failures: still one audit entry for this lockout
        ratelimit.fail(pair)
    assert lockouts(SMALL.scope) == 1
    entry = AuditEntry.objects.get(action="security.rate_limited")
    assert entry.ip == "10.1.1.1" and entry.data["limit"] == SMALL.limit
    ratelimit.check((SMALL, "10.1.1.2"))  # another key is not affected
    ratelimit.check((SMALL, ""))  # an empty key is never counted


def test_a_counter_that_lost_its_expiry_still_ends():
    """Django's Redis incr (EXISTS, then INCR) can remake an expired counter without an expiry."""
    short = Limit("test.lost", 2, 1)
    cache.set(ratelimit._key(short, "someone"), 2, timeout=None)  # at the limit, no expiry, no window end
    assert ratelimit.is_limited((short, "someone"))
    wait_until(lambda: not ratelimit.is_limited((short, "someone")), timeout=10, message="the lost counter to end")


def test_concurrent_failures_are_all_counted():
    big = Limit("test.big", 10_000, 60)
    workers = [threading.Thread(target=lambda: [ratelimit.fail((big, "x")) for _ in range(25)]) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert ratelimit.count(big, "x") == 100


# --- login and login codes ---------------------------------------------------------------------

def test_login_lockout_names_the_wait_and_spares_other_accounts(client, user, password, other_user, shrink):
    account = shrink("LOGIN_PER_ACCOUNT")
    for _ in range(account.limit):
        assert password_step(client, "alice", "wrong").status_code == 200
    response = password_step(client, "alice", password)
    assert response.status_code == 429 and int(response["Retry-After"]) > 0
    assert b"Try again in " in response.content and logged_in_user_id(client) is None
    assert lockouts(account.scope) == 1
    assert password_step(Client(), "mallory", password).status_code == 302, "another account is not locked"


def test_login_lock_per_address_spares_other_addresses(client, user, password, shrink):
    address = shrink("LOGIN_PER_ADDRESS")
    for i in range(address.limit):  # the view's counting is shown above; here no password hashes
        ratelimit.fail((address, "127.0.0.1"), (ratelimit.LOGIN_PER_ACCOUNT, f"someone{i}"))
    response = password_step(client, "alice", password)
    assert response.status_code == 429 and "Retry-After" in response
    assert password_step(Client(REMOTE_ADDR="10.0.0.9"), "alice", password).status_code == 302


def test_login_lock_ends_with_its_window(client, user, password, shrink):
    account = shrink("LOGIN_PER_ACCOUNT", limit=2, window=3)  # long enough for a loaded machine to see the lock
    for _ in range(2):  # counted directly: two password hashes could outlast a short window on a loaded machine
        ratelimit.fail((account, "alice"))
    assert 1 <= ratelimit.retry_after((account, "alice")) <= 3
    assert password_step(client, "alice", password).status_code == 429  # refused before any hashing
    wait_until(lambda: password_step(client, "alice", password).status_code == 302, timeout=15,
               message="the login lock to end")


def _known_to(user) -> Client:
    """A fresh browser carrying the mark a complete login as ``user`` leaves."""
    browser = Client()
    marked = views.mark_known_browser(HttpResponse(), user)
    browser.cookies[views.KNOWN_BROWSER_COOKIE] = marked.cookies[views.KNOWN_BROWSER_COOKIE].value
    return browser


def test_a_browser_the_account_used_before_is_not_locked_out_by_others_guesses(user, password, other_user,
                                                                                shrink):
    account = shrink("LOGIN_PER_ACCOUNT", limit=2)
    for _ in range(account.limit):  # someone elsewhere guessed alice's password
        ratelimit.fail((account, "alice"))
    assert password_step(Client(), "alice", password).status_code == 429
    assert password_step(_known_to(other_user), "alice", password).status_code == 429, "mallory's mark is no key"
    response = password_step(_known_to(user), "alice", password)
    assert response.status_code == 302, "alice's own browser logs in"
    assert response.cookies[views.KNOWN_BROWSER_COOKIE].value, "a complete login renews the mark"


def test_a_known_browser_has_a_limit_of_its_own(user, shrink):
    browser_limit = shrink("LOGIN_PER_KNOWN_BROWSER", limit=2)
    browser = _known_to(user)
    for _ in range(browser_limit.limit):
        assert password_step(browser, "alice", "wrong").status_code == 200
    assert password_step(browser, "alice", "wrong").status_code == 429
    assert ratelimit.count(ratelimit.LOGIN_PER_ACCOUNT, "alice") == 0, "its failures lock only that browser"


def test_code_lockout_counts_backup_codes_and_names_the_wait(client, user, password, shrink, settings):
    settings.OTP_TOTP_THROTTLE_FACTOR = 0
    account = shrink("OTP_PER_ACCOUNT")
    device = totp_device(user)
    password_step(client, "alice", password)
    for _ in range(account.limit):
        assert code_step(client, "wrong-backup").status_code == 200
    response = code_step(client, totp_code(device))
    assert response.status_code == 429 and int(response["Retry-After"]) > 0
    assert b"Try again in " in response.content and logged_in_user_id(client) is None
    assert lockouts(account.scope) == 1


# --- the first-run set-up link -----------------------------------------------------------------

def test_wrong_setup_links_are_limited_per_address(client, shrink):
    address = shrink("SETUP_LINK_PER_ADDRESS")
    _, raw = services.first_run_token_create()
    for i in range(address.limit):
        assert client.get(f"/setup/guess{i}").status_code == 404
    response = client.get(f"/setup/{raw}")
    assert response.status_code == 429 and int(response["Retry-After"]) > 0
    assert b'id="rate-limited"' in response.content and b"Try again in " in response.content
    assert lockouts(address.scope) == 1
    assert Client(REMOTE_ADDR="10.0.0.9").get(f"/setup/{raw}").status_code == 200, "another address works"


# --- API bearer tokens -------------------------------------------------------------------------

@pytest.fixture
def agent_owner(django_user_model):
    """Without a password (hashing one costs a second on a busy machine): tokens need none."""
    return django_user_model.objects.create(username="owner")


def _bearer(raw: str, address: str = "127.0.0.1") -> HttpResponse:
    return Client(REMOTE_ADDR=address).get("/api/devices", HTTP_AUTHORIZATION=f"Bearer {raw}")


def test_invalid_api_tokens_are_limited_per_address(agent_owner, shrink):
    address = shrink("API_TOKEN_PER_ADDRESS")
    _, raw = services.api_token_create(user=agent_owner, name="agent")
    assert _bearer(raw).status_code == 200
    for i in range(address.limit):
        assert _bearer(f"ai1_guess{i}").status_code in (401, 403)
    refused = _bearer(raw)  # while limited even the right token is refused: a guess could be right
    assert refused.status_code == 429 and int(refused["Retry-After"]) > 0
    body = refused.json()
    assert body["error"] == "rate_limited" and body["retry_after"] > 0 and "Try again in " in body["detail"]
    assert lockouts(address.scope) == 1
    assert _bearer(raw, "10.0.0.9").status_code == 200, "another address is not affected"


def test_a_revoked_token_is_not_counted_as_a_guess(agent_owner, shrink):
    address = shrink("API_TOKEN_PER_ADDRESS")
    token, raw = services.api_token_create(user=agent_owner, name="old agent")
    services.api_token_revoke(user=agent_owner, token_id=token.pk)
    for _ in range(address.limit + 2):
        assert _bearer(raw).status_code in (401, 403)
    assert ratelimit.count(address, "127.0.0.1") == 0
