from __future__ import annotations

import json
from typing import Any

from django.core.exceptions import ValidationError
from django.db.models import QuerySet, TextField
from django.db.models.functions import Cast

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
    if not raw_token:
        return None
    return Device.objects.select_related("owner").filter(token_hash=hash_secret(raw_token)).first()


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
    database holds and put in the frame as is (no decode and encode again on the tunnel's loop)."""
    rows = (OutboxItem.objects.filter(device_id=device_id, seq__gt=after_seq, acked_at__isnull=True)
            .order_by("seq").annotate(raw=Cast("payload", TextField())).values_list("seq", "kind", "raw")[:limit])
    return [(seq, deliver_frame(seq, kind, raw)) for seq, kind, raw in rows]


def devices_tick_state(*, device_ids: list[Any], chunk: int = 500) -> dict[Any, tuple[str, int, str]]:
    """device id -> (status, next_seq, channel_name) for many tunnels at once (the heartbeat sweep);
    gone ones are absent."""
    states: dict[Any, tuple[str, int, str]] = {}
    for start in range(0, len(device_ids), chunk):
        rows = Device.objects.filter(pk__in=device_ids[start:start + chunk]).values_list(
            "pk", "status", "next_seq", "channel_name")
        states.update((pk, (status, next_seq, channel)) for pk, status, next_seq, channel in rows)
    return states
