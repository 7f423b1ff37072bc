"""Writes of the devices app: pairing ceremony, device ledger, presence, durable outbox, device calls.

Races are settled in the database: every state change of a pairing is one conditional UPDATE whose
row count decides; outbox sequence numbers are allocated under the device row's lock so they commit
in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import secrets
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.exceptions import ChannelFull
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from ai1net.accounts import ratelimit
from ai1net.accounts.services import audit_record, hash_secret
from ai1net.exceptions import ApplicationError, Conflict, Gone, NotFound, ValidationFailed
from ai1net.limits import enforce
from ai1net.sql import run as run_statement
from ai1net.sql import update_by, update_statement
from clients import protocol
from devices import events, live, selectors
from devices.errors import DeviceCallError, DeviceOffline, DeviceTimeout
from devices.models import LONGPOLL_PREFIX, Device, OutboxItem, PairingRequest, is_tunnel_channel

# RFC 8628 6.1: 20 consonants, no vowels (no words), 8 characters -> 20^8 (about 34.5 bits).
USER_CODE_ALPHABET = "BCDFGHJKLMNPQRSTVWXZ"
USER_CODE_LENGTH = 8
PAIRING_TTL = timedelta(minutes=10)
DEVICE_TOKEN_PREFIX = "ai1d_"
SLOW_DOWN_STEP = 5
MAX_INTERVAL = 60
# A client that sleeps `interval` between polls must never be told slow_down because of clock jitter.
POLL_TOLERANCE = timedelta(milliseconds=250)


def _audit(*, actor: Any, action: str, subject: Any = None, data: dict[str, Any] | None = None,
           ip: str | None = None) -> None:
    audit_record(actor=actor, action=action, subject=subject, data=data or {}, ip=ip)


# --- pairing ----------------------------------------------------------------------------------

def normalize_user_code(raw: str) -> str:
    """`bcdf-ghjk`, `BCDF GHJK` -> `BCDFGHJK`; anything that cannot be a code -> ``""``."""
    code = "".join(ch for ch in str(raw).upper() if ch.isalnum())
    if len(code) != USER_CODE_LENGTH or any(ch not in USER_CODE_ALPHABET for ch in code):
        return ""
    return code


def format_user_code(code: str) -> str:
    return f"{code[:4]}-{code[4:]}"


def pairing_create(*, name: str, kind: str, hostname: str = "", os_name: str = "", version: str = "",
                   ephemeral: bool = False, ip: str | None = None) -> tuple[PairingRequest, str, str]:
    """Start a pairing: returns the request, the raw device_code and the raw user_code (shown once)."""
    # Every request counts (each one stores a row), not only failures.
    address = (ratelimit.PAIRING_CREATE_PER_ADDRESS, ip or "-")
    ratelimit.check(address, what="Too many pairing requests from this address.")
    ratelimit.fail(address, ip=ip)
    name = (name or "").strip()
    if not name:
        raise ValidationFailed("name is required.")
    for field, limit, value in (("name", "device.name", name), ("hostname", "device.hostname", hostname),
                                ("os", "device.os", os_name), ("version", "device.version", version)):
        enforce(limit, value or "", field)
    if kind not in Device.Kind.values:
        raise ValidationFailed(f"kind must be one of {', '.join(Device.Kind.values)}.")
    device_code = secrets.token_urlsafe(32)  # 256 bits
    for _ in range(8):
        user_code = "".join(secrets.choice(USER_CODE_ALPHABET) for _ in range(USER_CODE_LENGTH))
        try:
            with transaction.atomic():
                pairing = PairingRequest.objects.create(
                    device_code_hash=hash_secret(device_code),
                    user_code_hash=hash_secret(user_code),
                    name=name,
                    kind=kind,
                    hostname=hostname or "",
                    os=os_name or "",
                    client_version=version or "",
                    ephemeral=bool(ephemeral),
                    requested_from=ip,
                    interval=settings.DEVICE_PAIRING_INTERVAL_SEC,
                    expires_at=timezone.now() + PAIRING_TTL,
                )
            return pairing, device_code, user_code
        except IntegrityError:  # user code collision: draw again
            continue
    raise ApplicationError("Could not allocate a pairing code.", code="unavailable", status=503)


def _code_limits(user: Any, ip: str | None) -> tuple[ratelimit.Pair, ratelimit.Pair]:
    return (ratelimit.PAIRING_CODE_PER_ACCOUNT, user.pk), (ratelimit.PAIRING_CODE_PER_ADDRESS, ip or "-")


def _wrong_code(user: Any, ip: str | None) -> NotFound:
    ratelimit.fail(*_code_limits(user, ip), ip=ip, actor=user)
    return NotFound("No pairing request with this code.")


def _expire_if_due(pairing: PairingRequest) -> bool:
    """Move a due request (any state before claimed) to expired. True when it is expired."""
    if pairing.state == PairingRequest.State.EXPIRED:
        return True
    if pairing.state == PairingRequest.State.CLAIMED or pairing.expires_at > timezone.now():
        return False
    PairingRequest.objects.filter(pk=pairing.pk).exclude(state=PairingRequest.State.CLAIMED).update(
        state=PairingRequest.State.EXPIRED
    )
    pairing.refresh_from_db()
    return pairing.state == PairingRequest.State.EXPIRED


def pairing_scan(*, user: Any, user_code: str, ip: str | None = None) -> PairingRequest:
    """Open a code: binds a pending request to this user (`scanned`). Others' or unknown codes -> 404."""
    ratelimit.check(*_code_limits(user, ip), what="Too many wrong codes.")
    code = normalize_user_code(user_code)
    pairing = PairingRequest.objects.filter(user_code_hash=hash_secret(code)).first() if code else None
    if pairing is None or pairing.user_id not in (None, user.pk):
        raise _wrong_code(user, ip)
    if _expire_if_due(pairing):
        raise Gone("This pairing code has expired. Start pairing again on the device.", code="expired")
    if pairing.state == PairingRequest.State.PENDING:
        PairingRequest.objects.filter(pk=pairing.pk, state=PairingRequest.State.PENDING, user__isnull=True).update(
            state=PairingRequest.State.SCANNED, user=user
        )
        pairing.refresh_from_db()
        if pairing.user_id != user.pk:  # someone else scanned it first
            raise _wrong_code(user, ip)
    return pairing


