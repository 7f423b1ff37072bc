"""Room events: builders, group names, and the one helper that sends them after commit."""

from __future__ import annotations

import logging
from typing import Any

from ai1net.realtime import group_send_on_commit
from im.models import Message, Panel

logger = logging.getLogger(__name__)

MESSAGE_CREATED = "im.message.created"
PANEL_UPDATED = "im.panel.updated"
ROOM_CLOSED = "im.room.closed"


def room_group(room_id: Any) -> str:
    return f"room_{str(room_id).replace('-', '')}"


def send_on_commit(group: str, event: dict) -> None:
    """Send ``event`` to ``group`` once the current transaction commits (now, outside one)."""

    # Failures are logged, never raised: the write is committed; a lost doorbell must not become an error.
    group_send_on_commit(group, {"type": "app.event", "event": event})


def message_data(message: Message) -> dict:
    return {
        "id": message.pk,
        "room_id": str(message.room_id),
        "seq": message.seq,
        "kind": message.kind,
        "author_user": message.author_user_id,
        "author_device": str(message.author_device_id) if message.author_device_id else None,
        "body": message.body,
        "created_at": message.created_at.isoformat(),
    }


def panel_data(panel: Panel) -> dict:
    return {
        "id": panel.pk,
        "room_id": str(panel.room_id),
        "message_id": panel.message_id,
        "kind": panel.kind,
        "spec": panel.spec,
        "state": panel.state,
        "ref_id": panel.ref_id,
        "updated_at": panel.updated_at.isoformat() if panel.updated_at else None,
    }


def message_created(message: Message) -> None:
    send_on_commit(room_group(message.room_id), {"type": MESSAGE_CREATED, "message": message_data(message)})


def panel_updated(panel: Panel) -> None:
    send_on_commit(room_group(panel.room_id), {"type": PANEL_UPDATED, "panel": panel_data(panel)})


def room_closed(room_id: Any) -> None:
    send_on_commit(room_group(room_id), {"type": ROOM_CLOSED, "room_id": str(room_id)})
