"""Mobile reply writes: sessions, questions with one-time nonces, answers, phone messages, the switch.

Device-facing services take the authenticated ``device`` (from its token, via the tunnel);
phone-facing services take ``actor`` (the session user). Neither trusts an identity in a body.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import json
import secrets
import uuid
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from ai1net import sql
from ai1net.accounts.selectors import mobile_reply_active
from ai1net.accounts.services import audit_record, hash_secret
from ai1net.exceptions import (
    ApplicationError,
    Conflict,
    Forbidden,
    Gone,
    NotFound,
    ValidationFailed,
)
from ai1net.limits import enforce, enforce_questions
from clients.limits import LIMITS
from devices.models import Device
from devices.services import outbox_enqueue
from im import services as im_services
from im.models import Message, Room
from mobile import events, pacing, selectors
from mobile.models import AgentSession, Answer, BridgeSwitchSent, PhoneMessage, Question

# The hook gives up after window_sec; the question stays answerable a moment longer so an answer
# sent at the last second is not refused while the hook is still reading its queue.
EXPIRY_SLACK = timedelta(seconds=2)
MAX_WINDOW_SEC = 3600
MAX_TEXT_CHARS = LIMITS["message.text"].max  # declared in clients.limits
MOVED_REASONS = ("timeout", "switch_off", "hook_gone")

OUTBOX_ANSWER = "mobile.answer"
OUTBOX_QUESTION_CLOSED = "mobile.question_closed"
OUTBOX_MESSAGE = "mobile.message"
OUTBOX_KEEP_GOING = "mobile.keep_going"
OUTBOX_SWITCH = "mobile.switch"


class MobileReplyOff(ApplicationError):
    code = "mobile_reply_off"
    status = 409
    default_detail = "Mobile reply is off for this user."


# --- the nonce ---------------------------------------------------------------------------------


def nonce_for(question: Question) -> str:
    """The question's 128-bit nonce: HMAC(server key, id + random salt). Only its hash is stored;
    the owner's /pending re-derives it, so a database dump alone cannot answer anything."""
    message = f"ai1net.mobile.nonce:{question.pk}:{question.nonce_salt}".encode()
    digest = hmac.new(settings.SECRET_KEY.encode(), message, hashlib.sha256).digest()[:16]
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _audit(*, actor: Any, action: str, question: Question | None = None, subject: Any = None, data: dict,
           ip: str | None = None) -> None:
    """Audit in the caller's transaction; device actions have no actor, their subject is the owner."""
    if question is not None:
        data = {"question_id": str(question.pk), **data}
        subject = subject or question.device.owner
    audit_record(actor=actor, action=action, subject=subject, data=data, ip=ip)


# --- validation --------------------------------------------------------------------------------


def _clean_questions(questions: Any) -> list[dict]:
    """The AskUserQuestion contract: 1-4 questions, each with header and 2-4 labelled options."""
    enforce_questions(questions)  # every size from clients.limits, before the shape
    if not isinstance(questions, list) or not 1 <= len(questions) <= 4:
        raise ValidationFailed("questions must be a list of 1 to 4 questions.")
    texts: set[str] = set()
    for item in questions:
        if not isinstance(item, dict):
            raise ValidationFailed("Each question must be an object.")
        text = item.get("question")
        if not isinstance(text, str) or not text.strip():
            raise ValidationFailed("Each question needs its text.")
        if text in texts:
            raise ValidationFailed(f"The question {text!r} is asked twice.")
        texts.add(text)
        if not isinstance(item.get("header", ""), str) or not isinstance(item.get("multiSelect", False), bool):
            raise ValidationFailed(f"The question {text!r} has a bad header or multiSelect.")
        options = item.get("options")
        if not isinstance(options, list) or not 2 <= len(options) <= 4:
            raise ValidationFailed(f"The question {text!r} needs 2 to 4 options.")
        labels = [option.get("label") if isinstance(option, dict) else None for option in options]
        if any(not isinstance(label, str) or not label for label in labels) or len(set(labels)) != len(labels):
            raise ValidationFailed(f"The options of {text!r} need distinct labels.")
    return questions


