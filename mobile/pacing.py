"""Pacing of phone -> agent messages (UserPromptSubmit injection, Stop keep-going), per session.

Four limits, from settings:
- no self-excitation: only a person's phone session creates a message (never a device or a token),
  a text that repeats the agent's own output in the session's room is refused (``agent_echo``), and
  the outbox item says ``author: "user"`` (the bridge injects nothing else, and drops a message that
  equals the agent's last output);
- a daily budget per session (``MOBILE_MESSAGE_DAILY_BUDGET``): the next one is refused, 429;
- a quiet period after each injection (``MOBILE_MESSAGE_QUIET_SEC``): nothing is released meanwhile;
- a rate (``MOBILE_MESSAGE_RATE`` per ``MOBILE_MESSAGE_RATE_WINDOW_SEC``): the excess waits, in order
  (state ``waiting``, with its position; at most ``MOBILE_MESSAGE_QUEUE_MAX`` wait).

A message is written ``waiting`` and released into the device's outbox (``queued``) by
``messages_release`` under the session row's lock. Release runs on send, on each consumption report,
when the bridge connects, when the phone reads its state, and from a timer at the moment the next
one is due (process-local; the other triggers cover a restart).
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import close_old_connections, transaction
from django.db.models import Max
from django.utils import timezone

from ai1net.exceptions import RateLimited, ValidationFailed
from devices.services import outbox_enqueue
from im.models import Message
from mobile import events
from mobile.models import AgentSession, PhoneMessage

logger = logging.getLogger(__name__)

OUTBOX_MESSAGE = "mobile.message"
ECHO_LOOKBACK = 50  # agent messages in the room compared with a new phone message


def _normal(text: str) -> str:
    return " ".join(str(text).split()).casefold()


def _agent_texts(session: AgentSession) -> set[str]:
    """What the agent itself said in the session's room lately (questions, its own messages)."""
    texts: set[str] = set()
    bodies = (Message.objects.filter(room_id=session.room_id, author_device__isnull=False)
              .order_by("-pk").values_list("body", flat=True)[:ECHO_LOOKBACK])
    for body in bodies:
        if not isinstance(body, dict):
            continue
        if isinstance(body.get("text"), str):
            texts.add(_normal(body["text"]))
        for question in body.get("questions") or []:
            if isinstance(question, dict) and isinstance(question.get("question"), str):
                texts.add(_normal(question["question"]))
    texts.discard("")
    return texts


def _midnight(now: datetime) -> datetime:
    return timezone.localtime(now).replace(hour=0, minute=0, second=0, microsecond=0)


def check_send(*, session: AgentSession, text: str) -> None:
    """Refuse before anything is stored: an echo of the agent, a spent budget, a full waiting line."""
    if _normal(text) in _agent_texts(session):
        raise ValidationFailed("This repeats the agent's own words; it is not sent back to it.", code="agent_echo")
    now = timezone.now()
    budget = settings.MOBILE_MESSAGE_DAILY_BUDGET
    today = PhoneMessage.objects.filter(session=session, created_at__gte=_midnight(now)).count()
    if today >= budget:
        raise RateLimited(f"This session takes at most {budget} messages a day from the phone.",
                          code="message_budget")
    waiting = PhoneMessage.objects.filter(session=session, state=PhoneMessage.State.WAITING).count()
    if waiting >= settings.MOBILE_MESSAGE_QUEUE_MAX:
        raise RateLimited(f"{waiting} messages already wait for this session; send more once they went out.",
                          code="message_queue_full")


