from __future__ import annotations

import functools
import uuid
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, Q
from django.utils import timezone

from ai1net.accounts.selectors import mobile_reply_active
from devices.models import Device
from mobile.events import question_data, session_data
from mobile.models import AgentSession, PhoneMessage, Question

RECENT = timedelta(minutes=30)


# --- one question with its session and device, for the answer POST --------------------------------

_JOINED = ((Question, "q"), (AgentSession, "s"), (Device, "d"))


@functools.cache
def _own_question_plan(vendor: str) -> tuple[str, list[list[tuple[Any, list]]]]:
    """The SELECT (question JOIN session JOIN device, scoped by owner) and, per model, each column's
    converters from the database's value to the field's (as the ORM applies them)."""
    qn = connection.ops.quote_name
    columns, plan = [], []
    for model, alias in _JOINED:
        fields = []
        for field in model._meta.concrete_fields:
            columns.append(f"{alias}.{qn(field.column)}")
            col = field.get_col(model._meta.db_table)
            fields.append((field, connection.ops.get_db_converters(col) + col.get_db_converters(connection), col))
        plan.append(fields)
    q, s, d = (model._meta for model, _ in _JOINED)
    # Names from the models' _meta, values as parameters.
    sql = (f"SELECT {', '.join(columns)} FROM {qn(q.db_table)} q"  # noqa: S608
           f" JOIN {qn(s.db_table)} s ON s.{qn(s.pk.column)} = q.{qn(q.get_field('session').column)}"
           f" JOIN {qn(d.db_table)} d ON d.{qn(d.pk.column)} = q.{qn(q.get_field('device').column)}"
           f" WHERE q.{qn(q.pk.column)} = %s AND d.{qn(d.get_field('owner').column)} = %s")
    return sql, plan


def own_question(*, user: Any, question_id: uuid.UUID) -> Question | None:
    """``Question.objects.select_related("session", "device").filter(pk=…, device__owner=user).first()``
    as one statement written out once: on the answer POST, Django compiling that query cost more than the
    database took to run it (bench/roundtrip.py)."""
    conn = transaction.get_connection()  # looked up once (each use of the ``connection`` proxy looks it up)
    sql, plan = _own_question_plan(conn.vendor)
    with conn.cursor() as cursor:
        cursor.execute(sql, [Question._meta.pk.get_db_prep_value(question_id, conn), user.pk])
        row = cursor.fetchone()
    if row is None:
        return None
    instances, at = [], 0
    for (model, _), fields in zip(_JOINED, plan, strict=True):
        values = []
        for _field, converters, col in fields:
            value = row[at]
            at += 1
            for converter in converters:
                value = converter(value, col, conn)
            values.append(value)
        instances.append(model.from_db(conn.alias, [f.attname for f, _, _ in fields], values))
    question, session, device = instances
    question.session, question.device = session, device
    return question


def pending_questions(*, user: Any) -> list[dict]:
    """The user's waiting questions, each with the nonce the phone must present."""
    from mobile.services import nonce_for  # the derivation lives with the writes

    questions = (Question.objects.select_related("session")
                 .filter(device__owner=user, state=Question.State.PENDING, expires_at__gt=timezone.now())
                 .order_by("created_at"))
    return [question_data(q, nonce=nonce_for(q)) for q in questions[:100]]


def recent_questions(*, user: Any) -> list[dict]:
    """Questions settled lately, so the page can say plainly what became of them."""
    questions = (Question.objects.select_related("session")
                 .filter(device__owner=user, created_at__gte=timezone.now() - RECENT)
                 .exclude(state=Question.State.PENDING).order_by("-created_at"))
    return [question_data(q) for q in questions[:50]]


def open_sessions(*, user: Any) -> list[dict]:
    sessions = list(AgentSession.objects.filter(device__owner=user, state=AgentSession.State.OPEN,
                                                device__status=Device.Status.ACTIVE).order_by("-created_at")[:50])
    waiting: dict[int, list[dict]] = {}
    for message in (PhoneMessage.objects.filter(session__in=sessions, state=PhoneMessage.State.WAITING)
                    .order_by("created_at", "pk")):
        line = waiting.setdefault(message.session_id, [])
        line.append({"message_id": str(message.pk), "text": message.text, "position": len(line) + 1})
    return [{**session_data(s), "waiting_messages": waiting.get(s.pk, [])} for s in sessions]


def queue_depth(*, user: Any) -> int:
    waiting = Question.objects.filter(device__owner=user, state=Question.State.PENDING,
                                      expires_at__gt=timezone.now()).count()
    queued = PhoneMessage.objects.filter(session__device__owner=user).exclude(
        state=PhoneMessage.State.CONSUMED).count()
    return waiting + queued


def today_counts(*, user: Any) -> dict[str, int]:
    """Today's questions (since local midnight): asked, and how each was settled."""
    now = timezone.now()
    midnight = timezone.localtime(now).replace(hour=0, minute=0, second=0, microsecond=0)
    decided_today = Q(decided_at__gte=midnight)
    states = Question.State
    # Expiry is written lazily: a pending question whose time is up counts as expired already.
    expired = Q(expires_at__gte=midnight) & (Q(state=states.EXPIRED) | Q(state=states.PENDING, expires_at__lte=now))
    return Question.objects.filter(device__owner=user).aggregate(
        asked=Count("pk", filter=Q(created_at__gte=midnight)),
        answered_on_phone=Count("pk", filter=decided_today & Q(state=states.ANSWERED)),
        answered_on_desktop=Count("pk", filter=decided_today & Q(state=states.ANSWERED_ON_DESKTOP)),
        moved_to_desktop=Count("pk", filter=decided_today & Q(state=states.MOVED_TO_DESKTOP)),
        expired=Count("pk", filter=expired),
    )


def mobile_state(*, user: Any) -> dict:
    bridges = Device.objects.filter(owner=user, kind=Device.Kind.BRIDGE, status=Device.Status.ACTIVE)
    return {
        "mobile_reply": mobile_reply_active(user),
        "global_stop": not settings.MOBILE_REPLY_ENABLED,
        "bridges": [
            {"device_id": str(d.pk), "name": d.name, "online": d.is_online,
             "last_seen_at": d.last_seen_at.isoformat() if d.last_seen_at else None}
            for d in bridges
        ],
        "queue_depth": queue_depth(user=user),
        "sessions": open_sessions(user=user),
        "today": today_counts(user=user),
    }
