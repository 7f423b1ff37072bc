"""Failure counters in Django's cache (LocMem on the embedded default, Redis when scaled out).

``cache.add`` + ``cache.incr`` are atomic on both backends, so concurrent attempts are all counted
and every daphne process sees the same numbers when the cache is Redis.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from django.core.cache import cache


@dataclass(frozen=True)
class Limit:
    scope: str
    limit: int
    window: int  # seconds, counted from the first failure


LOGIN_PER_ACCOUNT = Limit("login.account", 5, 15 * 60)
LOGIN_PER_ADDRESS = Limit("login.address", 20, 15 * 60)
OTP_PER_ACCOUNT = Limit("otp.account", 5, 15 * 60)
OTP_PER_ADDRESS = Limit("otp.address", 20, 15 * 60)


def _key(limit: Limit, value: str) -> str:
    digest = hashlib.sha256(value.strip().lower().encode()).hexdigest()[:32]
    return f"rl:{limit.scope}:{digest}"


def count(limit: Limit, value: str) -> int:
    return int(cache.get(_key(limit, value)) or 0)


def is_limited(*pairs: tuple[Limit, str]) -> bool:
    return any(value and count(limit, value) >= limit.limit for limit, value in pairs)


def hit(*pairs: tuple[Limit, str]) -> None:
    for limit, value in pairs:
        if not value:
            continue
        key = _key(limit, value)
        if not cache.add(key, 1, timeout=limit.window):
            try:
                cache.incr(key)
            except ValueError:  # expired between add and incr
                cache.add(key, 1, timeout=limit.window)


def reset(*pairs: tuple[Limit, str]) -> None:
    for limit, value in pairs:
        if value:
            cache.delete(_key(limit, value))