def _clean_answer(questions: list[dict], answers: Any, other: Any) -> tuple[dict[str, list[str]], dict[str, str]]:
    """Check a phone answer against the question as asked; every question needs labels, text or both."""
    if not isinstance(answers, dict):
        raise ValidationFailed("answers must map question text to labels.")
    if other is None:
        other = {}
    if not isinstance(other, dict):
        raise ValidationFailed("other must map question text to free text.")
    enforce("answer.answers", answers, "answers")
    enforce("answer.answers", other, "other")
    by_text = {q["question"]: q for q in questions}
    for text in [*answers, *other]:
        if text not in by_text:
            raise ValidationFailed(f"There is no question {text!r}.", code="unknown_question")
    chosen: dict[str, list[str]] = {}
    free: dict[str, str] = {}
    for text, question in by_text.items():
        raw = answers.get(text, [])
        labels = [raw] if isinstance(raw, str) else raw
        if not isinstance(labels, list) or not all(isinstance(label, str) for label in labels):
            raise ValidationFailed(f"The answer to {text!r} must be a list of labels.")
        enforce("answer.labels", labels, f"answers[{text!r}]")
        labels = list(dict.fromkeys(labels))
        known = [option["label"] for option in question["options"]]
        for label in labels:
            if label not in known:
                raise ValidationFailed(f"{label!r} is not an option of {text!r}.", code="unknown_label")
        if len(labels) > 1 and not question.get("multiSelect", False):
            raise ValidationFailed(f"{text!r} takes one option.", code="single_select")
        note = other.get(text, "")
        if not isinstance(note, str):
            raise ValidationFailed(f"The other answer to {text!r} must be text.")
        enforce("answer.other", note, f"other[{text!r}]")
        note = note.strip()
        if not labels and not note:
            raise ValidationFailed(f"{text!r} has no answer yet.", code="unanswered")
        chosen[text] = labels
        if note:
            free[text] = note
    return chosen, free


# --- sessions (device side) -------------------------------------------------------------------


def _require_bridge(device: Device) -> None:
    if device.kind != Device.Kind.BRIDGE or device.status != Device.Status.ACTIVE:
        raise Forbidden("Only an active bridge takes part in mobile reply.")


def session_start(*, device: Device, session_id: str, cwd: str = "", source: str = "", host: str = "",
                  title: str = "") -> dict:
    """Register an agent session (idempotent per session_id) and open its room."""
    _require_bridge(device)
    if not isinstance(session_id, str) or not session_id or len(session_id) > 200:
        raise ValidationFailed("session_id is required.")
    title = (title or "").strip() or (cwd.rstrip("/").rsplit("/", 1)[-1] if cwd else "") or "Agent session"
    with transaction.atomic():
        room = im_services.room_open_for_session(owner=device.owner, device=device, agent_session_id=session_id,
                                                 title=title)
        session, created = AgentSession.objects.get_or_create(
            device=device, session_id=session_id,
            defaults={"room": room, "cwd": cwd[:1000], "host": host[:255], "source": source[:32], "title": title[:200]},
        )
        if not created and session.state != AgentSession.State.OPEN:
            AgentSession.objects.filter(pk=session.pk).update(state=AgentSession.State.OPEN, ended_at=None,
                                                              end_reason="", source=source[:32])
            session.refresh_from_db()
        events.session_updated(session, owner_id=device.owner_id)
    return {"room_id": str(room.pk), "mobile_reply": mobile_reply_active(device.owner)}


def session_end(*, device: Device, session_id: str, reason: str = "") -> dict:
    """The session is over: its room closes, waiting questions are cancelled, the phone is told."""
    _require_bridge(device)
    session = AgentSession.objects.filter(device=device, session_id=session_id).select_related("room").first()
    if session is None:
        return {}
    now = timezone.now()
    with transaction.atomic():
        ended = AgentSession.objects.filter(pk=session.pk, state=AgentSession.State.OPEN).update(
            state=AgentSession.State.ENDED, ended_at=now, end_reason=str(reason)[:64])
        waiting = list(Question.objects.filter(session=session, state=Question.State.PENDING))
        Question.objects.filter(pk__in=[q.pk for q in waiting], state=Question.State.PENDING).update(
            state=Question.State.CANCELLED, state_reason="session_ended", decided_at=now)
        for question in waiting:
            question.refresh_from_db()
            question.session = session
            _panel_follow(question)
            outbox_enqueue(device=device, kind=OUTBOX_QUESTION_CLOSED,
                           payload={"question_id": str(question.pk), "state": question.state})
            events.question_updated(question, owner_id=device.owner_id)
        if ended:
            im_services.room_close(room=session.room)
            session.refresh_from_db()
            events.session_updated(session, owner_id=device.owner_id)
            _audit(actor=None, action="mobile.session_end", subject=device.owner,
                   data={"device_id": str(device.pk), "session_id": session_id, "reason": str(reason)[:64],
                         "cancelled": [str(q.pk) for q in waiting]})
    return {}


