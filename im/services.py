"""Writes for rooms, messages and panels. Events leave through im.events after commit."""

from __future__ import annotations

import functools
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from ai1net import sql
from ai1net.exceptions import Conflict, NotFound, ValidationFailed
from ai1net.limits import enforce
from clients.limits import LIMITS
from im import events, panels
from im.models import Message, Panel, PanelAction, Room, RoomMember
from im.selectors import access_panel, access_room

MAX_TEXT_CHARS = LIMITS["room.text"].max  # declared in clients.limits


def room_create(*, kind: str, owner: Any, device: Any = None, agent_session_id: str = "", title: str = "") -> Room:
    with transaction.atomic():
        room = Room.objects.create(kind=kind, owner=owner, device=device, agent_session_id=agent_session_id,
                                   title=title[:200])
        RoomMember.objects.create(room=room, user=owner)
    return room


def _get_or_create_room(*, lookup: dict, create: dict) -> tuple[Room, bool]:
    """``lookup`` names at most one room (a unique constraint per kind): it is read by a statement written once
    (``sql.one_by``), as each probe command's outcome and each agent session's start ask."""
    room = sql.one_by(Room, **lookup)
    if room is not None:
        return room, False
    try:
        with transaction.atomic():
            return room_create(**create), True
    except IntegrityError:  # a concurrent caller created it first
        return Room.objects.get(**lookup), False


def room_open_for_session(*, owner: Any, device: Any, agent_session_id: str, title: str = "") -> Room:
    """The agent session's room, created on first use and reopened if a resumed session comes back."""
    room, created = _get_or_create_room(
        lookup={"kind": Room.Kind.AGENT_SESSION, "device": device, "agent_session_id": agent_session_id},
        create={"kind": Room.Kind.AGENT_SESSION, "owner": owner, "device": device,
                "agent_session_id": agent_session_id, "title": title},
    )
    if not created:
        changes: dict[str, Any] = {}
        if room.state != Room.State.OPEN:
            changes.update(state=Room.State.OPEN, closed_at=None)
        if title and title != room.title:
            changes["title"] = title[:200]
        if changes:
            Room.objects.filter(pk=room.pk).update(**changes)
            room.refresh_from_db()
    return room


def room_close(*, room: Room) -> Room:
    if Room.objects.filter(pk=room.pk, state=Room.State.OPEN).update(state=Room.State.CLOSED,
                                                                       closed_at=timezone.now()):
        events.room_closed(room.pk)
    room.refresh_from_db()
    return room


def room_get_or_create_studio(*, user: Any, device: Any) -> Room:
    """The user's Studio room for one device (probes post their results here)."""
    room, _ = _get_or_create_room(
        lookup={"kind": Room.Kind.STUDIO, "owner": user, "device": device},
        create={"kind": Room.Kind.STUDIO, "owner": user, "device": device, "title": f"Studio: {device.name}"},
    )
    return room


def _next_seq(room_id: Any) -> int:
    """Take the room's next message seq: one UPDATE on the room row (it holds the row's lock, PostgreSQL,
    or the write lock, SQLite, until commit, so writers queue, never collide), returning the value where
    the database can (PostgreSQL, SQLite >= 3.35), else an UPDATE and a SELECT."""
    conn = transaction.get_connection()
    if conn.features.can_return_columns_from_insert:
        meta, qn = Room._meta, conn.ops.quote_name
        # Names from the model's _meta, the value as a parameter.
        sql = (f"UPDATE {qn(meta.db_table)} SET {qn('next_seq')} = {qn('next_seq')} + 1 "  # noqa: S608
               f"WHERE {qn(meta.pk.column)} = %s RETURNING {qn('next_seq')}")
        with conn.cursor() as cursor:
            cursor.execute(sql, [meta.pk.get_db_prep_value(room_id, conn)])
            row = cursor.fetchone()
        if row is None:
            raise NotFound("No such room.")
        return int(row[0]) - 1
    if not Room.objects.filter(pk=room_id).update(next_seq=F("next_seq") + 1):
        raise NotFound("No such room.")
    return Room.objects.values_list("next_seq", flat=True).get(pk=room_id) - 1


_POST_SQL: dict[tuple[str, bool], str] = {}  # (vendor, with a panel's state) -> the statement
_POST_FIELDS = ("room", "author_user", "author_device", "kind", "body", "created_at")
_PANEL_RETURNED = ("room_id", "message_id", "kind", "spec", "ref_id", "created_at")