def _pairing_decide(*, user: Any, user_code: str, approve: bool, ip: str | None) -> PairingRequest:
    pairing = pairing_scan(user=user, user_code=user_code, ip=ip)
    target = PairingRequest.State.APPROVED if approve else PairingRequest.State.DENIED
    now = timezone.now()
    with transaction.atomic():
        changed = PairingRequest.objects.filter(
            pk=pairing.pk, user=user, state=PairingRequest.State.SCANNED, expires_at__gt=now
        ).update(state=target, decided_at=now)
        pairing.refresh_from_db()
        if not changed:
            if pairing.state == target or (approve and pairing.state == PairingRequest.State.CLAIMED):
                return pairing  # a repeated click
            if _expire_if_due(pairing):
                raise Gone("This pairing code has expired.", code="expired")
            raise Conflict(f"This pairing request is already {pairing.state}.", code="already_decided")
        _audit(
            actor=user,
            action="devices.pairing.approve" if approve else "devices.pairing.deny",
            subject=user,
            data={"pairing_id": pairing.pk, "name": pairing.name, "kind": pairing.kind,
                  "hostname": pairing.hostname, "os": pairing.os},
            ip=ip,
        )
    return pairing


def pairing_approve(*, user: Any, user_code: str, ip: str | None = None) -> PairingRequest:
    return _pairing_decide(user=user, user_code=user_code, approve=True, ip=ip)


def pairing_deny(*, user: Any, user_code: str, ip: str | None = None) -> PairingRequest:
    return _pairing_decide(user=user, user_code=user_code, approve=False, ip=ip)


class PairingPollError(ApplicationError):
    """RFC 8628 3.5 token errors; rendered as 400 {"error": code, "detail": ...}."""

    status = 400


def pairing_claim(*, device_code: str, ip: str | None = None) -> tuple[Device, str]:
    """The device's poll. Exactly once, after approval: the new Device and its raw 256-bit token."""
    address = (ratelimit.DEVICE_CODE_PER_ADDRESS, ip or "-")
    ratelimit.check(address, what="Too many unknown device codes from this address.")
    pairing = (
        PairingRequest.objects.filter(device_code_hash=hash_secret(device_code)).first()
        if isinstance(device_code, str) and device_code
        else None
    )
    if pairing is None:
        ratelimit.fail(address, ip=ip)
        raise PairingPollError("Unknown device_code.", code="invalid_grant")
    if pairing.state == PairingRequest.State.CLAIMED:
        raise PairingPollError("This device_code was already used.", code="invalid_grant")
    if _expire_if_due(pairing):
        raise PairingPollError("The pairing request expired; start again.", code="expired_token")
    if pairing.state == PairingRequest.State.DENIED:
        raise PairingPollError("The user denied this device.", code="access_denied")
    now = timezone.now()
    if pairing.state in (PairingRequest.State.PENDING, PairingRequest.State.SCANNED):
        due = now - timedelta(seconds=pairing.interval) + POLL_TOLERANCE
        polled = PairingRequest.objects.filter(
            Q(last_polled_at__isnull=True) | Q(last_polled_at__lte=due), pk=pairing.pk
        ).update(last_polled_at=now)
        if not polled:
            PairingRequest.objects.filter(pk=pairing.pk, interval__lt=MAX_INTERVAL).update(
                interval=F("interval") + SLOW_DOWN_STEP
            )
            PairingRequest.objects.filter(pk=pairing.pk).update(last_polled_at=now)
            raise PairingPollError(
                f"Polling too fast; wait {SLOW_DOWN_STEP} seconds more between polls.", code="slow_down"
            )
        raise PairingPollError("The user has not approved this device yet.", code="authorization_pending")
    # approved -> claimed: one conditional UPDATE decides the single winner.
    token = DEVICE_TOKEN_PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic():
        won = PairingRequest.objects.filter(pk=pairing.pk, state=PairingRequest.State.APPROVED).update(
            state=PairingRequest.State.CLAIMED, last_polled_at=now
        )
        if not won:
            raise PairingPollError("This device_code was already used.", code="invalid_grant")
        device = Device.objects.create(
            owner_id=pairing.user_id,
            name=pairing.name,
            kind=pairing.kind,
            hostname=pairing.hostname,
            os=pairing.os,
            client_version=pairing.client_version,
            ephemeral=pairing.ephemeral,
            token_hash=hash_secret(token),
        )
        PairingRequest.objects.filter(pk=pairing.pk).update(device=device)
    return device, token


# --- device ledger ----------------------------------------------------------------------------

