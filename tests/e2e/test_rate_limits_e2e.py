"""Two daphne processes on PostgreSQL + Redis count guesses into one limit: wrong guesses spread over both
processes reach it together, and then the next attempt is refused on either (issue 12)."""

from __future__ import annotations

import httpx
import pytest
from django.conf import settings

from ai1net.accounts import ratelimit, services
from ai1net.accounts.models import AuditEntry
from tests.e2e_support import Daphne

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.redis,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not settings.REDIS_URL, reason="needs REDIS_URL (the scaled-out configuration)"),
]


def _login(client: httpx.Client, username: str, password: str) -> httpx.Response:
    client.get("/accounts/login/").raise_for_status()
    return client.post("/accounts/login/", data={
        "username": username, "password": password, "csrfmiddlewaretoken": client.cookies["csrftoken"]})


def _devices(server: Daphne, token: str) -> int:
    return httpx.get(f"{server.url}/api/devices", headers={"Authorization": f"Bearer {token}"}, timeout=15).status_code


def test_guesses_spread_over_two_daphne_processes_hit_one_limit(tmp_path, user, password):
    a = Daphne(tmp_path, name="daphne-a")
    b = Daphne(tmp_path, name="daphne-b")
    try:
        # Passwords of one account: half the limit on each process, then the right password is refused on both.
        account = ratelimit.LOGIN_PER_ACCOUNT.limit
        with httpx.Client(base_url=a.url, timeout=15) as on_a, httpx.Client(base_url=b.url, timeout=15) as on_b:
            for i in range(account):
                response = _login(on_a if i % 2 == 0 else on_b, user.username, "wrong")
                assert response.status_code == 200, f"failure {i + 1} of {account} must still be counted, not refused"
            for client in (on_a, on_b):
                refused = _login(client, user.username, password)
                assert refused.status_code == 429 and int(refused.headers["Retry-After"]) > 0
        assert AuditEntry.objects.filter(action="security.rate_limited",
                                         data__scope=ratelimit.LOGIN_PER_ACCOUNT.scope).count() == 1

        # Bearer tokens from one address: the same, per address.
        _, token = services.api_token_create(user=user, name="agent")
        assert _devices(a, token) == 200 and _devices(b, token) == 200
        address = ratelimit.API_TOKEN_PER_ADDRESS.limit
        for i in range(address):
            assert _devices(a if i % 2 == 0 else b, f"ai1_guess{i}") in (401, 403), f"guess {i + 1} of {address}"
        assert _devices(a, token) == 429 and _devices(b, token) == 429
        assert AuditEntry.objects.filter(action="security.rate_limited",
                                         data__scope=ratelimit.API_TOKEN_PER_ADDRESS.scope).count() == 1
    finally:
        b.stop()
        a.stop()
