"""Who may open a browser WebSocket. WebSockets bypass OTPMiddleware, so verification is checked here."""

from __future__ import annotations

from typing import Any

from django_otp import DEVICE_ID_SESSION_KEY, user_has_device
from django_otp.models import Device as OtpDevice


def otp_satisfied(user: Any, session: Any) -> bool:
    """True when the user has no confirmed OTP device, or this session was verified with one of theirs."""
    if not user_has_device(user, confirmed=True):
        return True
    persistent_id = session.get(DEVICE_ID_SESSION_KEY) if session is not None else None
    if not persistent_id:
        return False
    if persistent_id.count(".") > 1:  # legacy full import path, as django_otp normalises it
        parts = persistent_id.split(".")
        persistent_id = ".".join((parts[-3], parts[-1]))
    device = OtpDevice.from_persistent_id(persistent_id)
    return device is not None and device.user_id == user.pk and device.confirmed


def http_otp_satisfied(request: Any) -> bool:
    """The same rule for HTTP, where OTPMiddleware has already resolved ``user.otp_device``."""
    user = request.user
    if not user_has_device(user, confirmed=True):
        return True
    return bool(getattr(user, "is_verified", lambda: False)())
