"""Builders for mobile-reply tests: a bridge, a session, a question (through the real services)."""

from __future__ import annotations

import uuid
from typing import Any

from devices.models import Device, OutboxItem
from devices.services import device_create
from mobile import services
from mobile.models import Question

ONE_QUESTION = [
    {
        "question": "Which framework?",
        "header": "Framework",
        "options": [{"label": "React", "description": "SPA"}, {"label": "Vue", "description": "Progressive"}],
        "multiSelect": False,
    }
]

TWO_QUESTIONS = [
    ONE_QUESTION[0],
    {
        "question": "Which checks should run?",
        "header": "Checks",
        "options": [
            {"label": "Lint", "description": "ruff"},
            {"label": "Types", "description": "mypy"},
            {"label": "Tests", "description": "pytest"},
        ],
        "multiSelect": True,
    },
]


def enable_mobile(user: Any) -> Any:
    user.mobile_reply_enabled = True
    user.save(update_fields=["mobile_reply_enabled"])
    return user


def bridge_for(user: Any, name: str = "laptop") -> Device:
    device, _token = device_create(owner=user, name=name, kind=Device.Kind.BRIDGE, hostname=f"{name}.local")
    return device


def ask(device: Device, *, session_id: str = "sess-1", questions: list | None = None, window_sec: float = 300,
        question_id: str | None = None, tool_use_id: str = "toolu_01") -> tuple[Question, str]:
    """Create a question as the bridge would; returns it with its nonce (as /pending would give it)."""
    services.session_start(device=device, session_id=session_id, cwd="/home/alice/project", source="startup",
                           host="laptop")
    qid = question_id or str(uuid.uuid4())
    services.question_create(device=device, question_id=qid, session_id=session_id, tool_use_id=tool_use_id,
                             questions=questions or ONE_QUESTION, window_sec=window_sec)
    question = Question.objects.select_related("session", "device").get(pk=qid)
    return question, services.nonce_for(question)


def outbox(device: Device, kind: str | None = None) -> list[OutboxItem]:
    items = OutboxItem.objects.filter(device=device).order_by("seq")
    if kind:
        items = items.filter(kind=kind)
    return list(items)