HOOK_EVENTS = {
    "PostToolUse": "The agent received the answer.",
    "Stop": "The agent finished its turn.",
}


def hook_event_record(*, device: Device, session_id: str, event: str, tool_use_id: str = "") -> dict:
    """A hook the agent host ran (PostToolUse, Stop) shows in the session's room as an event."""
    _require_bridge(device)
    if event not in HOOK_EVENTS:
        raise ValidationFailed(f"event must be one of {', '.join(sorted(HOOK_EVENTS))}.")
    session = AgentSession.objects.filter(device=device, session_id=session_id).select_related("room").first()
    if session is None or session.room is None:
        return {"recorded": False}
    im_services.message_post(room=session.room, author_device=device, kind="event",
                             body={"event": event, "tool_use_id": tool_use_id, "text": HOOK_EVENTS[event]})
    return {"recorded": True}


def _session_for_question(device: Device, session_id: str) -> AgentSession:
    session = sql.one_by(AgentSession, device=device, session_id=session_id)  # unique together
    if session is None:  # the bridge was installed mid-session: register it now
        session_start(device=device, session_id=session_id)
        session = AgentSession.objects.get(device=device, session_id=session_id)
    if session.state != AgentSession.State.OPEN:
        raise Gone("This agent session has ended.", code="session_ended")
    return session


# --- questions (device side) ------------------------------------------------------------------


def question_create(*, device: Device, question_id: str, session_id: str, questions: Any, window_sec: Any,
                    tool_use_id: str = "", permission: dict | None = None) -> dict:
    """Store an AskUserQuestion with a fresh nonce, post its panel, push it to the phone.

    Idempotent per device-chosen ``question_id``: a retry returns the stored question's state.
    ``permission``: the extra fields of a tool-permission request (from ``mobile.permissions``).
    """
    _require_bridge(device)
    try:
        qid = uuid.UUID(str(question_id))
    except ValueError:
        raise ValidationFailed("question_id must be a UUID.") from None
    existing = sql.one_by(Question, id=qid)
    if existing is not None:
        if existing.device_id != device.pk:
            raise ValidationFailed("question_id is already in use.")
        return _question_reply(existing)
    if not mobile_reply_active(device.owner):
        raise MobileReplyOff()
    questions = _clean_questions(questions)
    if isinstance(window_sec, bool) or not isinstance(window_sec, int | float) or not 1 <= window_sec <= MAX_WINDOW_SEC:
        raise ValidationFailed(f"window_sec must be between 1 and {MAX_WINDOW_SEC}.")
    session = _session_for_question(device, session_id)
    now = timezone.now()
    # No savepoint of its own: a failure fails the caller's transaction (the device request's).
    with transaction.atomic(savepoint=False):
        question = Question(
            id=qid, device=device, session=session, room_id=session.room_id, tool_use_id=str(tool_use_id)[:200],
            questions=questions, nonce_salt=secrets.token_hex(16), window_sec=int(window_sec),
            expires_at=now + timedelta(seconds=float(window_sec)) + EXPIRY_SLACK, **(permission or {}),
        )
        nonce = nonce_for(question)
        question.nonce_hash = hash_secret(nonce)
        try:
            with transaction.atomic():
                question.save(force_insert=True)
        except IntegrityError:  # the same question_id raced in under another request id: it stands
            existing = Question.objects.select_related("device").get(pk=qid)
            if existing.device_id != device.pk:
                raise ValidationFailed("question_id is already in use.") from None
            return _question_reply(existing)
        message = im_services.message_post(room_id=session.room_id, author_device=device,
                                           kind=Message.Kind.QUESTION, body={"question_id": str(qid),
                                                                             "questions": questions})
        panel = im_services.panel_create(room_id=session.room_id, message=message, kind="mobile.question",
                                         ref_id=str(qid),
                                         state=Question.State.PENDING,
                                         spec={"question_id": str(qid), "session_id": session_id,
                                               "questions": questions, "expires_at": question.expires_at.isoformat(),
                                               **({"permission": permission} if permission else {})})
        sql.update_by(Question, {"panel": panel}, id=qid)
        question.panel = panel
        question.session = session
        # Last before the commit: the audit chain's lock is held from here to the commit.
        _audit(actor=None, action="mobile.question", question=question, subject=device.owner,
               data={"device_id": str(device.pk), "session_id": session_id, "window_sec": int(window_sec)})
        events.question_created(question, owner_id=device.owner_id, nonce=nonce)
    return _question_reply(question)