def device_authenticate(*, raw_token: str, ip: str | None) -> Device | None:
    """The device (revoked ones too: the caller tells them apart) whose bearer token this is; an
    unknown token counts against its address, and raises ``RateLimited`` while the address is limited.

    A known token is never refused by the limit. It carries 256 random bits, so no guess finds one and
    the limit only stops scanners; refusing it would let anyone at the same address (a NAT, a campus)
    lock the owner's devices out with bad tokens. It also spares every connect a read of the counters
    (0.3 ms of CPU each; the largest part of a reconnect's own work, bench/tunnel.py)."""
    device = selectors.device_by_token(raw_token=raw_token)
    if device is not None:
        return device
    address = (ratelimit.DEVICE_TOKEN_PER_ADDRESS, ip or "-")
    ratelimit.check(address, what="Too many invalid device tokens from this address.")  # refused: not counted
    if raw_token:
        ratelimit.fail(address, ip=ip)
    return None


def device_create(*, owner: Any, name: str, kind: str, hostname: str = "", os_name: str = "",
                  ephemeral: bool = False) -> tuple[Device, str]:
    """A device without the ceremony (operators, tests, benchmarks). Returns the raw token once."""
    token = DEVICE_TOKEN_PREFIX + secrets.token_urlsafe(32)
    device = Device.objects.create(owner=owner, name=name, kind=kind, hostname=hostname, os=os_name,
                                   ephemeral=ephemeral, token_hash=hash_secret(token))
    return device, token


def device_rename(*, device: Device, name: str) -> Device:
    name = (name or "").strip()
    if not name:
        raise ValidationFailed("name is required.")
    enforce("device.name", name, "name")
    Device.objects.filter(pk=device.pk).update(name=name)
    device.name = name
    return device


def device_revoke(*, device: Device, actor: Any, ip: str | None = None, reason: str = "revoked by owner") -> bool:
    """Revoke for good: the live tunnel closes at once with 4403 and every later attempt fails."""
    with transaction.atomic():
        changed = Device.objects.filter(pk=device.pk, status=Device.Status.ACTIVE).update(
            status=Device.Status.REVOKED, revoked_at=timezone.now()
        )
        device.refresh_from_db()
        if not changed:
            return False
        events.send_close(device.channel_name, protocol.CLOSE_REVOKED)  # read under the UPDATE's row lock
        events.send_presence_changed(device)
        _audit(actor=actor, action="devices.device.revoke", subject=device.owner,
               data={"device_id": str(device.pk), "name": device.name, "kind": device.kind, "reason": reason}, ip=ip)
    return True


def device_expire_ephemeral(*, device_id: Any) -> bool:
    """Revoke an ephemeral device that has stayed disconnected past the grace. True when revoked."""
    due = timezone.now() - timedelta(seconds=settings.DEVICE_EPHEMERAL_GRACE_SEC)
    device = Device.objects.filter(
        pk=device_id, ephemeral=True, status=Device.Status.ACTIVE, channel_name="", disconnected_at__lte=due
    ).first()
    if device is None:
        return False
    return device_revoke(device=device, actor=None, reason="ephemeral device disconnected")


# --- presence (written by the tunnel consumer) ------------------------------------------------

def device_hello(*, device_id: Any, channel_name: str, hello: dict[str, Any],
                 known: Device | None = None, relay: str = "") -> tuple[Device, str]:
    """A connection said hello: it becomes the device's live connection. Returns (device, older channel).

    ``relay``: the address of this process's device-web stream relay (devices.web.relay), "" for none;
    written in the same statement as the channel.

    ``known``: the device as read when the socket opened (with its owner). When nothing that matters
    changed since (status, live channel, next_seq, connection count), one conditional UPDATE makes the
    connection live and its row count decides; otherwise, or when the device acks more than the row
    says, the row is locked, read and written."""
    if known is not None and known.pk == device_id:
        acked = int(hello.get("ackedSeq") or 0)
        if acked <= known.acked_seq:
            device = _device_hello_fast(known, channel_name, hello, relay)
            if device is not None:
                return device, _older_channel(known.channel_name, channel_name)
    return _device_hello_locked(device_id=device_id, channel_name=channel_name, hello=hello, relay=relay)


def _older_channel(previous: str, channel_name: str) -> str:
    # A long poll has no channel to close: it sees the WebSocket took over and ends.
    return "" if previous == channel_name or previous.startswith(LONGPOLL_PREFIX) else previous


def _hello_fields(hello: dict[str, Any]) -> dict[str, Any]:
    return {"capabilities": list(hello.get("capabilities") or []), "ports": list(hello.get("ports") or []),
            "roots": list(hello.get("roots") or []), "protocol_version": int(hello.get("protocolVersion") or 0),
            "client_version": str(hello.get("version") or "")[:50]}


def _device_hello_fast(known: Device, channel_name: str, hello: dict[str, Any], relay: str = "") -> Device | None:
    now = timezone.now()
    fields = {"channel_name": channel_name, "connected_at": now, "last_seen_at": now, "disconnected_at": None,
              "connection_count": known.connection_count + 1}
    # What the device says about itself rarely changes between hellos: write only what did.
    fields.update((name, value) for name, value in _hello_fields(hello).items() if getattr(known, name) != value)
    if known.relay != relay:
        fields["relay"] = relay
    # The same next_seq as read at connect: nothing was enqueued meanwhile (what is enqueued later reads
    # this connection as the live one: it is handed over, or its doorbell is sent to this channel).
    with _presence_write() as relax_own_commit:
        changed = _device_update(fields, {"id": known.pk, "status": Device.Status.ACTIVE,
                                          "channel_name": known.channel_name, "next_seq": known.next_seq,
                                          "connection_count": known.connection_count},
                                 relax_own_commit=relax_own_commit)
        if not changed:
            return None
        device = known.copied()
        for name, value in fields.items():
            setattr(device, name, value)
        events.send_presence_changed(device)
    return device


