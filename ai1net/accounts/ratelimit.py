"""Failure counters for every secret-guessing surface, in Django's cache (LocMem on the embedded
default, Redis when scaled out, so every daphne process counts into the same numbers).

A ``Limit`` counts failures of one surface for one key (an account or an address) in a window that
starts with the first failure; refused attempts are not counted, so a lockout ends at most one
window after it began, whatever an attacker keeps sending. ``cache.add`` then ``cache.incr`` (Redis
INCR) are atomic, so concurrent failures are all counted and exactly one of them reaches the limit:
that one writes the audit entry, once per lockout.

Callers: ``check(...)`` before looking at the secret (raises ``RateLimited`` naming the wait),
``fail(...)`` when the secret was wrong, ``reset(...)`` after a success where that makes sense.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass

from django.core.cache import cache

# The module, not its names: DRF's settings import the authentication (and so this) inside ai1net.exceptions.
from ai1net import exceptions


@dataclass(frozen=True)
class Limit:
    scope: str
    limit: int
    window: int  # seconds, counted from the first failure


MINUTES = 60
# Password and two-factor codes (TOTP or backup code) at login.
LOGIN_PER_ACCOUNT = Limit("login.account", 5, 15 * MINUTES)
LOGIN_PER_ADDRESS = Limit("login.address", 20, 15 * MINUTES)
LOGIN_PER_KNOWN_BROWSER = Limit("login.browser", 5, 15 * MINUTES)  # instead of the account's, see the login view
OTP_PER_ACCOUNT = Limit("otp.account", 5, 15 * MINUTES)
OTP_PER_ADDRESS = Limit("otp.address", 20, 15 * MINUTES)
# The first-run set-up link (/setup/<token>): no account exists yet.
SETUP_LINK_PER_ADDRESS = Limit("setup.address", 10, 15 * MINUTES)
# Bearer secrets (256-bit: these limits are defence in depth and stop noisy scanners).
API_TOKEN_PER_ADDRESS = Limit("api_token.address", 30, 15 * MINUTES)
DEVICE_TOKEN_PER_ADDRESS = Limit("device_token.address", 30, 15 * MINUTES)
DEVICE_CODE_PER_ADDRESS = Limit("device_code.address", 30, 15 * MINUTES)
# Pairing: starting a pairing (every request counts) and typing a user code (34.5 bits: the real target).
PAIRING_CREATE_PER_ADDRESS = Limit("pairing.create.address", 30, 10 * MINUTES)
PAIRING_CODE_PER_ACCOUNT = Limit("pairing.code.account", 10, 15 * MINUTES)
PAIRING_CODE_PER_ADDRESS = Limit("pairing.code.address", 30, 15 * MINUTES)

Pair = tuple[Limit, object]  # (limit, key value: a user pk, a username or an address; empty = not counted)


def _key(limit: Limit, value: object) -> str:
    digest = hashlib.sha256(str(value).strip().lower().encode()).hexdigest()[:32]
    return f"rl:{limit.scope}:{digest}"


def _active(pairs: tuple[Pair, ...]) -> list[tuple[Limit, str]]:
    return [(limit, _key(limit, value)) for limit, value in pairs if value not in (None, "")]


def count(limit: Limit, value: object) -> int:
    return int(cache.get(_key(limit, value)) or 0)


def retry_after(*pairs: Pair) -> int:
    """Seconds until every reached limit among ``pairs`` has ended; 0 when none is reached."""
    active = _active(pairs)
    keys = [key for _, key in active] + [f"{key}:until" for _, key in active]
    stored = cache.get_many(keys)
    now = time.time()
    wait = 0.0
    for limit, key in active:
        if int(stored.get(key) or 0) < limit.limit:
            continue
        until = stored.get(f"{key}:until")
        if until is None:  # a counter without its window's end may have lost its expiry: give it one
            until = now + limit.window
            _open_window(limit, key, until)
        elif float(until) <= now:  # its window is over yet it is still here: it lost its expiry
            cache.delete(key)
            continue
        wait = max(wait, float(until) - now, 1.0)
    return math.ceil(wait)


def is_limited(*pairs: Pair) -> bool:
    return retry_after(*pairs) > 0


def wait_text(seconds: int) -> str:
    if seconds < 90:
        return f"{seconds} second{'s' if seconds != 1 else ''}"
    return f"{math.ceil(seconds / 60)} minutes"


def refusal(*pairs: Pair, what: str = "Too many failed attempts.") -> exceptions.RateLimited | None:
    """The 429 to answer with while a limit among ``pairs`` is reached (``retry_after`` in its body)."""
    wait = retry_after(*pairs)
    if not wait:
        return None
    return exceptions.RateLimited(f"{what} Try again in {wait_text(wait)}.", extra={"retry_after": wait})


def check(*pairs: Pair, what: str = "Too many failed attempts.") -> None:
    if (refused := refusal(*pairs, what=what)) is not None:
        raise refused


def _open_window(limit: Limit, key: str, until: float) -> None:
    cache.set(f"{key}:until", until, timeout=limit.window)
    cache.touch(key, limit.window)


def _incr(limit: Limit, key: str) -> int:
    for _ in range(3):  # a counter that expires between add and incr is added again
        if cache.add(key, 1, timeout=limit.window):  # the first failure opens the window
            cache.set(f"{key}:until", time.time() + limit.window, timeout=limit.window)
            return 1
        try:
            value = int(cache.incr(key))
        except ValueError:
            continue
        if value == 1:
            # Django's Redis incr is EXISTS then INCR: a counter that expired in between was made
            # again by INCR without an expiry, which would lock this key out for good.
            _open_window(limit, key, time.time() + limit.window)
        return value
    return 0


def fail(*pairs: Pair, ip: str | None = None, actor: object = None) -> list[Limit]:
    """Count one failure on each pair; returns the limits this failure reached (each audited once)."""
    reached = [(limit, value) for limit, value in pairs
               if value not in (None, "") and _incr(limit, _key(limit, value)) == limit.limit]
    if reached:
        # Imported here: services -> exceptions -> DRF settings -> authentication -> this module.
        from ai1net.accounts.services import audit_record

        for limit, value in reached:
            data = {"scope": limit.scope, "limit": limit.limit, "window_sec": limit.window}
            if limit.scope.endswith(".account"):
                data["account"] = str(value)
            audit_record(actor=actor if getattr(actor, "is_authenticated", False) else None,  # type: ignore[arg-type]
                         action="security.rate_limited", data=data,
                         ip=ip or (str(value) if limit.scope.endswith(".address") else None))
    return [limit for limit, _ in reached]


def reset(*pairs: Pair) -> None:
    for _, key in _active(pairs):
        cache.delete_many([key, f"{key}:until"])
