from __future__ import annotations

import json
import uuid
from typing import Any

from django.core.exceptions import ValidationError
from django.db import connections, router
from django.db.models import QuerySet
from django.db.models.query import get_related_populators

from ai1net.accounts.services import hash_secret
from ai1net.exceptions import NotFound
from clients import protocol
from devices.models import Device, OutboxItem


def devices_for_user(*, user: Any, kind: str | None = None) -> QuerySet[Device]:
    devices = Device.objects.filter(owner=user)
    if kind:
        devices = devices.filter(kind=kind)
    return devices.order_by("-created_at")


def access_device(*, user: Any, device_id: Any) -> Device:
    """The user's own device, or 404 for anything else (someone else's, unknown, malformed id)."""
    if not getattr(user, "is_authenticated", False):
        raise NotFound("No such device.")
    try:
        return Device.objects.get(owner=user, pk=device_id)
    except (Device.DoesNotExist, ValueError, TypeError, ValidationError):
        raise NotFound("No such device.") from None


def device_by_token(*, raw_token: str) -> Device | None:
    """The device (with its owner) whose token this is. Every tunnel connect asks: the query is
    compiled once per database vendor (compiling it cost several times what running it does)."""
    if not raw_token:
        return None
    return _device_with_owner_by("token_hash", hash_secret(raw_token))


def device_with_owner(*, device_id: Any) -> Device | None:
    """``Device.objects.select_related("owner").get(pk=device_id)`` (None when gone), as ``device_by_token``
    reads: every request a device makes reads its device and owner as they are now (devices.rpc)."""
    return _device_with_owner_by("id", device_id)


def _device_with_owner_by(field: str, value: Any) -> Device | None:
    db = router.db_for_read(Device)
    conn = connections[db]
    prepared = _DEVICE_READS.get((conn.vendor, field))
    if prepared is None:
        prepared = _DEVICE_READS[conn.vendor, field] = _prepare_device_read(db, field)
    sql, compiler, converters, (start, end), init_list, populators = prepared
    with conn.cursor() as cursor:
        cursor.execute(sql, [Device._meta.get_field(field).get_db_prep_value(value, conn)])
        row = cursor.fetchone()
    if row is None:
        return None
    if converters:
        row = next(iter(compiler.apply_converters([row], converters)))
    device = Device.from_db(db, init_list, row[start:end])
    for populator in populators:
        populator.populate(row, device)
    return device


_DEVICE_READS: dict[tuple[str, str], tuple] = {}  # (vendor, column's field) -> _prepare_device_read's


def _prepare_device_read(db: str, field: str) -> tuple:
    """``Device.objects.select_related("owner").get(<field>=...)`` taken apart as Django's ModelIterable does
    it: the SQL, the column converters, and how a row becomes the two models. Compiled with a stand-in
    value, which must come out as the statement's one parameter."""
    stand_in = {"token_hash": "?", "id": uuid.UUID(int=0)}[field]
    compiler = Device.objects.select_related("owner").filter(**{field: stand_in}).order_by().query.get_compiler(
        using=db)
    sql, params = compiler.as_sql()
    if list(params) != [Device._meta.get_field(field).get_db_prep_value(stand_in, connections[db])]:
        raise RuntimeError(f"unexpected parameters {params!r}")
    converters = compiler.get_converters([column[0] for column in compiler.select[:compiler.col_count]])
    klass_info = compiler.klass_info
    start, end = klass_info["select_fields"][0], klass_info["select_fields"][-1] + 1
    init_list = [column[0].target.attname for column in compiler.select[start:end]]
    return sql, compiler, converters, (start, end), init_list, get_related_populators(klass_info, compiler.select, db)


def outbox_unacked_after(*, device_id: Any, after_seq: int, limit: int) -> list[tuple[int, str, Any]]:
    return list(
        OutboxItem.objects.filter(device_id=device_id, seq__gt=after_seq, acked_at__isnull=True)
        .order_by("seq")
        .values_list("seq", "kind", "payload")[:limit]
    )


def deliver_frame(seq: int, kind: str, payload_json: str) -> str:
    """The ``deliver`` notification (clients.protocol) around a payload that is JSON text already."""
    return (f'{{"jsonrpc":"2.0","method":"{protocol.DELIVER}","params":{{"seq":{int(seq)},'
            f'"kind":{json.dumps(kind, ensure_ascii=False)},"payload":{payload_json or "null"}}}}}')


def outbox_frames_after(*, device_id: Any, after_seq: int, limit: int) -> list[tuple[int, str]]:
    """``outbox_unacked_after`` as ready ``deliver`` frames: the payload is read as the JSON text the
    database holds and put in the frame as is (no decode and encode again on the tunnel's loop). The
    tunnel reads on every doorbell: the SELECT is written once per database vendor."""
    conn = connections[router.db_for_read(OutboxItem)]
    sql = _FRAMES_SQL.get(conn.vendor)
    if sql is None:
        meta, quote = OutboxItem._meta, conn.ops.quote_name

        def col(name: str) -> str:
            return quote(meta.get_field(name).column)

        # Names from the model's _meta, values as parameters.
        sql = _FRAMES_SQL[conn.vendor] = (
            f"SELECT {col('seq')}, {col('kind')}, CAST({col('payload')} AS text) FROM {quote(meta.db_table)} "  # noqa: S608
            f"WHERE {col('device')} = %s AND {col('seq')} > %s AND {col('acked_at')} IS NULL "
            f"ORDER BY {col('seq')} LIMIT %s")
    with conn.cursor() as cursor:
        cursor.execute(sql, [OutboxItem._meta.get_field("device").get_db_prep_value(device_id, conn), after_seq, limit])
        return [(seq, deliver_frame(seq, kind, raw)) for seq, kind, raw in cursor.fetchall()]


_FRAMES_SQL: dict[str, str] = {}


def devices_tick_state(*, device_ids: list[Any], chunk: int = 500) -> dict[Any, tuple[str, int, str]]:
    """device id -> (status, next_seq, channel_name) for many tunnels at once (the heartbeat sweep);
    gone ones are absent."""
    states: dict[Any, tuple[str, int, str]] = {}
    for start in range(0, len(device_ids), chunk):
        rows = Device.objects.filter(pk__in=device_ids[start:start + chunk]).values_list(
            "pk", "status", "next_seq", "channel_name")
        states.update((pk, (status, next_seq, channel)) for pk, status, next_seq, channel in rows)
    return states