def _question_reply(question: Question) -> dict:
    return {"question_id": str(question.pk), "state": question.state, "expires_at": question.expires_at.isoformat(),
            "mobile_reply": mobile_reply_active(question.device.owner)}


def _panel_follow(question: Question) -> None:
    if question.panel_id:
        reason = {"reason": question.state_reason} if question.state_reason else None
        im_services.panel_state_set_by_id(panel_id=question.panel_id, state=question.state, spec_update=reason)


def question_move(*, device: Device, question_id: str, reason: str) -> dict:
    """The hook gave up waiting (timeout, switch off, killed): the question now belongs to the desk."""
    _require_bridge(device)
    if reason not in MOVED_REASONS:
        raise ValidationFailed(f"reason must be one of {', '.join(MOVED_REASONS)}.")
    question = _device_question(device, question_id)
    with transaction.atomic():
        moved = Question.objects.filter(pk=question.pk, state=Question.State.PENDING).update(
            state=Question.State.MOVED_TO_DESKTOP, state_reason=reason, decided_at=timezone.now())
        question.refresh_from_db()
        if moved:
            _panel_follow(question)
            _audit(actor=None, action="mobile.question_moved", question=question,
                   data={"device_id": str(device.pk), "reason": reason})
            events.question_updated(question, owner_id=device.owner_id)
    return {"state": question.state}


def _device_question(device: Device, question_id: Any) -> Question:
    try:
        qid = uuid.UUID(str(question_id))
    except ValueError:
        raise NotFound("No such question.") from None
    question = Question.objects.select_related("session").filter(pk=qid, device=device).first()
    if question is None:
        raise NotFound("No such question.")
    return question


def _split_desktop_value(question: dict, value: Any) -> tuple[list[str], str]:
    """'A, B' from the desk back to labels; what matches no label is kept as free text."""
    if isinstance(value, list):
        parts = [str(v) for v in value]
    else:
        value = str(value)
        known = {option["label"] for option in question["options"]}
        if value in known:
            return [value], ""
        parts = [part.strip() for part in value.split(", ")]
    known = {option["label"] for option in question["options"]}
    labels = [part for part in parts if part in known]
    rest = [part for part in parts if part not in known and part]
    return labels, ", ".join(rest)