def _panel_state_sql(conn: Any) -> str:
    meta, qn = Panel._meta, conn.ops.quote_name
    # Names from the model's _meta, values as parameters.
    return (f"UPDATE {qn(meta.db_table)} SET {qn('state')} = %s, {qn('updated_at')} = %s "  # noqa: S608
            f"WHERE {qn(meta.pk.column)} = %s "
            f"RETURNING {', '.join(qn(meta.get_field(n).column) for n in _PANEL_RETURNED)}")


def _panel_state_params(conn: Any, panel_id: int, state: str, now: datetime) -> list[Any]:
    return [state, Panel._meta.get_field("updated_at").get_db_prep_value(now, conn), panel_id]


@functools.cache
def _panel_returned_plan(vendor: str) -> list[tuple[str, list, Any]]:
    """Each column the panel's UPDATE returns: its attribute, its database converters and its column (from
    ``sql.row_plan``, built once: building them cost more than the conversions, on every answer's event)."""
    by_attname = {field.attname: (field.attname, converters, column)
                  for field, converters, column in sql.row_plan(vendor, Panel)}
    return [by_attname[Panel._meta.get_field(name).attname] for name in _PANEL_RETURNED]


def _panel_from_row(conn: Any, panel_id: int, state: str, now: datetime, row: tuple) -> Panel:
    """The panel whose state was set, from the columns its UPDATE returned (as the ORM converts them)."""
    values = {}
    for (attname, converters, column), value in zip(_panel_returned_plan(conn.vendor), row, strict=True):
        for converter in converters:
            value = converter(value, column, conn)
        values[attname] = value
    return Panel(pk=panel_id, state=state, updated_at=now, **values)


def _insert_with_seq_postgresql(conn: Any, message: Message, panel_state: tuple[int, str] | None) -> None:
    """``_next_seq`` and the message's INSERT as one PostgreSQL statement (a data-modifying CTE): one round
    trip fewer on every question and answer. The room row's lock is taken as before; no room, no row.
    With ``panel_state`` the panel's UPDATE rides along too. The message's events are sent (on commit) when
    its row is back: at once, or in a pipeline (``sql.pipelined``) when that ends."""
    key = (conn.vendor, panel_state is not None)
    statement = _POST_SQL.get(key)
    room, meta, quote = Room._meta, Message._meta, conn.ops.quote_name
    fields = [meta.get_field(name) for name in _POST_FIELDS]
    if statement is None:
        next_seq = quote(room.get_field("next_seq").column)
        columns = ", ".join(quote(field.column) for field in fields)
        # Names from the models' _meta, values as parameters.
        post = (f"WITH r AS (UPDATE {quote(room.db_table)} SET {next_seq} = {next_seq} + 1"  # noqa: S608
                f" WHERE {quote(room.pk.column)} = %s RETURNING {next_seq} - 1 AS seq)"
                f" INSERT INTO {quote(meta.db_table)} ({columns}, {quote(meta.get_field('seq').column)})"
                f" SELECT {', '.join(['%s'] * len(fields))}, r.seq FROM r RETURNING {quote(meta.pk.column)}, "
                f"{quote(meta.get_field('seq').column)}")
        if panel_state is not None:  # the INSERT as a CTE too: only a SELECT can return both rows
            head, insert = post.split(" INSERT INTO ", 1)
            post = (f"{head}, m AS (INSERT INTO {insert}), p AS ({_panel_state_sql(conn)}) "  # noqa: S608
                    f"SELECT m.*, p.* FROM m LEFT JOIN p ON true")
        statement = _POST_SQL[key] = post
    params = [room.pk.get_db_prep_value(message.room_id, conn)]
    params += [field.get_db_prep_save(getattr(message, field.attname), conn) for field in fields]
    now = timezone.now()
    if panel_state is not None:
        params += _panel_state_params(conn, panel_state[0], panel_state[1], now)

    def posted(row: Any) -> None:
        if row is None:
            raise NotFound("No such room.")
        message.pk, message.seq = row[0], int(row[1])
        message._state.adding, message._state.db = False, conn.alias
        events.message_created(message)  # the message's event first, then its panel's
        if panel_state is not None and row[2] is not None:  # (a panel's room_id is never null: null is none)
            events.panel_updated(_panel_from_row(conn, panel_state[0], panel_state[1], now, row[2:]))

    sql.run(conn, statement, params, posted)