@contextlib.contextmanager
def _presence_write() -> Iterator[bool]:
    """A presence write, whose commit on PostgreSQL does not wait for the WAL flush (``_relaxed_commit``).
    Yields True where the write is one statement that relaxes its own commit (``_device_update``'s
    ``relax_own_commit``): on PostgreSQL outside a transaction, one round trip instead of four (BEGIN,
    SET LOCAL, the UPDATE, COMMIT). Inside the caller's transaction, in a nested one that relaxes the whole
    commit, as before; on SQLite autocommit as it was (its commits do not flush: WAL mode, synchronous=NORMAL)."""
    conn = transaction.get_connection()
    if conn.vendor != "postgresql":
        yield False
    elif not conn.in_atomic_block:
        yield True
    else:
        with transaction.atomic():
            _relaxed_commit()
            yield False


# In a statement of its own implicit transaction (autocommit): that commit does not wait for the WAL flush, as
# ``_relaxed_commit``'s SET LOCAL does for a transaction.
_RELAX_OWN_COMMIT = "set_config('synchronous_commit', 'off', true)"


def _relaxed_commit() -> None:
    """This transaction's commit does not wait for PostgreSQL's WAL flush (p50 3.3 / p99 12.6 ms per commit
    on this machine when busy, 0.22 / 0.58 ms idle; a fleet of thousands reconnecting waited on it). Only
    for writes that a database crash may lose without harm, because the device says them again: presence
    and acks (its next hello carries its ackedSeq; items sent again it skips by seq). Never for items,
    answers or anything a person did."""
    conn = transaction.get_connection()
    if conn.vendor == "postgresql" and conn.in_atomic_block:
        with conn.cursor() as cursor:
            cursor.execute("SET LOCAL synchronous_commit TO OFF")


def _device_hello_locked(*, device_id: Any, channel_name: str, hello: dict[str, Any],
                         relay: str = "") -> tuple[Device, str]:
    now = timezone.now()
    acked = int(hello.get("ackedSeq") or 0)
    with transaction.atomic():
        _relaxed_commit()
        # With its owner: the device_connected receivers read it (one query, not two).
        device = Device.objects.select_for_update(of=("self",)).select_related("owner").get(pk=device_id)
        if device.status != Device.Status.ACTIVE:
            raise ApplicationError("revoked", code="revoked", status=403)
        older = _older_channel(device.channel_name, channel_name)
        device.channel_name = channel_name
        device.relay = relay
        device.connected_at = now
        device.last_seen_at = now
        device.disconnected_at = None
        device.connection_count += 1
        for name, value in _hello_fields(hello).items():
            setattr(device, name, value)
        recorded = device.acked_seq
        if acked > device.acked_seq:
            device.acked_seq = min(acked, device.next_seq - 1)
        device.save(update_fields=["channel_name", "relay", "connected_at", "last_seen_at", "disconnected_at",
                                   "connection_count", "capabilities", "ports", "roots", "protocol_version",
                                   "client_version", "acked_seq"])
        if acked > recorded:
            OutboxItem.objects.filter(device_id=device_id, seq__gt=recorded, seq__lte=acked,
                                      acked_at__isnull=True).update(acked_at=now)
        events.send_presence_changed(device)
    return device, older


def _device_update(values: dict[str, Any], where: dict[str, Any], *, relax_own_commit: bool = False) -> int:
    """``Device.objects.filter(**where).update(**values)`` (plain fields, equality only) with its SQL
    written once per shape (``ai1net.sql.update_by``): presence is written on every connect and close, and building
    the UPDATE with the ORM cost more CPU than running it. Returns the row count.

    ``relax_own_commit`` (PostgreSQL, outside a transaction: ``_presence_write``): the UPDATE as a
    data-modifying CTE of a statement that also relaxes the commit of its own implicit transaction, as
    SET LOCAL would (``_relaxed_commit``), the ack's way (``_ack_one_statement``)."""
    if not relax_own_commit:
        return update_by(Device, values, **where)
    update, params = update_statement(Device, values, where)
    with transaction.get_connection().cursor() as cursor:
        cursor.execute(_relaxing_own_commit(update), params)
        return int(cursor.fetchone()[0])


@functools.cache
def _relaxing_own_commit(update: str) -> str:
    return f"WITH changed AS ({update} RETURNING 1) SELECT (SELECT count(*) FROM changed), {_RELAX_OWN_COMMIT}"  # noqa: S608


def device_disconnected(*, device_id: Any, channel_name: str, known: Device | None = None) -> Device | None:
    """The connection closed; only the live connection clears presence (a replaced one does not).

    ``known``: the device as the connection last had it; its presence is updated in memory instead of
    reading the row again (one statement)."""
    now = timezone.now()
    # A durable commit, unlike the hello's: a device that does not come back never says this again, and a lost
    # write would leave it online.
    changed = _device_update({"channel_name": "", "disconnected_at": now, "last_seen_at": now},
                             {"id": device_id, "channel_name": channel_name})
    if not changed:
        return None
    if known is not None and known.pk == device_id:
        device = known.copied()
        device.channel_name, device.disconnected_at, device.last_seen_at = "", now, now
    else:
        device = Device.objects.get(pk=device_id)
    events.send_presence_changed(device)
    return device


