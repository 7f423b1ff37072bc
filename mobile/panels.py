"""The ``mobile.question`` panel: its "answer" action is ``answer_submit``, the same as POST /api/mobile/answer."""

from __future__ import annotations

from typing import Any

from ai1net.exceptions import ValidationFailed
from im.models import Panel
from mobile import services


def question_panel_action(*, actor: Any, panel: Panel, action: str, data: dict) -> dict:
    if action != "answer":
        raise ValidationFailed(f"A question panel takes the action 'answer', not {action!r}.", code="unknown_action")
    if data.get("question_id") not in (None, panel.ref_id):
        raise ValidationFailed("question_id does not belong to this panel.")
    return services.answer_submit(actor=actor, question_id=panel.ref_id, nonce=data.get("nonce"),
                                  answers=data.get("answers"), other=data.get("other"),
                                  input_hash=data.get("input_hash"))
