"""Bridge -> platform requests for mobile reply (the message shapes are agreed with clients/bridge)."""

from __future__ import annotations

from typing import Any

from ai1net.exceptions import ValidationFailed
from devices.models import Device
from devices.rpc import device_method
from mobile import services


def _str(params: dict, key: str, *, required: bool = True, limit: int = 1000) -> str:
    value = params.get(key, "")
    if value is None:
        value = ""
    if not isinstance(value, str) or (required and not value):
        raise ValidationFailed(f"{key} must be a non-empty string." if required else f"{key} must be a string.")
    return value[:limit]


def _params(params: Any) -> dict:
    if not isinstance(params, dict):
        raise ValidationFailed("params must be an object.")
    return params


@device_method("mobile.session_start")
def session_start(device: Device, params: dict) -> dict:
    p = _params(params)
    return services.session_start(device=device, session_id=_str(p, "session_id", limit=200),
                                  cwd=_str(p, "cwd", required=False),
                                  source=_str(p, "source", required=False, limit=32),
                                  host=_str(p, "host", required=False, limit=255),
                                  title=_str(p, "title", required=False, limit=200))


@device_method("mobile.question")
def question(device: Device, params: dict) -> dict:
    p = _params(params)
    return services.question_create(device=device, question_id=_str(p, "question_id", limit=64),
                                    session_id=_str(p, "session_id", limit=200),
                                    tool_use_id=_str(p, "tool_use_id", required=False, limit=200),
                                    questions=p.get("questions"), window_sec=p.get("window_sec"))


@device_method("mobile.question_moved")
def question_moved(device: Device, params: dict) -> dict:
    p = _params(params)
    return services.question_move(device=device, question_id=_str(p, "question_id", limit=64),
                                  reason=_str(p, "reason", limit=32))


@device_method("mobile.desktop_answer")
def desktop_answer(device: Device, params: dict) -> dict:
    p = _params(params)
    answers = p.get("answers") or {}
    if not isinstance(answers, dict):
        raise ValidationFailed("answers must map question text to the answer.")
    return services.desktop_answer_record(device=device, session_id=_str(p, "session_id", limit=200),
                                          tool_use_id=_str(p, "tool_use_id", required=False, limit=200),
                                          question_id=p.get("question_id") or None, answers=answers)


@device_method("mobile.message_consumed")
def message_consumed(device: Device, params: dict) -> dict:
    p = _params(params)
    return services.messages_consume(device=device, message_ids=p.get("message_ids"))


@device_method("mobile.session_end")
def session_end(device: Device, params: dict) -> dict:
    p = _params(params)
    return services.session_end(device=device, session_id=_str(p, "session_id", limit=200),
                                reason=_str(p, "reason", required=False, limit=64))


@device_method("mobile.hook_event")
def hook_event(device: Device, params: dict) -> dict:
    p = _params(params)
    return services.hook_event_record(device=device, session_id=_str(p, "session_id", limit=200),
                                      event=_str(p, "event", limit=32),
                                      tool_use_id=_str(p, "tool_use_id", required=False, limit=200))