def next_release_at(*, session: AgentSession, now: datetime | None = None) -> datetime:
    """When the next waiting message may go: after the quiet period and within the rate."""
    now = now or timezone.now()
    due = now
    last_injection = PhoneMessage.objects.filter(session=session, consumed_at__isnull=False).aggregate(
        last=Max("consumed_at"))["last"]
    if last_injection is not None:
        due = max(due, last_injection + timedelta(seconds=settings.MOBILE_MESSAGE_QUIET_SEC))
    window = timedelta(seconds=settings.MOBILE_MESSAGE_RATE_WINDOW_SEC)
    released = list(PhoneMessage.objects.filter(session=session, released_at__gt=now - window)
                    .order_by("-released_at").values_list("released_at", flat=True)[:settings.MOBILE_MESSAGE_RATE])
    if len(released) >= settings.MOBILE_MESSAGE_RATE:
        due = max(due, released[-1] + window)  # the oldest of the last RATE leaves the window
    return due


def messages_release(*, session: AgentSession) -> list[PhoneMessage]:
    """Release the waiting messages that are due, oldest first, into the device's outbox."""
    released: list[PhoneMessage] = []
    with transaction.atomic():
        locked = AgentSession.objects.select_for_update().select_related("device").get(pk=session.pk)
        while True:
            first = (PhoneMessage.objects.filter(session=locked, state=PhoneMessage.State.WAITING)
                     .order_by("created_at", "pk").first())
            if first is None:
                break
            now = timezone.now()
            if locked.state != AgentSession.State.OPEN or next_release_at(session=locked, now=now) > now:
                break
            PhoneMessage.objects.filter(pk=first.pk).update(state=PhoneMessage.State.QUEUED, released_at=now)
            first.state, first.released_at, first.session = PhoneMessage.State.QUEUED, now, locked
            outbox_enqueue(device=locked.device, kind=OUTBOX_MESSAGE, payload={
                "message_id": str(first.pk), "session_id": locked.session_id, "text": first.text,
                "author": "user"})
            events.message_updated(first, owner_id=locked.device.owner_id)
            released.append(first)
        waiting = list(PhoneMessage.objects.filter(session=locked, state=PhoneMessage.State.WAITING)
                       .order_by("created_at", "pk"))
        if waiting:
            due = next_release_at(session=locked)
            for position, message in enumerate(waiting, start=1):
                message.session = locked
                events.message_updated(message, owner_id=locked.device.owner_id,
                                       extra={"position": position, "release_at": due.isoformat()})
            transaction.on_commit(lambda: _release_later(locked.pk, due))
    return released


def waiting_info(*, message: PhoneMessage) -> dict[str, Any]:
    """The phone's view of a waiting message: its place in line and when the first one goes."""
    if message.state != PhoneMessage.State.WAITING:
        return {}
    ahead = PhoneMessage.objects.filter(session_id=message.session_id, state=PhoneMessage.State.WAITING,
                                        created_at__lt=message.created_at).count()
    return {"position": ahead + 1, "release_at": next_release_at(session=message.session).isoformat()}


def sessions_release_due(*, sessions: Any) -> int:
    """Release for each of these sessions that has messages waiting (phone reads, a bridge connects)."""
    count = 0
    waiting = (AgentSession.objects.filter(pk__in=sessions.values("pk"), state=AgentSession.State.OPEN,
                                           phone_messages__state=PhoneMessage.State.WAITING).distinct())
    for session in waiting:
        count += len(messages_release(session=session))
    return count


# --- the timer ----------------------------------------------------------------------------------

_timers: dict[int, threading.Timer] = {}
_timers_lock = threading.Lock()


def _release_later(session_pk: int, due: datetime) -> None:
    if not getattr(settings, "MOBILE_MESSAGE_TIMER", True):
        return
    delay = max(0.05, (due - timezone.now()).total_seconds() + 0.05)

    def fire() -> None:
        with _timers_lock:
            _timers.pop(session_pk, None)
        try:
            session = AgentSession.objects.filter(pk=session_pk).first()
            if session is not None:
                messages_release(session=session)
        except Exception:
            logger.exception("releasing the waiting messages of session %s failed", session_pk)
        finally:
            close_old_connections()

    timer = threading.Timer(delay, fire)
    timer.daemon = True
    with _timers_lock:
        older = _timers.pop(session_pk, None)
        if older is not None:
            older.cancel()
        _timers[session_pk] = timer
    timer.start()
