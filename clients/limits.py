"""The one declaration of how large every externally-sourced field may be.

Whatever a device, a hook, a phone or an agent sends and the platform stores is bounded here: the
platform's serializers, services, RPC handlers and consumers, and the clients (bridge, probe) all
enforce these same numbers (``check``). Oversize input is refused, never truncated: the platform
answers 413 (HTTP) or JSON-RPC -32602 naming the field and the limit, and stores nothing; the bridge
refuses it before sending (the hook then fails open).

It lives in ``clients/`` because the clients import nothing from the server; the server imports it
from here (like ``clients.protocol``). Standard library only; keep it importable on Python 3.9.
"""

from __future__ import annotations

import json
from typing import Any, Dict, NamedTuple, Optional

from clients import protocol

CHARS, ITEMS, BYTES = "characters", "items", "bytes"


class Limit(NamedTuple):
    max: int
    unit: str  # CHARS (len of a string), ITEMS (len of a list or object), BYTES (UTF-8 JSON size)
    what: str


LIMITS: Dict[str, Limit] = {
    # The tunnel and its HTTP fallback.
    "frame": Limit(protocol.MAX_FRAME_BYTES, BYTES, "one tunnel frame or long-poll body"),
    "rpc.id": Limit(64, CHARS, "a request id"),
    "rpc.method": Limit(64, CHARS, "a method name"),
    "hello.version": Limit(50, CHARS, "the client's version"),
    "hello.capabilities": Limit(200, ITEMS, "capabilities in hello"),
    "hello.capability": Limit(100, CHARS, "one capability"),
    "hello.roots": Limit(200, ITEMS, "roots in hello"),
    "hello.root": Limit(4096, CHARS, "one root path"),
    "hello.ports": Limit(200, ITEMS, "ports in hello"),
    # Devices and pairing.
    "device.name": Limit(100, CHARS, "a device's name"),
    "device.hostname": Limit(255, CHARS, "a device's hostname"),
    "device.os": Limit(100, CHARS, "a device's operating system"),
    "device.version": Limit(50, CHARS, "a device's client version"),
    "pairing.device_code": Limit(200, CHARS, "a pairing device_code"),
    # Mobile reply: sessions.
    "session.session_id": Limit(200, CHARS, "an agent session id"),
    "session.cwd": Limit(1000, CHARS, "a session's working folder"),
    "session.source": Limit(32, CHARS, "how a session started"),
    "session.host": Limit(255, CHARS, "a session's host name"),
    "session.title": Limit(200, CHARS, "a session's title"),
    "session.reason": Limit(64, CHARS, "why a session ended or a question moved"),
    "hook.event": Limit(32, CHARS, "a hook event's name"),
    # Mobile reply: questions as the agent asked them (AskUserQuestion).
    "question.question_id": Limit(64, CHARS, "a question id"),
    "question.tool_use_id": Limit(200, CHARS, "a tool use id"),
    "question.questions": Limit(4, ITEMS, "questions in one ask"),
    "question.question": Limit(2000, CHARS, "a question's text"),
    "question.header": Limit(100, CHARS, "a question's header"),
    "question.options": Limit(4, ITEMS, "options of one question"),
    "option.label": Limit(200, CHARS, "an option's label"),
    "option.description": Limit(1000, CHARS, "an option's description"),
    # Mobile reply: answers and messages.
    "answer.answers": Limit(4, ITEMS, "answered questions"),
    "answer.labels": Limit(4, ITEMS, "labels chosen for one question"),
    "answer.other": Limit(8000, CHARS, "a free-text answer"),
    "answer.desktop": Limit(8000, CHARS, "an answer given at the desk"),
    "message.text": Limit(8000, CHARS, "a message from the phone to a session"),
    "message.ids": Limit(500, ITEMS, "message ids in one report"),
    # Mobile reply: tool-permission requests (clients.permission).
    "permission.tool_name": Limit(200, CHARS, "a tool's name"),
    "permission.tool_input": Limit(256 * 1024, BYTES, "a tool call's input (refused beyond)"),
    "permission.input_hash": Limit(64, CHARS, "the SHA-256 of a tool call's input"),
    "permission.rendering": Limit(20_000, CHARS, "what the phone shows of a tool call (cut to fit)"),
    # Rooms.
    "room.text": Limit(8000, CHARS, "a room message"),
    # Probes: command arguments and results.
    "probe.args": Limit(2 * 1024 * 1024, BYTES, "a probe command's arguments"),
    "probe.result": Limit(protocol.MAX_FRAME_BYTES, BYTES, "a probe command's result"),
}


class LimitExceeded(ValueError):
    """``value`` of ``field`` is larger than the declared limit ``name``."""

    def __init__(self, name: str, field: Optional[str] = None, size: int = 0) -> None:
        self.name = name
        self.limit = LIMITS[name]
        self.field = field or name
        self.size = size
        super().__init__(f"{self.field} is too large: at most {self.limit.max} {self.limit.unit} "
                         f"({self.limit.what}), got {size}.")


def size_of(value: Any, unit: str) -> int:
    if unit == CHARS:
        return len(value) if isinstance(value, str) else len(str(value))
    if unit == ITEMS:
        return len(value) if isinstance(value, (list, tuple, dict)) else 0
    return len(json.dumps(value, ensure_ascii=False).encode("utf-8"))


def check(name: str, value: Any, field: Optional[str] = None) -> Any:
    """Return ``value`` when it fits the limit ``name``; raise ``LimitExceeded`` otherwise."""
    limit = LIMITS[name]
    if value is None:
        return value
    size = size_of(value, limit.unit)
    if size > limit.max:
        raise LimitExceeded(name, field, size)
    return value


def check_questions(questions: Any) -> Any:
    """The AskUserQuestion ``questions`` list against every limit of its parts (shape is checked elsewhere)."""
    if not isinstance(questions, list):
        return questions
    check("question.questions", questions, "questions")
    for i, item in enumerate(questions):
        if not isinstance(item, dict):
            continue
        for key, name in (("question", "question.question"), ("header", "question.header")):
            if isinstance(item.get(key), str):
                check(name, item[key], f"questions[{i}].{key}")
        options = item.get("options")
        if isinstance(options, list):
            check("question.options", options, f"questions[{i}].options")
            for j, option in enumerate(options):
                if not isinstance(option, dict):
                    continue
                for key in ("label", "description"):
                    if isinstance(option.get(key), str):
                        check(f"option.{key}", option[key], f"questions[{i}].options[{j}].{key}")
    return questions