def device_seen(*, device_id: Any, channel_name: str) -> None:
    Device.objects.filter(pk=device_id, channel_name=channel_name).update(last_seen_at=timezone.now())


def devices_seen(*, connections: list[tuple[Any, str]], chunk: int = 500) -> None:
    """``device_seen`` for many live connections, one UPDATE per chunk (the tunnels' heartbeat sweep).

    Channel names are unique per connection, so ``pk IN (...) AND channel_name IN (...)`` touches
    exactly the rows whose live connection is one of these (a replaced connection's row is left alone)."""
    now = timezone.now()
    for start in range(0, len(connections), chunk):
        part = connections[start:start + chunk]
        Device.objects.filter(pk__in=[pk for pk, _ in part], channel_name__in=[name for _, name in part]).update(
            last_seen_at=now)


def device_longpoll_seen(*, device_id: Any, poll_channel: str) -> tuple[Device, bool]:
    """A long poll arrived or is still held: presence in long-poll mode. Returns (device, came_online).

    A live WebSocket owns presence; a poll never takes it over (the client stops polling once its
    WebSocket is up, and the tunnel consumer clears its channel when it closes)."""
    now = timezone.now()
    with transaction.atomic():
        device = Device.objects.select_for_update().select_related("owner").get(pk=device_id)
        if device.status != Device.Status.ACTIVE:
            raise ApplicationError("This device was revoked.", code="revoked", status=403)
        if device.channel_name and not device.is_long_polling:
            return device, False
        came_online = not device.is_online
        device.channel_name = poll_channel
        device.last_seen_at = now
        fields = ["channel_name", "last_seen_at"]
        if came_online:
            device.connected_at = now
            device.disconnected_at = None
            device.connection_count += 1
            device.ports = []  # device web needs the WebSocket
            fields += ["connected_at", "disconnected_at", "connection_count", "ports"]
        device.save(update_fields=fields)
        if came_online:
            events.send_presence_changed(device)
    return device, came_online


# --- durable outbox ---------------------------------------------------------------------------

# A doorbell to a connection in another process carries the items it rings for, already rendered as
# deliver frames, up to this many bytes of them: that process sends them without reading the outbox (a
# thread hop and a query per delivery). Larger, or several enqueues for the device in one transaction:
# a plain doorbell, and the outbox is read as before. Either way the rows are committed first.
DOORBELL_FRAMES_MAX_BYTES = 32 * 1024


class _Ring:
    """This transaction's doorbell for one device: the frames of its one enqueue, or None (read)."""

    __slots__ = ("frames",)

    def __init__(self, frames: list[tuple[int, str]] | None) -> None:
        self.frames = frames


def _ring_once_per_commit(device_id: Any, channel_name: str, frames: list[tuple[int, str]] | None,
                          relay: str = "") -> None:
    """One doorbell per device per commit, however many items the transaction enqueued, to its live
    connection ``channel_name`` (read in the transaction, under the row lock); none when that connection
    is in this process (it was handed the items: ``devices.live``) or there is none (its hello reads).
    ``relay``: the address of the stream relay of the process that holds the connection (read with it), which
    the doorbell takes before the channel layer (``events.send_outbox_doorbell``).

    The callback registered for this device is remembered on the connection with its position in
    ``run_on_commit``; if it is still there (not rolled back), there is nothing to add. The doorbell
    carries ``frames`` when its callback's own enqueue was the transaction's only one for the device:
    the callback lives exactly as long as that enqueue's rows (a rolled-back savepoint takes both),
    while a second enqueue's rows might not, so then the doorbell says "read" instead.
    """
    conn = transaction.get_connection()
    if not conn.in_atomic_block:
        _doorbell_unless_here(channel_name, _Ring(frames), relay)
        return
    pending = conn.__dict__.setdefault("_devices_doorbells", {})
    key = str(device_id)
    entry = pending.get(key)
    if entry is not None:
        index, marker, ring = entry
        if index < len(conn.run_on_commit) and conn.run_on_commit[index][1] is marker:
            ring.frames = None
            return
    ring = _Ring(frames)
    index = len(conn.run_on_commit)
    transaction.on_commit(functools.partial(_doorbell_unless_here, channel_name, ring, relay))
    pending[key] = (index, conn.run_on_commit[index][1], ring)


def _doorbell_unless_here(channel_name: str, ring: _Ring, relay: str = "") -> None:
    if live.get(channel_name) is None:
        frames = ring.frames
        if frames is not None and sum(len(frame) for _, frame in frames) > DOORBELL_FRAMES_MAX_BYTES:
            frames = None
        events.send_outbox_doorbell(channel_name, frames, relay=relay)


def outbox_enqueue(*, device: Device, kind: str, payload: dict[str, Any]) -> OutboxItem:
    """Write one platform -> device item with the device's next seq; the doorbell rings after commit."""
    return outbox_enqueue_many(device=device, items=[(kind, payload)])[0]