def desktop_answer_record(*, device: Device, session_id: str, tool_use_id: str = "", question_id: Any = None,
                          answers: Any = None) -> dict:
    """PostToolUse saw an answer given at the desk. First answer wins: a phone answer stays."""
    _require_bridge(device)
    query = Question.objects.select_related("session").filter(device=device)
    if question_id:
        try:
            query = query.filter(pk=uuid.UUID(str(question_id)))
        except ValueError:
            raise ValidationFailed("question_id must be a UUID.") from None
    elif tool_use_id:
        query = query.filter(session__session_id=session_id, tool_use_id=str(tool_use_id))
    else:
        raise ValidationFailed("question_id or tool_use_id is required.")
    question = query.order_by("-created_at").first()
    if question is None:
        return {"state": "unknown"}
    answers = answers if isinstance(answers, dict) else {}
    enforce("answer.answers", answers, "answers")
    for text, value in answers.items():
        enforce("answer.desktop", value if isinstance(value, str) else json.dumps(value), f"answers[{text!r}]")
    with transaction.atomic():
        taken = Question.objects.filter(
            pk=question.pk,
            state__in=[Question.State.PENDING, Question.State.MOVED_TO_DESKTOP, Question.State.EXPIRED],
        ).update(state=Question.State.ANSWERED_ON_DESKTOP, decided_at=timezone.now())
        question.refresh_from_db()
        if taken:
            chosen: dict[str, list[str]] = {}
            free: dict[str, str] = {}
            for item in question.questions:
                if item["question"] in answers:
                    labels, rest = _split_desktop_value(item, answers[item["question"]])
                    chosen[item["question"]] = labels
                    if rest:
                        free[item["question"]] = rest
            Answer.objects.create(question=question, actor=None, via=Answer.Via.DESKTOP, answers=chosen, other=free)
            _panel_follow(question)
            room = Room.objects.get(pk=question.room_id)
            im_services.message_post(room=room, author_device=device, kind=Message.Kind.ANSWER,
                                     body={"question_id": str(question.pk), "via": "desktop", "answers": chosen,
                                           "other": free})
            _audit(actor=None, action="mobile.desktop_answer", question=question,
                   data={"device_id": str(device.pk), "answers": chosen, "other": free})
            events.question_updated(question, owner_id=device.owner_id)
    return {"state": question.state}


def messages_consume(*, device: Device, message_ids: Any) -> dict:
    """A hook injected these phone messages into the session: mark them consumed (once)."""
    _require_bridge(device)
    if not isinstance(message_ids, list):
        raise ValidationFailed("message_ids must be a list.")
    enforce("message.ids", message_ids, "message_ids")
    ids = []
    for raw in message_ids:
        try:
            ids.append(uuid.UUID(str(raw)))
        except ValueError:
            continue
    with transaction.atomic():
        mine = list(PhoneMessage.objects.select_related("session").filter(
            pk__in=ids, session__device=device).exclude(state=PhoneMessage.State.CONSUMED))
        PhoneMessage.objects.filter(pk__in=[m.pk for m in mine]).update(state=PhoneMessage.State.CONSUMED,
                                                                         consumed_at=timezone.now())
        for message in mine:
            message.state = PhoneMessage.State.CONSUMED
            events.message_updated(message, owner_id=device.owner_id)
        for session in {m.session_id: m.session for m in mine}.values():
            pacing.messages_release(session=session)  # schedules the next one after the quiet period
    return {}


# --- the phone side ---------------------------------------------------------------------------


def _own_question(actor: Any, question_id: Any) -> Question:
    try:
        qid = uuid.UUID(str(question_id))
    except ValueError:
        raise NotFound("No such question.") from None
    question = selectors.own_question(user=actor, question_id=qid) if actor.is_authenticated else None
    if question is None:
        raise NotFound("No such question.")
    return question


def _require_active(actor: Any) -> None:
    if not actor.is_authenticated or not mobile_reply_active(actor):
        raise NotFound()


_REFUSALS = {
    Question.State.ANSWERED: (Conflict, "already_answered", "This question was already answered."),
    Question.State.ANSWERED_ON_DESKTOP: (Conflict, "answered_on_desktop", "It was answered on the desktop."),
    Question.State.MOVED_TO_DESKTOP: (Conflict, "moved_to_desktop", "It moved to the desktop; answer it there."),
    Question.State.EXPIRED: (Gone, "expired", "This question expired."),
    Question.State.CANCELLED: (Gone, "session_ended", "The agent session ended."),
}


def _refusal(question: Question, nonce: str, now: datetime) -> ApplicationError:
    """Name why a conditional update took no row (re-reading the row, never guessing)."""
    question.refresh_from_db()
    if question.state == Question.State.PENDING:
        if question.expires_at <= now:
            question_expire(question=question)
            return Gone("This question expired.", code="expired")
        if not hmac.compare_digest(question.nonce_hash, hash_secret(nonce)):
            return Forbidden("This answer does not carry the question's nonce.", code="bad_nonce")
        return Conflict("Try again.", code="retry")
    cls, code, detail = _REFUSALS[question.state]
    return cls(detail, code=code)


