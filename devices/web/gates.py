"""The four gates of device web, in order, in one function used by the HTTP and WebSocket paths.

1. the platform switch (``AI1NET_DEVICE_WEB``): off -> 503 ``device_web_off`` (an emergency stop, said
   plainly, rather than pretending nothing is there); and, with ``AI1NET_DEVICE_WEB_HOST`` set, the
   request came to that host (elsewhere -> ``DeviceWebElsewhere``: HTTP redirects there, a WebSocket is
   refused; see ai1net.hosts);
2. a logged-in user (OTP-verified when they have a confirmed OTP device; no session -> 401, pages
   redirect to the login) who owns the device and has device web on (someone else's or unknown
   device, or the user's switch off -> 404);
3. the device active (revoked -> 403) and a desktop bridge (a probe -> 403);
4. the device online over its WebSocket tunnel (offline, or long polling -> 503) with that port
   declared in its hello (else 502).

Per request this is one query in the common case: the device, scoped to its owner, with whether the
owner has two-factor (``_device_row``); the session's OTP verification is read only for users who have
it, and a device that is not found falls back to the plain checks for the exact refusal.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db.models import Exists, OuterRef
from django_otp.plugins.otp_totp.models import TOTPDevice

from ai1net import hosts
from ai1net.accounts.models import BackupCodeDevice
from ai1net.accounts.selectors import device_web_active, otp_session_ok
from ai1net.exceptions import ApplicationError, Forbidden, NotAuthenticated, NotFound, Unavailable
from clients import protocol
from devices.errors import DeviceOffline
from devices.models import Device
from devices.selectors import access_device


class DeviceWebOff(Unavailable):
    code = "device_web_off"
    default_detail = "Device web is switched off on this platform for now."


class DeviceWebElsewhere(ApplicationError):
    """Device web has a host of its own and this request came to the platform's: HTTP answers 302 to
    the same path there (devices.web.streams.error_response)."""

    code = "device_web_elsewhere"
    status = 302
    default_detail = "Device web is served on its own host."


class PortNotExposed(ApplicationError):
    code = "port_not_exposed"
    status = 502
    default_detail = "The device does not expose this port."


def check_device_web(user: Any, device_id: Any, port: Any, *, session: Any = None, host: str | None = None) -> Device:
    """The device the user may reach on ``port``, or the ApplicationError that says why not.

    ``session`` is the user's session (for the OTP rule); pass None only where OTP is checked already.
    ``host`` is the request's Host header (checked only when device web has a host of its own).
    """
    if not settings.DEVICE_WEB_ENABLED:
        raise DeviceWebOff()
    if hosts.separate() and not hosts.is_device_web_host(host):
        raise DeviceWebElsewhere()
    if user is None or not getattr(user, "is_authenticated", False):
        raise NotAuthenticated("Log in to reach your devices.")
    device = _device_row(user, device_id)
    needs_otp = device is None or device.owner_needs_otp  # not found: otp_session_ok reads it itself
    if session is not None and needs_otp and not otp_session_ok(user, session):
        raise NotAuthenticated("Enter your two-factor code first.", code="otp_required")
    if not device_web_active(user):
        raise NotFound("No such device.")
    if device is None:
        device = access_device(user=user, device_id=device_id)  # raises the 404 access_device gives
    if device.status != Device.Status.ACTIVE:
        raise Forbidden(f"{device.name} was revoked; pair it again.", code="device_revoked")
    if device.kind != Device.Kind.BRIDGE:
        raise Forbidden(f"{device.name} is a probe; device web reaches desktop bridges only.", code="not_a_bridge")
    if not device.is_online:
        raise DeviceOffline(f"{device.name} is offline: its bridge is not connected.")
    if device.is_long_polling:  # streams need the WebSocket tunnel; the HTTP fallback carries none
        raise DeviceOffline(f"{device.name} is connected over the HTTP fallback only; device web needs its "
                            "WebSocket tunnel.", code="device_long_polling")
    number = _port(port)
    if number is None or number not in (device.ports or []):
        raise PortNotExposed(
            f"{device.name} does not expose port {port}. Start its bridge with "
            f"`ai1net-bridge run --expose {port}` (ports {protocol.WEB_PORT_MIN}-{protocol.WEB_PORT_MAX})."
        )
    return device


def _device_row(user: Any, device_id: Any) -> Device | None:
    """The user's device ``device_id`` annotated with ``owner_needs_otp`` (the rule of
    ai1net.accounts.selectors.user_needs_otp), in one query; None when there is no such device of theirs."""
    totp = TOTPDevice.objects.filter(user=OuterRef("owner_id"), confirmed=True)
    backup = BackupCodeDevice.objects.filter(user=OuterRef("owner_id"), confirmed=True, codes__isnull=False)
    try:
        return (Device.objects.filter(owner=user, pk=device_id)
                .annotate(owner_needs_otp=Exists(totp) | Exists(backup)).first())
    except (ValueError, TypeError, ValidationError):
        return None


def _port(value: Any) -> int | None:
    text = str(value)
    if not text.isdigit() or len(text) > 5:
        return None
    number = int(text)
    return number if protocol.web_port_allowed(number) else None
