"""The Redis cache shares one client per process (ai1net.cache): a new one per async context opened a
new Redis connection for every tunnel's rate-limit read."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import sync_to_async
from django.core.cache import cache, caches

pytestmark = pytest.mark.redis


def test_every_context_uses_one_client_and_its_pool(settings):
    if not settings.REDIS_URL:
        pytest.skip("needs REDIS_URL (the scaled-out configuration)")

    def client_in_a_new_context():
        # A fresh cache instance, as Django makes one per async context.
        return caches.create_connection("default")._cache  # the client itself: kept alive, ids not reused

    async def many():
        return await asyncio.gather(*[sync_to_async(client_in_a_new_context, thread_sensitive=False)()
                                      for _ in range(5)])

    clients = [*asyncio.run(many()), cache._cache]
    assert all(client is clients[0] for client in clients)
    cache.set("shared-client-probe", 1, 5)
    assert caches.create_connection("default").get("shared-client-probe") == 1