def _allocate_seqs(device_id: Any, count: int) -> tuple[int, str, str]:
    """Add ``count`` to the device's next_seq; returns (the new next_seq, the live channel name, the relay of
    the process that holds it).

    The UPDATE takes the device row's lock until commit, so seqs commit in allocation order and no
    hello can change the channel meanwhile. One statement where the database can return what it
    updated (PostgreSQL, SQLite >= 3.35), else an UPDATE and a SELECT."""
    conn = transaction.get_connection()
    if conn.features.can_return_columns_from_insert:
        meta, qn = Device._meta, conn.ops.quote_name
        # Names from the model's _meta, values as parameters.
        sql = (f"UPDATE {qn(meta.db_table)} SET {qn('next_seq')} = {qn('next_seq')} + %s "  # noqa: S608
               f"WHERE {qn('id')} = %s RETURNING {qn('next_seq')}, {qn('channel_name')}, {qn('relay')}")
        with conn.cursor() as cursor:
            cursor.execute(sql, [count, meta.pk.get_db_prep_value(device_id, conn)])
            row = cursor.fetchone()
        if row is None:
            raise NotFound("No such device.")
        return int(row[0]), row[1] or "", row[2] or ""
    if not Device.objects.filter(pk=device_id).update(next_seq=F("next_seq") + count):
        raise NotFound("No such device.")
    end, channel_name, relay = (Device.objects.filter(pk=device_id)
                                .values_list("next_seq", "channel_name", "relay").get())
    return end, channel_name, relay


def outbox_enqueue_many(*, device: Device, items: list[tuple[str, dict[str, Any]]]) -> list[OutboxItem]:
    """Several items in one transaction, consecutive seqs, one doorbell (or a direct hand-over to the
    device's connection when it lives in this process: ``devices.live``)."""
    if not items:
        return []
    conn = transaction.get_connection()
    # On PostgreSQL one round trip: the seqs' UPDATE and the rows' INSERT in one statement. Outside a
    # transaction that statement commits by itself, atomically, so it opens none: BEGIN and COMMIT would be
    # two more round trips on every delivery's way (the callbacks below then run as it returns, committed).
    inserted = conn.vendor == "postgresql" and len(items) <= _INSERT_BATCH
    alone = inserted and conn.get_autocommit() and not conn.in_atomic_block
    # No savepoint inside the caller's transaction (two round trips fewer per answer on PostgreSQL):
    # a failure here fails the caller's whole transaction, and no caller goes on after one.
    now = timezone.now()
    rows = [OutboxItem(device_id=device.pk, kind=kind, payload=payload, created_at=now) for kind, payload in items]

    def enqueued(end: int, channel_name: str, relay: str) -> None:
        for seq, row in enumerate(rows, start=end - len(rows)):
            row.seq = seq
        if not inserted:
            for start in range(0, len(rows), _INSERT_BATCH):
                _outbox_insert(rows[start:start + _INSERT_BATCH])
        frames = None
        if is_tunnel_channel(channel_name):
            # Rendered now, as committed: the caller may change its payload dicts before the commit (but not
            # before the end of a pipeline this was sent in, when this runs).
            frames = [(row.seq, protocol.notification(protocol.DELIVER, {"seq": row.seq, "kind": row.kind,
                                                                          "payload": row.payload}))
                      for row in rows]
            if live.get(channel_name) is not None:
                transaction.on_commit(functools.partial(live.hand_over, channel_name, frames))
        _ring_once_per_commit(device.pk, channel_name, frames, relay)
        device.next_seq = end

    with contextlib.nullcontext() if alone else transaction.atomic(savepoint=False):
        if inserted:
            # In a pipeline (``sql.pipelined``) ``enqueued`` runs when it ends: the rows have their seqs then.
            _allocate_and_insert_postgresql(conn, device.pk, items, now, enqueued)
        else:
            enqueued(*_allocate_seqs(device.pk, len(items)))
    return rows


_INSERT_SQL: dict[tuple[str, int], str] = {}
_INSERT_FIELDS = ("device", "seq", "kind", "payload", "created_at")
_INSERT_BATCH = 500  # rows per statement: well under both backends' limit on parameters


_ALLOCATE_INSERT_SQL: dict[int, str] = {}


def _allocate_and_insert_postgresql(conn: Any, device_id: Any, items: list[tuple[str, dict[str, Any]]],
                                    now: Any, then: Callable[[int, str, str], None]) -> None:
    """``_allocate_seqs`` and ``_outbox_insert`` as one PostgreSQL statement (a data-modifying CTE): each
    round trip to the server is a wait on the phone's answer and on every delivery. The UPDATE takes the
    device row's lock as before; no device, no rows. ``then`` gets what ``_allocate_seqs`` returns (in a
    pipeline, when it ends)."""
    count = len(items)
    sql = _ALLOCATE_INSERT_SQL.get(count)
    if sql is None:
        device, item, quote = Device._meta, OutboxItem._meta, conn.ops.quote_name

        def col(meta: Any, name: str) -> str:
            return quote(meta.get_field(name).column)

        values = ", ".join(["(%s::bigint, %s::text, %s::jsonb)"] * count)
        # Names from the models' _meta, values as parameters.
        sql = _ALLOCATE_INSERT_SQL[count] = (
            f"WITH d AS (UPDATE {quote(device.db_table)} SET {col(device, 'next_seq')} = {col(device, 'next_seq')} + %s"  # noqa: S608
            f" WHERE {col(device, 'id')} = %s RETURNING {col(device, 'next_seq')} AS next_seq,"
            f" {col(device, 'channel_name')} AS channel_name, {col(device, 'relay')} AS relay),"
            f" i AS (INSERT INTO {quote(item.db_table)} ({col(item, 'device')}, {col(item, 'seq')},"
            f" {col(item, 'kind')}, {col(item, 'payload')}, {col(item, 'created_at')})"
            f" SELECT %s, d.next_seq - %s + v.n, v.kind, v.payload, %s"
            f" FROM d, (VALUES {values}) AS v (n, kind, payload))"
            f" SELECT next_seq, channel_name, relay FROM d")
    payload_field, created_field = OutboxItem._meta.get_field("payload"), OutboxItem._meta.get_field("created_at")
    device_value = Device._meta.pk.get_db_prep_value(device_id, conn)
    params: list[Any] = [count, device_value, device_value, count, created_field.get_db_prep_save(now, conn)]
    for n, (kind, payload) in enumerate(items):
        params += [n, kind, payload_field.get_db_prep_save(payload, conn)]

    def allocated(row: Any) -> None:
        if row is None:
            raise NotFound("No such device.")
        then(int(row[0]), row[1] or "", row[2] or "")

    run_statement(conn, sql, params, allocated)


