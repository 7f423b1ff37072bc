"""Writes for accounts: API tokens, two-factor devices, switches, the audit log, the first-run link."""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import json
import secrets
from base64 import b32encode
from collections.abc import Callable
from typing import Any, Literal

from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone
from django_otp.plugins.otp_totp.models import TOTPDevice

from ai1net import sql
from ai1net.accounts.models import (
    ApiToken,
    AuditEntry,
    AuditHead,
    BackupCode,
    BackupCodeDevice,
    FirstRunToken,
    User,
)
from ai1net.accounts.signals import switch_changed
from ai1net.exceptions import Conflict, Gone, NotFound, ValidationFailed

API_TOKEN_PREFIX = "ai1_"
BACKUP_CODE_COUNT = 10
FIRST_RUN_TTL = dt.timedelta(hours=1)
SWITCHES: dict[str, str] = {"mobile_reply": "mobile_reply_enabled", "device_web": "device_web_enabled"}
Switch = Literal["mobile_reply", "device_web"]
_AUDIT_HEAD_ID = 1  # the one row of AuditHead


def hash_secret(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


# --- audit log ---------------------------------------------------------------------------------


def _label(user: User | None) -> str:
    return f"{user.get_username()} (#{user.pk})" if user is not None else ""


def _audit_stamp(created_at: dt.datetime) -> str:
    return created_at.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def audit_hash(*, prev_hash: str, created_at: dt.datetime, action: str, actor_label: str, subject_label: str,
               data: dict[str, Any], ip: str) -> str:
    """SHA-256 over canonical JSON of the entry's fields plus the previous entry's hash."""
    stamp = _audit_stamp(created_at)
    canonical = json.dumps(
        {"prev": prev_hash, "at": stamp, "action": action, "actor": actor_label, "subject": subject_label,
         "data": data, "ip": ip},
        sort_keys=True, separators=(",", ":"), ensure_ascii=False,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def audit_hash_around(*, created_at: dt.datetime, action: str, actor_label: str, subject_label: str,
                      data: dict[str, Any], ip: str) -> tuple[str, str]:
    """``audit_hash``'s canonical text before and after the previous hash: for a hex ``prev_hash``,
    ``audit_hash(...) == sha256(before + prev_hash + after)``, so the database can hash an entry onto a
    head it has just locked. The keys sort as action, actor, at, data, ip, prev, subject."""
    stamp = _audit_stamp(created_at)
    up_to_prev = json.dumps({"at": stamp, "action": action, "actor": actor_label, "data": data, "ip": ip},
                            sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    subject = json.dumps(subject_label, ensure_ascii=False)
    return f'{up_to_prev[:-1]},"prev":"', f'","subject":{subject}}}'


def audit_record(*, actor: User | None, action: str, subject: User | None = None, data: dict[str, Any],
                 ip: str | None = None) -> AuditEntry:
    """Append one entry to the hash-chained audit log. Safe to call inside the caller's transaction.

    Appends are serialised so the chain never forks: an append takes the chain head's row lock
    (``AuditHead``) with the statement that reads the newest hash. On PostgreSQL that one statement also
    hashes the entry onto it (``sha256`` in the database, over ``audit_hash_around``), inserts the entry
    and moves the head; elsewhere the lock and read are one statement and the insert and move two more.
    The lock is held until the caller's transaction commits, so callers append last, just before they
    commit. ``prev_hash`` is unique as well, should anything else ever write the table. No savepoint of
    its own: an error fails the caller's write too, which is what an audited write wants.
    """
    # Round-trip through JSON so the hash is computed over exactly what the database will return.
    data = json.loads(json.dumps(data, default=str))
    fields = {
        "created_at": timezone.now(), "action": action, "actor_label": _label(actor),
        "subject_label": _label(subject), "data": data, "ip": ip or "",
    }
    entry = AuditEntry(actor=actor, subject=subject, **fields)
    conn = transaction.get_connection()  # looked up once (each use of the ``connection`` proxy looks it up)

    def appended(row: tuple[int, str, str] | None) -> None:
        if row is None:  # no head yet, or not PostgreSQL
            entry.prev_hash = _audit_head_lock(conn)
            entry.hash = audit_hash(prev_hash=entry.prev_hash, **fields)
            entry.pk = _audit_append(conn, entry)
        else:
            entry.pk, entry.prev_hash, entry.hash = row
        entry._state.adding = False
        entry._state.db = conn.alias

    with transaction.atomic(savepoint=False):
        if conn.vendor == "postgresql":
            # In a pipeline (``sql.pipelined``) the entry has its id and hashes when that ends.
            _audit_append_here(conn, entry, *audit_hash_around(**fields), then=appended)
        else:
            appended(None)
    return entry


def _audit_head_lock(conn: Any) -> str:
    """Lock the chain head until commit and return the newest hash (seeding the head when it is
    missing: the first append, or after the tables were flushed)."""
    qn, head = conn.ops.quote_name, AuditHead._meta
    # Names from the model's _meta, values as parameters.
    lock = (f"UPDATE {qn(head.db_table)} SET {qn('hash')} = {qn('hash')} "  # noqa: S608
            f"WHERE {qn(head.pk.column)} = %s RETURNING {qn('hash')}")
    with conn.cursor() as cursor:
        cursor.execute(lock, [_AUDIT_HEAD_ID])
        row = cursor.fetchone()
        if row is None:
            newest = AuditEntry.objects.order_by("-id").values_list("hash", flat=True).first()
            cursor.execute(f"INSERT INTO {qn(head.db_table)} ({qn(head.pk.column)}, {qn('hash')}, "  # noqa: S608
                           f"{qn('prev_hash')}) VALUES (%s, %s, '') ON CONFLICT ({qn(head.pk.column)}) DO NOTHING",
                           [_AUDIT_HEAD_ID, newest or AuditEntry.GENESIS])
            cursor.execute(lock, [_AUDIT_HEAD_ID])  # a concurrent seeder's row: wait for its commit
            row = cursor.fetchone()
    return row[0]


def _audit_append_here(conn: Any, entry: AuditEntry, before: str, after: str,
                       then: Callable[[tuple[int, str, str] | None], None]) -> None:
    """PostgreSQL: lock the head, hash ``entry`` onto it, insert it and move the head, in one statement.
    Hands ``then`` (id, prev_hash, hash), or None when there is no head row yet (``_audit_head_lock`` seeds
    it): at once, or in a pipeline (``sql.pipelined``) when that ends.
    The UPDATE's SET reads the row as it was, so ``prev_hash = hash`` keeps the hash it replaces; under
    a concurrent append it waits for that commit and hashes onto the head as committed."""
    statement, own = _append_here_sql(conn.vendor)
    values = [f.get_db_prep_save(getattr(entry, f.attname), conn) for f in own]
    sql.run(conn, statement, [before, after, _AUDIT_HEAD_ID, *values],
            lambda row: then(None if row is None else (int(row[0]), row[1], row[2])))


@functools.cache
def _append_here_sql(vendor: str) -> tuple[str, list[Any]]:
    """``_audit_append_here``'s statement, and the entry's own fields it takes as parameters (in order)."""
    qn, meta, head = connection.ops.quote_name, AuditEntry._meta, AuditHead._meta
    own = [f for f in meta.concrete_fields if not f.primary_key and f.name not in ("prev_hash", "hash")]
    columns = ", ".join(qn(f.column) for f in [*own, meta.get_field("prev_hash"), meta.get_field("hash")])
    # Names from the models' _meta, values as parameters.
    statement = (
        f"WITH moved AS (UPDATE {qn(head.db_table)} SET {qn('prev_hash')} = {qn('hash')}, "  # noqa: S608
        f"{qn('hash')} = encode(sha256(convert_to(%s::text || {qn('hash')} || %s::text, 'UTF8')), 'hex') "
        f"WHERE {qn(head.pk.column)} = %s RETURNING {qn('prev_hash')}, {qn('hash')}) "
        f"INSERT INTO {qn(meta.db_table)} ({columns}) "
        f"SELECT {', '.join(['%s'] * len(own))}, moved.{qn('prev_hash')}, moved.{qn('hash')} FROM moved "
        f"RETURNING {qn(meta.pk.column)}, {qn('prev_hash')}, {qn('hash')}")
    return statement, own


def _audit_append(conn: Any, entry: AuditEntry) -> int:
    """Insert ``entry`` (hashed already) and make its hash the head's; returns its id."""
    qn, meta, head = conn.ops.quote_name, AuditEntry._meta, AuditHead._meta
    fields = [f for f in meta.concrete_fields if not f.primary_key]
    values = [f.get_db_prep_save(getattr(entry, f.attname), conn) for f in fields]
    # Names from the models' _meta, values as parameters.
    insert = (f"INSERT INTO {qn(meta.db_table)} ({', '.join(qn(f.column) for f in fields)}) "  # noqa: S608
              f"VALUES ({', '.join(['%s'] * len(fields))}) RETURNING {qn(meta.pk.column)}")
    move = (f"UPDATE {qn(head.db_table)} SET {qn('prev_hash')} = %s, {qn('hash')} = %s "  # noqa: S608
            f"WHERE {qn(head.pk.column)} = %s")
    with conn.cursor() as cursor:
        if conn.features.can_return_columns_from_insert:
            cursor.execute(insert, values)
            entry_id = int(cursor.fetchone()[0])
        else:
            cursor.execute(insert.rsplit(" RETURNING ", 1)[0], values)
            entry_id = int(conn.ops.last_insert_id(cursor, meta.db_table, meta.pk.column))
        cursor.execute(move, [entry.prev_hash, entry.hash, _AUDIT_HEAD_ID])
    return entry_id


# --- operator switches -------------------------------------------------------------------------


def user_switch_set(*, actor: User | None, user: User, switch: Switch, enabled: bool, ip: str | None = None) -> bool:
    """Turn one of ``user``'s switches on or off; audited; ``switch_changed`` is sent after commit.

    Returns False (and records nothing) when the switch already had that value.
    """
    if switch not in SWITCHES:
        raise ValidationFailed(f"Unknown switch {switch!r}.", code="unknown_switch")
    field = SWITCHES[switch]
    enabled = bool(enabled)
    with transaction.atomic():
        locked = User.objects.select_for_update().get(pk=user.pk)
        old = getattr(locked, field)
        if old == enabled:
            setattr(user, field, enabled)
            return False
        User.objects.filter(pk=user.pk).update(**{field: enabled})
        setattr(user, field, enabled)
        audit_record(actor=actor, subject=user, action=f"accounts.switch.{switch}",
                     data={"switch": switch, "old": old, "new": enabled}, ip=ip)
        transaction.on_commit(
            lambda: switch_changed.send(sender=User, user=user, switch=switch, enabled=enabled)
        )
    return True


# --- API tokens --------------------------------------------------------------------------------


def api_token_create(*, user: User, name: str, ip: str | None = None) -> tuple[ApiToken, str]:
    raw = API_TOKEN_PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic():
        token = ApiToken.objects.create(user=user, name=name[:100] or "token", prefix=raw[:12],
                                        token_hash=hash_secret(raw))
        audit_record(actor=user, subject=user, action="accounts.api_token.created",
                     data={"token_id": token.pk, "name": token.name, "prefix": token.prefix}, ip=ip)
    return token, raw


# How stale a token's "last used" may be: an agent's burst of requests writes it once, not once each.
TOKEN_USE_RESOLUTION = dt.timedelta(minutes=1)


def api_token_authenticate(*, raw: str) -> ApiToken | None:
    """The live token (with its active user) whose secret this is. Two statements written once (``sql.one_by``:
    the token by its unique hash, the user by key): every agent's API request asks, and the one joined ORM
    read took 504 us where both take 55 (SQLite, a loop in one process on this machine)."""
    token = sql.one_by(ApiToken, token_hash=hash_secret(raw))
    if token is None or token.revoked_at is not None:
        return None
    user = sql.one_by(User, id=token.user_id)
    if user is None or not user.is_active:
        return None
    token.user = user
    now = timezone.now()
    if token.last_used_at is None or now - token.last_used_at >= TOKEN_USE_RESOLUTION:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    return token


def api_token_revoke(*, user: User, token_id: int, ip: str | None = None) -> None:
    with transaction.atomic():
        revoked = ApiToken.objects.filter(user=user, pk=token_id, revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        )
        if not revoked:
            raise NotFound("No such token.")
        audit_record(actor=user, subject=user, action="accounts.api_token.revoked", data={"token_id": token_id}, ip=ip)


# --- two-factor --------------------------------------------------------------------------------


def totp_secret_text(device: TOTPDevice) -> str:
    return b32encode(device.bin_key).decode()


def totp_enrolment_start(*, user: User) -> TOTPDevice:
    """A fresh unconfirmed TOTP device (replacing any earlier unconfirmed one)."""
    if TOTPDevice.objects.filter(user=user, confirmed=True).exists():
        raise Conflict("Two-factor is already set up. Remove it first.", code="otp_exists")
    with transaction.atomic():
        TOTPDevice.objects.filter(user=user, confirmed=False).delete()
        return TOTPDevice.objects.create(user=user, name="Authenticator app", confirmed=False)


def totp_enrolment_confirm(*, user: User, token: str, ip: str | None = None) -> tuple[TOTPDevice, list[str]]:
    """Confirm the pending device with a code from the app; returns it and fresh backup codes (shown once)."""
    with transaction.atomic():
        device = TOTPDevice.objects.select_for_update().filter(user=user, confirmed=False).order_by("-id").first()
        if device is None:
            raise NotFound("Start the set-up first.", code="no_pending_device")
        if not device.verify_token((token or "").strip()):
            raise ValidationFailed("That code is not right. Check the time on your phone and try again.",
                                   code="bad_code")
        device.confirmed = True
        device.save(update_fields=["confirmed"])
        _otp_epoch_bump(user)
        codes = _backup_codes_replace(user=user)
        audit_record(actor=user, subject=user, action="accounts.otp.enrolled", data={"device": device.persistent_id},
                     ip=ip)
    return device, codes


def _otp_epoch_bump(user: User) -> None:
    """Ends the user's other sessions (see ``User.otp_epoch``); the caller re-keys the current one."""
    User.objects.filter(pk=user.pk).update(otp_epoch=F("otp_epoch") + 1)
    user.otp_epoch = User.objects.values_list("otp_epoch", flat=True).get(pk=user.pk)


def otp_remove(*, user: User, ip: str | None = None) -> None:
    with transaction.atomic():
        TOTPDevice.objects.filter(user=user).delete()
        for device in BackupCodeDevice.objects.filter(user=user):
            device.codes.all().delete()
        BackupCodeDevice.objects.filter(user=user).delete()
        _otp_epoch_bump(user)
        audit_record(actor=user, subject=user, action="accounts.otp.removed", data={}, ip=ip)


def backup_code_normalise(raw: str) -> str:
    return "".join(ch for ch in (raw or "").lower() if ch.isalnum())


def _backup_codes_replace(*, user: User) -> list[str]:
    BackupCodeDevice.objects.filter(user=user).delete()
    device = BackupCodeDevice.objects.create(user=user, name="Backup codes", confirmed=True)
    alphabet = "abcdefghjkmnpqrstuvwxyz23456789"  # no look-alikes
    codes = ["".join(secrets.choice(alphabet) for _ in range(10)) for _ in range(BACKUP_CODE_COUNT)]
    BackupCode.objects.bulk_create([BackupCode(device=device, code_hash=hash_secret(code)) for code in codes])
    return [f"{code[:5]}-{code[5:]}" for code in codes]


def backup_codes_generate(*, user: User, ip: str | None = None) -> list[str]:
    """Replace the user's backup codes; returns the new ones (shown once, stored hashed)."""
    if not TOTPDevice.objects.filter(user=user, confirmed=True).exists():
        raise Conflict("Set up an authenticator app first.", code="no_otp")
    with transaction.atomic():
        codes = _backup_codes_replace(user=user)
        audit_record(actor=user, subject=user, action="accounts.backup_codes.generated",
                     data={"count": len(codes)}, ip=ip)
    return codes


# --- first run ---------------------------------------------------------------------------------


def first_run_token_create(*, ttl: dt.timedelta = FIRST_RUN_TTL) -> tuple[FirstRunToken, str] | None:
    """A one-time link secret for creating the first operator; None once any user exists."""
    if User.objects.exists():
        return None
    raw = secrets.token_urlsafe(32)
    now = timezone.now()
    with transaction.atomic():
        # Only the newest link works: each `make run` prints a fresh one.
        FirstRunToken.objects.filter(used_at__isnull=True, expires_at__gt=now).update(expires_at=now)
        token = FirstRunToken.objects.create(token_hash=hash_secret(raw), created_at=now, expires_at=now + ttl)
    return token, raw


def first_run_token_valid(*, raw: str) -> bool:
    return (
        not User.objects.exists()
        and FirstRunToken.objects.filter(token_hash=hash_secret(raw), used_at__isnull=True,
                                         expires_at__gt=timezone.now()).exists()
    )


def first_run_complete(*, raw: str, username: str, email: str, password: str, ip: str | None = None) -> User:
    """Burn the link (one conditional UPDATE decides) and create the first operator as a superuser."""
    with transaction.atomic():
        now = timezone.now()
        burned = FirstRunToken.objects.filter(
            token_hash=hash_secret(raw), used_at__isnull=True, expires_at__gt=now
        ).update(used_at=now)
        if not burned:
            raise Gone("This set-up link is used or expired. Run `make run` again for a new one.", code="link_gone")
        if User.objects.exists():
            raise Conflict("The first operator already exists.", code="already_set_up")
        user = User.objects.create_superuser(username=username, email=email, password=password)
        audit_record(actor=user, subject=user, action="accounts.first_operator.created", data={}, ip=ip)
    return user


def otp_verify(*, user: User, token: str) -> TOTPDevice | BackupCodeDevice | None:
    """Check a login code: six digits go to the authenticator app, anything else to the backup codes.

    TOTP refuses a code at or before the last accepted time step (no reuse); a backup code is deleted
    by the check that accepts it (single use). Rows are locked so concurrent checks cannot both win.
    """
    token = (token or "").strip().replace(" ", "")
    if not token:
        return None
    with transaction.atomic():
        if token.isdigit() and len(token) == 6:
            devices = list(TOTPDevice.objects.select_for_update().filter(user=user, confirmed=True))
        else:
            devices = list(BackupCodeDevice.objects.select_for_update().filter(user=user, confirmed=True))
        for device in devices:
            if device.verify_token(token):
                return device
    return None
