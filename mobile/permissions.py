"""Tool-permission requests from the phone: writes (called by mobile.rpc and mobile.services).

A permission request is a question (``Question.Kind.PERMISSION``) with the fixed option set of
``clients.permission`` (Allow / Deny / Allow and remember for this session), so it takes the same
nonce, expiry, first-answer-wins, panel, events and audit as a question. What it adds: the decision is
bound to the SHA-256 of the exact tool input, checked here when the bridge asks (its hash must be the
input's) and when the phone answers (it must present the same hash).
"""

from __future__ import annotations

import hmac
from typing import Any

from ai1net.accounts.services import audit_record
from ai1net.exceptions import Conflict, ValidationFailed
from ai1net.limits import enforce
from clients import permission
from devices.models import Device
from mobile.models import Question


def permission_create(*, device: Device, question_id: str, session_id: str, tool_name: Any, tool_input: Any,
                      input_hash: Any, window_sec: Any, tool_use_id: str = "") -> dict:
    """Store a tool-permission request for the phone; idempotent per ``question_id`` like a question."""
    from mobile import services  # the question machinery; it calls back here for the answer check

    if not isinstance(tool_input, dict):
        raise ValidationFailed("tool_input must be an object.")
    enforce("permission.tool_input", tool_input, "tool_input")  # oversize: refused naming the limit
    try:
        permission.check(tool_name, tool_input)
    except ValueError as exc:
        raise ValidationFailed(str(exc)) from None
    if not isinstance(input_hash, str) or not hmac.compare_digest(input_hash, permission.input_hash(tool_input)):
        raise ValidationFailed("input_hash is not the SHA-256 of tool_input.", code="input_mismatch")
    return services.question_create(
        device=device, question_id=question_id, session_id=session_id, tool_use_id=tool_use_id,
        questions=permission.as_questions(tool_name), window_sec=window_sec,
        permission={"kind": Question.Kind.PERMISSION, "tool_name": tool_name, "input_hash": input_hash,
                    "rendering": permission.render(tool_name, tool_input)},
    )


def decision_check(*, actor: Any, question: Question, answers: dict[str, list[str]], input_hash: Any,
                   ip: str | None = None) -> str:
    """The phone's answer to a permission request: exactly one of the three options, for the very input
    it was shown (its hash). Returns "allow" | "deny" | "allow_session"; a refusal is audited."""
    decision = permission.decision_of(question.tool_name, answers)
    code = None
    if decision is None:
        code, error = "decision_required", ValidationFailed("Choose Allow, Deny or Allow and remember.",
                                                            code="decision_required")
    elif not isinstance(input_hash, str) or not hmac.compare_digest(input_hash, question.input_hash):
        code, error = "input_mismatch", Conflict("This decision is for another tool input; reload the page.",
                                                 code="input_mismatch")
    if code is None:
        return str(decision)
    audit_record(actor=actor, action="mobile.answer_refused", subject=actor, ip=ip,
                 data={"question_id": str(question.pk), "reason": code, "status": error.status})
    raise error
