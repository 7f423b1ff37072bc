"""Django's Redis cache with one client, and so one connection pool, per process.

Django makes a cache instance per async context (``CacheHandler`` keeps them in a context-local), and the
stock ``RedisCache`` builds a new client with a new pool for each: every tunnel's database call opened a
new connection to Redis, its handshake and health check included (15% of daphne's CPU in a storm of
2,000 reconnects, for the rate limiter's one read). redis-py's pool is thread-safe, so all share one.
"""

from __future__ import annotations

import threading
from typing import Any

from django.core.cache.backends.redis import RedisCache, RedisCacheClient
from django.utils.functional import cached_property

_clients: dict[tuple[Any, ...], RedisCacheClient] = {}
_clients_lock = threading.Lock()


class SharedRedisCache(RedisCache):
    @cached_property
    def _cache(self) -> RedisCacheClient:
        key = (self._class, tuple(self._servers), tuple(sorted((k, repr(v)) for k, v in self._options.items())))
        with _clients_lock:
            client = _clients.get(key)
            if client is None:
                client = _clients[key] = self._class(self._servers, **self._options)
        return client
