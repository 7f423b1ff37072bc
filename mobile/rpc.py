"""Bridge -> platform requests for mobile reply (the message shapes are agreed with clients/bridge)."""

from __future__ import annotations

from typing import Any

from ai1net.exceptions import ValidationFailed
from ai1net.limits import enforce
from devices.models import Device
from devices.rpc import device_method
from mobile import permissions, services

# Each string parameter's declared limit (clients.limits).
LIMIT_OF = {"session_id": "session.session_id", "cwd": "session.cwd", "source": "session.source",
            "host": "session.host", "title": "session.title", "question_id": "question.question_id",
            "tool_use_id": "question.tool_use_id", "reason": "session.reason", "event": "hook.event",
            "tool_name": "permission.tool_name", "input_hash": "permission.input_hash"}


def _str(params: dict, key: str, *, required: bool = True) -> str:
    """A string parameter within its declared limit; oversize is refused (-32602), never cut."""
    value = params.get(key, "")
    if value is None:
        value = ""
    if not isinstance(value, str) or (required and not value):
        raise ValidationFailed(f"{key} must be a non-empty string." if required else f"{key} must be a string.")
    return enforce(LIMIT_OF[key], value, key)


def _params(params: Any) -> dict:
    if not isinstance(params, dict):
        raise ValidationFailed("params must be an object.")
    return params


@device_method("mobile.session_start")
def session_start(device: Device, params: dict) -> dict:
    p = _params(params)
    return services.session_start(device=device, session_id=_str(p, "session_id"),
                                  cwd=_str(p, "cwd", required=False),
                                  source=_str(p, "source", required=False),
                                  host=_str(p, "host", required=False),
                                  title=_str(p, "title", required=False))


@device_method("mobile.question")
def question(device: Device, params: dict) -> dict:
    p = _params(params)
    return services.question_create(device=device, question_id=_str(p, "question_id"),
                                    session_id=_str(p, "session_id"),
                                    tool_use_id=_str(p, "tool_use_id", required=False),
                                    questions=p.get("questions"), window_sec=p.get("window_sec"))


@device_method("mobile.permission")
def permission(device: Device, params: dict) -> dict:
    p = _params(params)
    return permissions.permission_create(device=device, question_id=_str(p, "question_id"),
                                         session_id=_str(p, "session_id"),
                                         tool_use_id=_str(p, "tool_use_id", required=False),
                                         tool_name=_str(p, "tool_name"), tool_input=p.get("tool_input"),
                                         input_hash=_str(p, "input_hash"), window_sec=p.get("window_sec"))


@device_method("mobile.question_moved")
def question_moved(device: Device, params: dict) -> dict:
    p = _params(params)
    return services.question_move(device=device, question_id=_str(p, "question_id"),
                                  reason=_str(p, "reason"))


@device_method("mobile.desktop_answer")
def desktop_answer(device: Device, params: dict) -> dict:
    p = _params(params)
    answers = p.get("answers") or {}
    if not isinstance(answers, dict):
        raise ValidationFailed("answers must map question text to the answer.")
    return services.desktop_answer_record(device=device, session_id=_str(p, "session_id"),
                                          tool_use_id=_str(p, "tool_use_id", required=False),
                                          question_id=p.get("question_id") or None, answers=answers)


@device_method("mobile.message_consumed")
def message_consumed(device: Device, params: dict) -> dict:
    p = _params(params)
    return services.messages_consume(device=device, message_ids=p.get("message_ids"))


@device_method("mobile.session_end")
def session_end(device: Device, params: dict) -> dict:
    p = _params(params)
    return services.session_end(device=device, session_id=_str(p, "session_id"),
                                reason=_str(p, "reason", required=False))


@device_method("mobile.hook_event")
def hook_event(device: Device, params: dict) -> dict:
    p = _params(params)
    return services.hook_event_record(device=device, session_id=_str(p, "session_id"),
                                      event=_str(p, "event"),
                                      tool_use_id=_str(p, "tool_use_id", required=False))
