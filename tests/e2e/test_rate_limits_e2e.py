"""Two daphne processes on PostgreSQL + Redis count guesses into one limit: wrong guesses spread over both
processes reach it together, and then the next attempt is refused on either (issue 12)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

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


@pytest.fixture
def user(django_user_model):
    """Without a password: nobody logs in here, and hashing one costs a second on a busy machine."""
    return django_user_model.objects.create(username="alice")


def _devices(server: Daphne, token: str) -> int:
    return httpx.get(f"{server.url}/api/devices", headers={"Authorization": f"Bearer {token}"}, timeout=15).status_code


def test_guesses_spread_over_two_daphne_processes_hit_one_limit(tmp_path, user):
    """Bearer-token guesses from one address, alternated over the two processes (each sees half of them):
    the guess that reaches the limit is still answered 401/403; the next attempt, even with the right
    token, is refused with 429 on either process. (Every surface counts through the same module.)"""
    with ThreadPoolExecutor(2) as pool:  # both start (and later stop) at once: half the wait
        starting = [pool.submit(Daphne, tmp_path, name=name) for name in ("daphne-a", "daphne-b")]
    if any(future.exception() for future in starting):
        for future in starting:
            if future.exception() is None:
                future.result().stop()
        raise next(future.exception() for future in starting if future.exception())
    a, b = (future.result() for future in starting)
    try:
        _, token = services.api_token_create(user=user, name="agent")
        assert _devices(a, token) == 200 and _devices(b, token) == 200
        address = ratelimit.API_TOKEN_PER_ADDRESS.limit
        for i in range(address):
            assert _devices(a if i % 2 == 0 else b, f"ai1_guess{i}") in (401, 403), f"guess {i + 1} of {address}"
        for server in (a, b):
            refused = httpx.get(f"{server.url}/api/devices", headers={"Authorization": f"Bearer {token}"}, timeout=15)
            assert refused.status_code == 429 and int(refused.headers["Retry-After"]) > 0, refused.text
        assert AuditEntry.objects.filter(action="security.rate_limited",
                                         data__scope=ratelimit.API_TOKEN_PER_ADDRESS.scope).count() == 1
    finally:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(Daphne.stop, [a, b]))