def _burn(*, question_id: uuid.UUID, nonce_hash: str, now: datetime, answer: Answer) -> sql.Later:
    """The nonce's one conditional UPDATE (pending, this nonce, not expired -> answered); the row it
    changed names the single winner, and only the winner's ``answer`` is written (in the same statement on
    PostgreSQL: ``sql.insert_if_later``). Whether it won: at once, or in a pipeline when that ends. Written
    out once: Django compiling this UPDATE cost more than running it."""
    conn = transaction.get_connection()
    meta = Question._meta
    stamp = meta.get_field("decided_at").get_db_prep_value(now, conn)
    return sql.insert_if_later(answer, _burn_sql(conn.vendor), [
        Question.State.ANSWERED.value, stamp, meta.pk.get_db_prep_value(question_id, conn),
        Question.State.PENDING.value, nonce_hash, stamp])


class _Lost(Exception):
    """The burn changed no row: the answer's transaction is rolled back, and the refusal named."""


@functools.cache
def _burn_sql(vendor: str) -> str:
    from django.db import connection

    meta, qn = Question._meta, connection.ops.quote_name
    col = {name: qn(meta.get_field(name).column) for name in ("state", "decided_at", "nonce_hash", "expires_at")}
    # Names from the model's _meta, values as parameters.
    return (f"UPDATE {qn(meta.db_table)} SET {col['state']} = %s, {col['decided_at']} = %s "  # noqa: S608
            f"WHERE {qn(meta.pk.column)} = %s AND {col['state']} = %s AND {col['nonce_hash']} = %s "
            f"AND {col['expires_at']} > %s")


def answer_submit(*, actor: Any, question_id: Any, nonce: Any, answers: Any, other: Any = None,
                  ip: str | None = None, input_hash: Any = None) -> dict:
    """Answer a question from the phone. The nonce is burned by ONE conditional UPDATE: its row count
    decides the single winner, on SQLite and PostgreSQL alike. A permission request's answer must also
    present the hash of the tool input it was shown (``mobile.permissions.decision_check``)."""
    _require_active(actor)
    question = _own_question(actor, question_id)
    chosen, free = _clean_answer(question.questions, answers, other)
    bound = {}
    if question.kind == Question.Kind.PERMISSION:
        from mobile.permissions import decision_check

        decision = decision_check(actor=actor, question=question, answers=chosen, input_hash=input_hash, ip=ip)
        bound = {"input_hash": question.input_hash, "decision": decision}
    nonce = nonce if isinstance(nonce, str) else ""
    now = timezone.now()
    try:
        with transaction.atomic():
            # On PostgreSQL the burn and the writes that follow it go to the server together, one round trip
            # (each was one); the writes are then sent before the burn is known to have won, and a lost burn
            # rolls them back. Elsewhere the burn's answer is known at once, and a lost one writes nothing.
            with sql.pipelined():
                won = _burn(question_id=question.pk, nonce_hash=hash_secret(nonce), now=now,
                            answer=Answer(question=question, actor=actor, via=Answer.Via.PHONE, answers=chosen,
                                          other=free))
                if not won.ready or won.value:
                    _answered(question, actor=actor, now=now, chosen=chosen, free=free, bound=bound, ip=ip)
            if not won.value:
                raise _Lost
            events.question_updated(question, owner_id=actor.pk)
    except _Lost:
        refusal = _refusal(question, nonce, now)
        _audit(actor=actor, action="mobile.answer_refused", question=question, ip=ip,
               data={"reason": refusal.code, "status": refusal.status})
        raise refusal from None
    return {"state": Question.State.ANSWERED.value}


def _answered(question: Question, *, actor: Any, now: datetime, chosen: dict, free: dict, bound: dict,
              ip: str | None) -> None:
    """The writes of an answer that burned its question's nonce (``answer_submit``)."""
    # The row as the UPDATE left it (it changed nothing else): no re-read.
    question.state, question.decided_at = Question.State.ANSWERED, now
    # The bridge's item first: its doorbell is the first to leave after commit.
    outbox_enqueue(device=question.device, kind=OUTBOX_ANSWER, payload={
        "question_id": str(question.pk), "answers": chosen, "other": free, "answered_at": now.isoformat(),
        **bound,
    })
    # The panel follows in the message's write (one statement on PostgreSQL). An answered question has
    # no state_reason (only a question leaving pending otherwise gets one): the spec stays as it is.
    im_services.message_post(room_id=question.room_id, author_user=actor, kind=Message.Kind.ANSWER,
                             body={"question_id": str(question.pk), "via": "phone", "answers": chosen,
                                   "other": free},
                             panel_state=(question.panel_id, question.state) if question.panel_id else None)
    # Last before the commit: the audit chain's lock is held from here to the commit.
    _audit(actor=actor, action="mobile.answer", question=question, subject=actor, ip=ip,
           data={"answers": chosen, "other": free, **bound})