def _outbox_insert(rows: list[OutboxItem]) -> None:
    """``bulk_create`` of the items (their pks left unset: nothing reads them), its SQL written once per
    row count: every answer, switch and message goes through here, and compiling the INSERT with the ORM
    cost more CPU than running it. Values are adapted by their fields."""
    conn = transaction.get_connection()
    key = (conn.vendor, len(rows))
    sql = _INSERT_SQL.get(key)
    meta, quote = OutboxItem._meta, conn.ops.quote_name
    fields = [meta.get_field(name) for name in _INSERT_FIELDS]
    if sql is None:
        columns = ", ".join(quote(field.column) for field in fields)
        values = ", ".join(["(" + ", ".join(["%s"] * len(fields)) + ")"] * len(rows))
        # Names from the model's _meta, values as parameters.
        sql = _INSERT_SQL[key] = f"INSERT INTO {quote(meta.db_table)} ({columns}) VALUES {values}"  # noqa: S608
    params = [field.get_db_prep_save(getattr(row, field.attname), conn) for row in rows for field in fields]
    with conn.cursor() as cursor:
        cursor.execute(sql, params)


def outbox_ack(*, device_id: Any, seq: int, after: int = 0) -> None:
    """The device applied everything up to and including seq. One transaction (one commit).

    ``after``: a seq already recorded as acked (the caller's last ack): the items' index is walked
    from there, not from the first item the device ever got. Two plain UPDATEs written out once: the
    tunnel records an ack per burst of deliveries, and building them with the ORM cost more CPU than
    running them."""
    conn = transaction.get_connection()
    acked_at = OutboxItem._meta.get_field("acked_at")
    params = {"now": acked_at.get_db_prep_save(timezone.now(), conn), "seq": seq, "after": after,
              "device": Device._meta.pk.get_db_prep_value(device_id, conn)}
    statements = _ack_statements(conn)
    if conn.vendor == "postgresql" and not conn.in_atomic_block:
        # One round trip instead of five (BEGIN, SET LOCAL, two UPDATEs, COMMIT): both UPDATEs as one
        # statement in its own implicit transaction, whose commit set_config relaxes as SET LOCAL would.
        sql, names = _ack_one_statement(conn, statements)
        with conn.cursor() as cursor:
            cursor.execute(sql, [params[name] for name in names])
        return
    with transaction.atomic(), conn.cursor() as cursor:
        _relaxed_commit()
        for sql, names in statements:
            cursor.execute(sql, [params[name] for name in names])


def _ack_one_statement(conn: Any, statements: list[tuple[str, tuple[str, ...]]]) -> tuple[str, tuple[str, ...]]:
    """PostgreSQL: the ack's UPDATEs as data-modifying CTEs (each runs once, to completion, whether or not
    the outer query reads it) and a relaxed commit for the statement's own transaction."""
    one = _ACK_ONE_SQL.get(conn.vendor)
    if one is None:
        (items_sql, items_names), (device_sql, device_names) = statements
        one = _ACK_ONE_SQL[conn.vendor] = (f"WITH items AS ({items_sql}), dev AS ({device_sql}) "
                                           f"SELECT {_RELAX_OWN_COMMIT}",
                                           items_names + device_names)
    return one


_ACK_SQL: dict[str, list[tuple[str, tuple[str, ...]]]] = {}
_ACK_ONE_SQL: dict[str, tuple[str, tuple[str, ...]]] = {}


def _ack_statements(conn: Any) -> list[tuple[str, tuple[str, ...]]]:
    """The ack's statements for this database vendor. Names from the models' _meta, values as parameters."""
    statements = _ACK_SQL.get(conn.vendor)
    if statements is None:
        item, device, quote = OutboxItem._meta, Device._meta, conn.ops.quote_name

        def col(meta: Any, name: str) -> str:
            return quote(meta.get_field(name).column)

        statements = _ACK_SQL[conn.vendor] = [
            (f"UPDATE {quote(item.db_table)} SET {col(item, 'acked_at')} = %s "  # noqa: S608
             f"WHERE {col(item, 'device')} = %s AND {col(item, 'seq')} > %s AND {col(item, 'seq')} <= %s "
             f"AND {col(item, 'acked_at')} IS NULL", ("now", "device", "after", "seq")),
            (f"UPDATE {quote(device.db_table)} SET {col(device, 'acked_seq')} = %s "  # noqa: S608
             f"WHERE {col(device, 'id')} = %s AND {col(device, 'acked_seq')} < %s AND {col(device, 'next_seq')} > %s",
             ("seq", "device", "seq", "seq")),
        ]
    return statements


