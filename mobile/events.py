"""Events for the user's phone: builders, the group name, sent only after commit (via im.events)."""

from __future__ import annotations

from typing import Any

from im.events import send_on_commit
from mobile.models import AgentSession, PhoneMessage, Question

QUESTION_CREATED = "mobile.question.created"
QUESTION_UPDATED = "mobile.question.updated"
SESSION_UPDATED = "mobile.session.updated"
MESSAGE_UPDATED = "mobile.message.updated"
SWITCH_CHANGED = "mobile.switch.changed"


def user_group(user_id: Any) -> str:
    return f"mobile_user_{user_id}"


def question_data(question: Question, *, nonce: str | None = None) -> dict:
    """The phone's view of a question; ``nonce`` only while it is pending (the phone must present it)."""
    data = {
        "question_id": str(question.pk),
        "session_id": question.session.session_id,
        "room_id": str(question.room_id),
        "device_id": str(question.device_id),
        "panel_id": question.panel_id,
        "questions": question.questions,
        "state": question.state,
        "created_at": question.created_at.isoformat(),
        "expires_at": question.expires_at.isoformat(),
    }
    if question.kind == Question.Kind.PERMISSION:
        # The phone shows the rendering as text and presents input_hash with its decision.
        data.update(kind=question.kind, tool_name=question.tool_name, input_hash=question.input_hash,
                    rendering=question.rendering)
    if nonce is not None:
        data["nonce"] = nonce
    return data


def session_data(session: AgentSession) -> dict:
    return {
        "session_id": session.session_id,
        "device_id": str(session.device_id),
        "room_id": str(session.room_id),
        "title": session.title,
        "cwd": session.cwd,
        "host": session.host,
        "keep_going": session.keep_going,
        "state": session.state,
        "created_at": session.created_at.isoformat(),
    }


def message_data(message: PhoneMessage) -> dict:
    return {
        "message_id": str(message.pk),
        "session_id": message.session.session_id,
        "text": message.text,
        "state": message.state,
        "created_at": message.created_at.isoformat(),
    }


def question_created(question: Question, *, owner_id: Any, nonce: str) -> None:
    send_on_commit(user_group(owner_id), {"type": QUESTION_CREATED, "question": question_data(question, nonce=nonce)})


def question_updated(question: Question, *, owner_id: Any) -> None:
    send_on_commit(user_group(owner_id), {
        "type": QUESTION_UPDATED,
        "question_id": str(question.pk),
        "session_id": question.session.session_id,
        "state": question.state,
        "reason": question.state_reason,
    })


def session_updated(session: AgentSession, *, owner_id: Any) -> None:
    send_on_commit(user_group(owner_id), {"type": SESSION_UPDATED, "session": session_data(session)})


def message_updated(message: PhoneMessage, *, owner_id: Any, extra: dict | None = None) -> None:
    """``extra``: e.g. a waiting message's ``position`` and ``release_at`` (see mobile.pacing)."""
    send_on_commit(user_group(owner_id), {"type": MESSAGE_UPDATED,
                                          "message": {**message_data(message), **(extra or {})}})


def switch_changed(*, user_id: Any, enabled: bool) -> None:
    send_on_commit(user_group(user_id), {"type": SWITCH_CHANGED, "enabled": enabled})