def question_expire(*, question: Question) -> bool:
    """Mark a pending question whose time is up as expired (lazily, on read or on a late answer)."""
    with transaction.atomic():
        done = Question.objects.filter(pk=question.pk, state=Question.State.PENDING,
                                       expires_at__lte=timezone.now()).update(state=Question.State.EXPIRED)
        if done:
            question.refresh_from_db()
            _panel_follow(question)
            outbox_enqueue(device=question.device, kind=OUTBOX_QUESTION_CLOSED,
                           payload={"question_id": str(question.pk), "state": question.state})
            events.question_updated(question, owner_id=question.device.owner_id)
    return bool(done)


def questions_expire_due(*, user: Any) -> int:
    due = Question.objects.select_related("session", "device").filter(
        device__owner=user, state=Question.State.PENDING, expires_at__lte=timezone.now())
    return sum(question_expire(question=q) for q in due)


def _own_session(actor: Any, session_id: str) -> AgentSession:
    session = (AgentSession.objects.select_related("device", "room")
               .filter(device__owner=actor, session_id=session_id).order_by("-created_at").first())
    if session is None:
        raise NotFound("No such session.")
    if session.state != AgentSession.State.OPEN:
        raise Gone("This agent session has ended.", code="session_ended")
    return session


def phone_message_send(*, actor: Any, session_id: str, text: Any, ip: str | None = None) -> PhoneMessage:
    """Queue free text for an agent session; the bridge injects it at the next prompt or Stop."""
    _require_active(actor)
    if not isinstance(text, str) or not text.strip():
        raise ValidationFailed("Write something first.")
    enforce("message.text", text, "text")
    session = _own_session(actor, session_id)
    try:
        pacing.check_send(session=session, text=text)
    except ApplicationError as exc:
        _audit(actor=actor, action="mobile.message_refused", ip=ip,
               data={"session_id": session.session_id, "reason": exc.code, "chars": len(text)})
        raise
    with transaction.atomic():
        # Written waiting; the pacer releases it into the device's outbox now or when it is due.
        message = PhoneMessage.objects.create(session=session, author=actor, text=text.strip(),
                                              state=PhoneMessage.State.WAITING)
        im_services.message_post(room=session.room, author_user=actor, kind=Message.Kind.TEXT,
                                 body={"text": message.text, "phone_message_id": str(message.pk)})
        _audit(actor=actor, action="mobile.message", ip=ip,
               data={"session_id": session.session_id, "message_id": str(message.pk), "chars": len(message.text)})
        pacing.messages_release(session=session)
        message.refresh_from_db()
    return message


def messages_release_due(*, user: Any = None, device: Device | None = None) -> int:
    """Release the paced phone messages that are due, for the user's or one bridge's open sessions."""
    sessions = AgentSession.objects.filter(state=AgentSession.State.OPEN)
    sessions = sessions.filter(device=device) if device is not None else sessions.filter(device__owner=user)
    return pacing.sessions_release_due(sessions=sessions)


def keep_going_set(*, actor: Any, session_id: str, enabled: bool, ip: str | None = None) -> AgentSession:
    """The phone's "keep this session going" switch, forwarded to the bridge's Stop hook."""
    _require_active(actor)
    if not isinstance(enabled, bool):
        raise ValidationFailed("enabled must be true or false.")
    session = _own_session(actor, session_id)
    with transaction.atomic():
        AgentSession.objects.filter(pk=session.pk).update(keep_going=enabled)
        session.keep_going = enabled
        outbox_enqueue(device=session.device, kind=OUTBOX_KEEP_GOING,
                       payload={"session_id": session.session_id, "enabled": enabled})
        _audit(actor=actor, action="mobile.keep_going", ip=ip,
               data={"session_id": session.session_id, "enabled": enabled})
        events.session_updated(session, owner_id=actor.pk)
    return session