# --- platform -> device calls -----------------------------------------------------------------

def _tunnel_of(device_id: Any) -> tuple[str, str]:
    """The live WebSocket connection's channel and the stream relay of the process that holds it ("" when
    that process has none); ("", "") when offline, revoked or long polling (a poll cannot take platform ->
    device requests: no channel reaches it). Its SQL is written once: every probe command reads it, and the
    ORM compiling the query took as long as the rest of the call's Python on its process (py-spy)."""
    conn = transaction.get_connection()
    with conn.cursor() as cursor:
        cursor.execute(_tunnel_sql(conn.vendor), [Device._meta.pk.get_db_prep_value(device_id, conn),
                                                  Device.Status.ACTIVE.value])
        row = cursor.fetchone()
    if row is None or not is_tunnel_channel(row[0] or ""):
        return "", ""
    return row[0], row[1] or ""


@functools.cache
def _tunnel_sql(vendor: str) -> str:
    from django.db import connection

    meta, quote = Device._meta, connection.ops.quote_name
    col = {name: quote(meta.get_field(name).column) for name in ("channel_name", "relay", "status")}
    # Names from the model's _meta, values as parameters.
    return (f"SELECT {col['channel_name']}, {col['relay']} FROM {quote(meta.db_table)} "  # noqa: S608
            f"WHERE {quote(meta.pk.column)} = %s AND {col['status']} = %s")


class _CallWaiter:
    """A call's reply target when the tunnel consumer runs on the caller's loop: the consumer ``put``s it."""

    def __init__(self) -> None:
        self.reply: asyncio.Future = asyncio.get_running_loop().create_future()

    def put(self, message: dict[str, Any]) -> None:
        if not self.reply.done():
            self.reply.set_result(message)


async def _call_here(tunnel: Any, call: dict[str, Any]) -> dict[str, Any]:
    waiter = _CallWaiter()
    try:
        await tunnel.device_call(dict(call, reply_channel=waiter))
        return await waiter.reply
    finally:
        tunnel.calls.pop(call["call_id"], None)  # timed out or cancelled: a late answer is dropped


async def _call_via_layer(device: Device, channel: str, call: dict[str, Any]) -> dict[str, Any]:
    layer = get_channel_layer()
    reply_channel = await layer.new_channel()
    try:
        await layer.send(channel, dict(call, reply_channel=reply_channel))
    except ChannelFull:  # the connection's process stopped reading it (gone): as good as offline
        raise DeviceOffline(f"{device.name} is not connected.") from None
    while True:
        message = await layer.receive(reply_channel)
        if message.get("call_id") == call["call_id"]:
            return message


async def adevice_call(*, device: Device, method: str, params: dict[str, Any], timeout: float = 30.0) -> Any:
    """Send a JSON-RPC request to the device wherever it is connected and wait for its answer: straight to
    the tunnel consumer when it runs on this event loop; over the stream relay of the daphne process that
    holds it (``devices.web.relay.call``: one socket hop each way, where the Redis layer took two trips
    through Redis); else, or when that relay cannot be reached, through the channel layer."""
    channel, address = await database_sync_to_async(_tunnel_of)(device.pk)
    return await _call_tunnel(device, channel, address, method, params, timeout)


def device_call(*, device: Device, method: str, params: dict[str, Any], timeout: float = 30.0) -> Any:
    """Synchronous ``adevice_call`` (views, services, management commands). The tunnel is read in the
    caller's thread, which may use the database: no trip to a database thread from the event loop for it."""
    channel, address = _tunnel_of(device.pk)
    return async_to_sync(_call_tunnel)(device, channel, address, method, params, timeout)


async def _call_tunnel(device: Device, channel: str, address: str, method: str, params: dict[str, Any],
                       timeout: float) -> Any:
    from devices.consumers import local_tunnel
    from devices.web import relay

    if not channel:
        raise DeviceOffline(f"{device.name} is not connected.")
    call = {"type": "device.call", "call_id": f"p-{uuid.uuid4().hex}", "method": method, "params": params or {}}
    try:
        async with asyncio.timeout(timeout):  # not wait_for: see devices.web.http.HttpStream._download
            tunnel = local_tunnel(channel)
            if tunnel is not None:
                message = await _call_here(tunnel, call)
            else:
                message = await relay.call(address, channel, call) if address else None
                if message is None:
                    message = await _call_via_layer(device, channel, call)
    except TimeoutError:
        raise DeviceTimeout(f"{device.name} did not answer {method} within {timeout:g} s.") from None
    except relay.CallLost:
        # Sent, and the connection to the tunnel's process went: the device may have run it (never resent).
        raise DeviceOffline(f"The platform lost its way to {device.name} during {method}; it may have run.") from None
    response = message.get("response") or {}
    if "error" in response:
        err = response["error"] or {}
        data = err.get("data") or {}
        if data.get("code") == DeviceOffline.code:
            raise DeviceOffline(err.get("message") or DeviceOffline.default_detail)
        raise DeviceCallError(str(err.get("message") or DeviceCallError.default_detail),
                              code=str(data.get("code") or "device_error"))
    return response.get("result")
