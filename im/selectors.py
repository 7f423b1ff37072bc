from __future__ import annotations

import uuid
from typing import Any

from django.db.models import QuerySet

from ai1net.exceptions import NotFound
from im.models import Message, Panel, Room


def rooms_for_user(*, user: Any) -> QuerySet[Room]:
    return Room.objects.filter(members__user=user).distinct()


def access_room(*, user: Any, room_id: Any) -> Room:
    """The room if ``user`` is a member; otherwise (or unknown) 404, the same for both."""
    try:
        room_uuid = uuid.UUID(str(room_id))
    except ValueError:
        raise NotFound("No such room.") from None
    room = Room.objects.filter(pk=room_uuid, members__user=user).first() if user.is_authenticated else None
    if room is None:
        raise NotFound("No such room.")
    return room


def messages_after(*, room: Room, after: int = 0, limit: int = 50) -> list[Message]:
    limit = max(1, min(int(limit), 200))
    return list(room.messages.filter(seq__gt=after).order_by("seq")[:limit])


def panels_for_room(*, room: Room) -> QuerySet[Panel]:
    return room.panels.order_by("id")


def access_panel(*, room: Room, panel_id: Any) -> Panel:
    try:
        pk = int(panel_id)
    except (TypeError, ValueError):
        raise NotFound("No such panel.") from None
    panel = Panel.objects.filter(pk=pk, room=room).first()
    if panel is None:
        raise NotFound("No such panel.")
    return panel