# --- the switch --------------------------------------------------------------------------------


_CONNECT_STATE_SQL: dict[str, str] = {}


def _bridge_connect_state(device: Device) -> tuple[bool | None, bool]:
    """(the switch value last queued for this bridge or None, whether an open session of it has phone
    messages waiting): one statement, its SQL written once. Thousands of bridges reconnect after a restart
    and nearly all of them need neither; building the two queries with the ORM cost more than running them."""
    conn = transaction.get_connection()
    sql = _CONNECT_STATE_SQL.get(conn.vendor)
    if sql is None:
        quote = conn.ops.quote_name
        switch, session, message = BridgeSwitchSent._meta, AgentSession._meta, PhoneMessage._meta

        def column(meta: Any, name: str) -> str:
            return quote(meta.get_field(name).column)

        # Table and column names from the models' _meta; values as parameters.
        sql = _CONNECT_STATE_SQL[conn.vendor] = (
            f"SELECT (SELECT {column(switch, 'enabled')} FROM {quote(switch.db_table)}"  # noqa: S608
            f" WHERE {column(switch, 'device')} = %s),"
            f" EXISTS (SELECT 1 FROM {quote(session.db_table)} s INNER JOIN {quote(message.db_table)} m"
            f" ON m.{column(message, 'session')} = s.{column(session, 'id')}"
            f" WHERE s.{column(session, 'device')} = %s AND s.{column(session, 'state')} = %s"
            f" AND m.{column(message, 'state')} = %s)")
    device_id = Device._meta.pk.get_db_prep_value(device.pk, conn)  # a UUID, as the backend stores it
    with conn.cursor() as cursor:
        cursor.execute(sql, [device_id, device_id, AgentSession.State.OPEN.value, PhoneMessage.State.WAITING.value])
        sent, waiting = cursor.fetchone()
    return (None if sent is None else bool(sent)), bool(waiting)


def bridge_connected(*, device: Device) -> None:
    """A bridge (re)connected: tell it the switch if it does not hold the current value, and release the
    phone messages that waited for it. Usually neither: one read."""
    sent, waiting = _bridge_connect_state(device)
    enabled = mobile_reply_active(device.owner)
    if sent != enabled:
        with transaction.atomic():
            _switch_enqueue([device], enabled)
            events.switch_changed(user_id=device.owner_id, enabled=enabled)
    if waiting:
        messages_release_due(device=device)


def _switch_enqueue(bridges: list[Device], enabled: bool) -> None:
    for device in bridges:
        outbox_enqueue(device=device, kind=OUTBOX_SWITCH, payload={"enabled": enabled})
    # By id: an instance given the device would be cached on it (a one-to-one's reverse side), a reference
    # cycle kept as long as the tunnel keeps the device (ai1net.connection_cycles).
    BridgeSwitchSent.objects.bulk_create([BridgeSwitchSent(device_id=device.pk, enabled=enabled) for device in bridges],
                                         update_conflicts=True, unique_fields=["device"], update_fields=["enabled"])


def switch_broadcast(*, user: Any) -> bool:
    """Tell the user's bridges the effective switch; when it is off, waiting questions move to the
    desktop at once (the hooks stop waiting when the bridge hears it)."""
    enabled = mobile_reply_active(user)
    bridges = list(Device.objects.filter(owner=user, kind=Device.Kind.BRIDGE, status=Device.Status.ACTIVE))
    with transaction.atomic():
        _switch_enqueue(bridges, enabled)
        if not enabled:
            waiting = list(Question.objects.select_related("session", "device").filter(
                device__owner=user, state=Question.State.PENDING))
            for question in waiting:
                if Question.objects.filter(pk=question.pk, state=Question.State.PENDING).update(
                        state=Question.State.MOVED_TO_DESKTOP, state_reason="switch_off", decided_at=timezone.now()):
                    question.refresh_from_db()
                    _panel_follow(question)
                    events.question_updated(question, owner_id=user.pk)
        events.switch_changed(user_id=user.pk, enabled=enabled)
    return enabled
