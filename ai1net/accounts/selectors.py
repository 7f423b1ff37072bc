"""Reads for accounts: effective switches (user switch AND the platform-wide stop), audit verification."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection
from django_otp import DEVICE_ID_SESSION_KEY
from django_otp.models import Device
from django_otp.plugins.otp_totp.models import TOTPDevice

from ai1net.accounts.models import ApiToken, AuditEntry, BackupCode, BackupCodeDevice, User


def mobile_reply_active(user: User) -> bool:
    """Mobile reply is on for this user: the operators' stop is not in force and the user's switch is on."""
    return bool(settings.MOBILE_REPLY_ENABLED and getattr(user, "is_authenticated", False)
                and user.is_active and user.mobile_reply_enabled)


def device_web_active(user: User) -> bool:
    return bool(settings.DEVICE_WEB_ENABLED and getattr(user, "is_authenticated", False)
                and user.is_active and user.device_web_enabled)


def global_stops() -> list[str]:
    """Human-readable names of the platform-wide stops now in force (for banners)."""
    stops = []
    if not settings.MOBILE_REPLY_ENABLED:
        stops.append("mobile reply (AI1NET_MOBILE_REPLY=0)")
    if not settings.DEVICE_WEB_ENABLED:
        stops.append("device web (AI1NET_DEVICE_WEB=0)")
    return stops


def api_token_issued(*, raw: str) -> bool:
    """The secret is a token we issued (revoked, or its user inactive): a stale agent, not a guess."""
    from ai1net.accounts.services import hash_secret  # services -> exceptions -> DRF -> authentication

    return ApiToken.objects.filter(token_hash=hash_secret(raw)).exists()


def totp_confirmed(user: User) -> TOTPDevice | None:
    return TOTPDevice.objects.filter(user=user, confirmed=True).first()


def totp_pending(user: User) -> TOTPDevice | None:
    return TOTPDevice.objects.filter(user=user, confirmed=False).order_by("-id").first()


def backup_codes_remaining(user: User) -> int:
    device = BackupCodeDevice.objects.filter(user=user).first()
    return device.remaining() if device else 0


def user_needs_otp(user: User) -> bool:
    """The user enrolled a second factor (a confirmed TOTP device or backup codes left).

    Every phone request asks this, so it is one statement written out once: Django compiling the same
    EXISTS pair cost about four times what the database took to answer it (bench/roundtrip.py)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {needs_otp_sql(connection.vendor, '%s')}", [True, user.pk, True, user.pk])
        row = cursor.fetchone()
    return bool(row and row[0])


# needs_otp_sql's parameters when ``user_id`` is a column of the outer query.
NEEDS_OTP_PARAMS_FOR_COLUMN = (True, True)


@functools.cache
def needs_otp_sql(vendor: str, user_id: str) -> str:
    """``user_needs_otp`` as an SQL expression about the user whose id is ``user_id`` (a placeholder, or a
    column of an outer query, which must not use the aliases otp_b and otp_c); its parameters: True, then the id
    when it is a placeholder, twice over (for a column: NEEDS_OTP_PARAMS_FOR_COLUMN)."""
    qn = connection.ops.quote_name
    totp, device, code = TOTPDevice._meta, BackupCodeDevice._meta, BackupCode._meta
    # Names from the models' _meta and the caller's written column, values as parameters.
    return (
        f"EXISTS (SELECT 1 FROM {qn(totp.db_table)} WHERE {qn(totp.get_field('confirmed').column)} = %s"  # noqa: S608
        f" AND {qn(totp.get_field('user').column)} = {user_id})"
        f" OR EXISTS (SELECT 1 FROM {qn(device.db_table)} otp_b JOIN {qn(code.db_table)} otp_c"
        f" ON otp_c.{qn(code.get_field('device').column)} = otp_b.{qn(device.pk.column)}"
        f" WHERE otp_b.{qn(device.get_field('confirmed').column)} = %s"
        f" AND otp_b.{qn(device.get_field('user').column)} = {user_id})"
    )


@dataclass(frozen=True)
class AuditBreak:
    entry_id: int
    reason: str


def audit_chain_verify() -> tuple[int, AuditBreak | None]:
    """Walk the chain oldest first; return (entries checked, first break or None)."""
    from ai1net.accounts.services import audit_hash

    prev = AuditEntry.GENESIS
    checked = 0
    for entry in AuditEntry.objects.order_by("id").iterator(chunk_size=2000):
        if entry.prev_hash != prev:
            return checked, AuditBreak(entry.pk, "prev_hash does not match the previous entry (a row was removed "
                                                 "or altered)")
        expected = audit_hash(prev_hash=entry.prev_hash, created_at=entry.created_at, action=entry.action,
                              actor_label=entry.actor_label, subject_label=entry.subject_label, data=entry.data,
                              ip=entry.ip)
        if entry.hash != expected:
            return checked, AuditBreak(entry.pk, "content does not match its hash (the row was altered)")
        prev = entry.hash
        checked += 1
    return checked, None


def otp_session_ok(user: User, session: Any) -> bool:
    """For code OTPMiddleware does not cover (WebSocket consumers: ``scope["user"]``, ``scope["session"]``).

    True when the user has no two-factor, or this session was verified with one of the user's devices.
    Synchronous (ORM): call it through ``database_sync_to_async`` from a consumer.
    """
    if not getattr(user, "is_authenticated", False):
        return False
    if not user_needs_otp(user):
        return True
    persistent_id = session.get(DEVICE_ID_SESSION_KEY) if session is not None else None
    device = Device.from_persistent_id(persistent_id) if persistent_id else None
    return device is not None and device.user_id == user.pk
