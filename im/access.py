"""Who may use the people-facing pages and sockets. WebSockets bypass OTPMiddleware, so the
accounts rule (``otp_session_ok``) is applied here; HTTP uses what OTPMiddleware resolved."""

from __future__ import annotations

from typing import Any

from ai1net.accounts.selectors import otp_session_ok, user_needs_otp


def otp_satisfied(user: Any, session: Any) -> bool:
    """True when the user has no two-factor, or this session was verified with one of their devices."""
    return otp_session_ok(user, session)


def http_otp_satisfied(request: Any) -> bool:
    """For an HTTP request, at its start: the session's user was read with whether they need a second
    factor (``User.needs_otp_at_load``), so that is not asked again."""
    user = request.user
    needs_otp = getattr(user, "needs_otp_at_load", None)
    if not (user_needs_otp(user) if needs_otp is None else needs_otp):
        return True
    return bool(getattr(user, "is_verified", lambda: False)())