def message_post(*, room: Room | None = None, room_id: Any = None, author_user: Any = None,
                 author_device: Any = None, kind: str, body: dict,
                 panel_state: tuple[int, str] | None = None) -> Message:
    """Append a message to ``room`` (or the room ``room_id``, unread); its seq comes from one UPDATE on
    the room row. Two statements, no savepoint: a failure fails the caller's transaction (one statement
    on PostgreSQL, whose seq and key, in a pipeline, the message has when that ends). ``panel_state``:
    (panel id, state) to set in the same write, as ``panel_state_set_by_id`` sets it; on PostgreSQL in
    the same statement."""
    if kind not in Message.Kind.values:
        raise ValidationFailed(f"Unknown message kind {kind!r}.")
    if author_user is not None and author_device is not None:
        raise ValidationFailed("A message has one author.")
    room_id = room.pk if room is not None else room_id
    with transaction.atomic(savepoint=False):
        conn = transaction.get_connection()
        if conn.vendor == "postgresql":
            message = Message(room_id=room_id, author_user=author_user, author_device=author_device, kind=kind,
                              body=body, created_at=timezone.now())
            _insert_with_seq_postgresql(conn, message, panel_state)
            return message
        seq = _next_seq(room_id)
        message = sql.insert(Message(room_id=room_id, seq=seq, author_user=author_user,
                                     author_device=author_device, kind=kind, body=body))
        # Both events leave on commit, the message's first; the panel's UPDATE is in this write too.
        events.message_created(message)
        if panel_state is not None:
            panel_state_set_by_id(panel_id=panel_state[0], state=panel_state[1])
    return message


def text_post(*, actor: Any, room_id: Any, text: str) -> Message:
    room = access_room(user=actor, room_id=room_id)
    text = (text or "").strip()
    if not text:
        raise ValidationFailed("Write something first.")
    enforce("room.text", text, "text")
    if not room.is_open:
        raise Conflict("This room is closed.", code="room_closed")
    return message_post(room=room, author_user=actor, kind=Message.Kind.TEXT, body={"text": text})


def panel_create(*, room: Room | None = None, room_id: Any = None, kind: str, spec: dict,
                 message: Message | None = None, ref_id: str = "", state: str = "open") -> Panel:
    panel = sql.insert(Panel(room_id=room.pk if room is not None else room_id, message=message, kind=kind,
                             spec=spec, ref_id=ref_id, state=state))
    events.panel_updated(panel)
    return panel


def panel_state_set(*, panel: Panel, state: str, spec_update: dict | None = None) -> Panel:
    panel.state = state
    if spec_update:
        panel.spec = {**panel.spec, **spec_update}
    panel.save(update_fields=["state", "spec", "updated_at"])
    events.panel_updated(panel)
    return panel


def panel_state_set_by_id(*, panel_id: int, state: str, spec_update: dict | None = None) -> Panel | None:
    """``panel_state_set`` for a panel not loaded yet: one UPDATE returning the row the event needs
    (PostgreSQL, SQLite >= 3.35) when the spec stays as it is; None when there is no such panel."""
    conn = transaction.get_connection()
    if spec_update or not conn.features.can_return_columns_from_insert:
        panel = Panel.objects.filter(pk=panel_id).first()
        return panel_state_set(panel=panel, state=state, spec_update=spec_update) if panel is not None else None
    now = timezone.now()
    with conn.cursor() as cursor:
        cursor.execute(_panel_state_sql(conn), _panel_state_params(conn, panel_id, state, now))
        row = cursor.fetchone()
    if row is None:
        return None
    panel = _panel_from_row(conn, panel_id, state, now, row)
    events.panel_updated(panel)
    return panel


def panel_act(*, actor: Any, room_id: Any, panel_id: Any, action: str, data: dict) -> dict:
    """Run ``action`` on a panel as ``actor`` (always the session user) through the kind's handler."""
    room = access_room(user=actor, room_id=room_id)
    panel = access_panel(room=room, panel_id=panel_id)
    handler = panels.handler_for(panel.kind)
    if handler is None:
        raise NotFound("This panel takes no actions.", code="no_handler")
    if not isinstance(data, dict):
        raise ValidationFailed("data must be an object.")
    # The handler owns its transaction (and audits its refusals), so it is not wrapped here.
    result = handler(actor=actor, panel=panel, action=action, data=data)
    # Secrets in the payload (a burned nonce) are not kept.
    kept = {key: value for key, value in data.items() if key != "nonce"}
    PanelAction.objects.create(panel=panel, actor=actor, action=action, data=kept)
    return result
