"""People-facing access to the devices pages, API and socket: logged in, and two-factor satisfied.

OTPMiddleware resolves ``request.user.is_verified()`` for HTTP; WebSockets bypass it, so the socket
uses ``otp_session_ok`` on its scope's session.
"""

from __future__ import annotations

from typing import Any

from rest_framework.permissions import BasePermission

from ai1net.accounts.selectors import otp_session_ok, user_needs_otp


def http_otp_satisfied(request: Any) -> bool:
    user = request.user
    if not getattr(user, "is_authenticated", False):
        return False
    if not user_needs_otp(user):
        return True
    return bool(getattr(user, "is_verified", lambda: False)())


def socket_otp_satisfied(user: Any, session: Any) -> bool:
    return otp_session_ok(user, session)


class OtpSatisfied(BasePermission):
    message = "Verify your sign-in with your one-time code first."

    def has_permission(self, request: Any, view: Any) -> bool:
        return http_otp_satisfied(request)
