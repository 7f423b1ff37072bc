"""Codex CLI's approval requests (``PermissionRequest``), answered from the phone.

Codex asks for approval when a command needs more than its sandbox allows (``Bash``, and
``NetworkAccess`` for network); the hook runs before Codex shows its own prompt. We send it to the
phone through the ordinary question path (the daemon's ``pre-tool-use`` and ``questions/wait``
routes: one question, options Allow and Deny) and answer with Codex's documented output:
``hookSpecificOutput.decision.behavior`` allow or deny (with a ``message`` the model reads). No answer
in the window, phone reply off or the daemon down: no output, and Codex asks at the desk as usual.

Loaded by ``hook.py`` only for a Codex ``PermissionRequest``, so it keeps to the same few imports.
"""

from __future__ import annotations

import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only (typing costs the hook start-up time)
    from typing import Any, Dict, Optional

    from clients.bridge.hook import Daemon

ALLOW = "Allow"
DENY = "Deny"
HEADER = "Codex approval"
MAX_SHOWN_CHARS = 1500  # a question's text is at most 2000 characters (clients/limits.py)
DENY_MESSAGE = "The user denied this on their phone."
LONG_POLL_SEC = 25.0


def is_codex_event(event: Dict[str, Any]) -> bool:
    """Codex's hook payloads carry ``turn_id`` (a Codex extension); Claude Code's do not."""
    return isinstance(event.get("turn_id"), str)


def approval_question(event: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The phone's question for one approval request, as AskUserQuestion input (what the path carries)."""
    tool_input = event.get("tool_input")
    if not isinstance(tool_input, dict):
        return None
    command = tool_input.get("command")
    if not isinstance(command, str) or not command.strip():
        return None
    shown = command if len(command) <= MAX_SHOWN_CHARS else command[:MAX_SHOWN_CHARS] + "…"
    what = "access the network for" if event.get("tool_name") == "NetworkAccess" else "run"
    text = f"Codex asks to {what}:\n{shown}"
    description = tool_input.get("description")
    if isinstance(description, str) and description.strip():
        text += f"\nWhy: {description.strip()[:300]}"
    return {
        "questions": [
            {
                "question": text,
                "header": HEADER,
                "options": [
                    {"label": ALLOW, "description": "let Codex do it this once"},
                    {"label": DENY, "description": "refuse; Codex is told (add a note for it below)"},
                ],
                "multiSelect": False,
            }
        ]
    }


def approval_output(
    question: Dict[str, Any], answers: Dict[str, Any], other: Optional[Dict[str, Any]]
) -> Optional[Dict[str, Any]]:
    """Codex's PermissionRequest output for the phone's answer (None: no clear answer, Codex asks)."""
    text = question["questions"][0]["question"]
    chosen = answers.get(text) or []
    if isinstance(chosen, str):
        chosen = [chosen]
    note = (other or {}).get(text)
    note = note.strip() if isinstance(note, str) else ""
    if chosen == [ALLOW]:
        decision: Dict[str, Any] = {"behavior": "allow"}
    elif chosen == [DENY] or (not chosen and note):
        # A note with no button is a refusal with a reason: the model reads it and can change course.
        decision = {"behavior": "deny", "message": f"{DENY_MESSAGE} Their note: {note}" if note else DENY_MESSAGE}
    else:
        return None
    return {"hookSpecificOutput": {"hookEventName": "PermissionRequest", "decision": decision}}


def permission_request(event: Dict[str, Any], daemon: Daemon, *, window: float) -> Optional[Dict[str, Any]]:
    """Ask the phone and wait up to ``window`` seconds for Allow or Deny."""
    question = approval_question(event)
    if question is None:
        return None
    deadline = time.monotonic() + window
    asked = daemon.post(
        "pre-tool-use",
        {
            "session_id": event["session_id"],
            "tool_use_id": "",  # Codex gives approval requests no id of their own
            "tool_input": question,
            "cwd": event.get("cwd") or "",
            "window_sec": window,
        },
        timeout=min(20.0, window),
    )
    question_id = asked.get("question_id")
    if not question_id:
        return None
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:  # hand it back to the desk; an answer that came in just in time still counts
            result = daemon.post_retrying(
                "questions/give-up", {"question_id": question_id, "reason": "timeout"}, 3.0, time.monotonic() + 3.0
            )
        else:
            poll = min(remaining, LONG_POLL_SEC)
            result = daemon.post_retrying(
                "questions/wait", {"question_id": question_id, "timeout": poll}, poll + 5, deadline
            )
        if result is None:
            if time.monotonic() < deadline:
                continue
            return None
        state = result.get("state")
        if state == "answered":
            return approval_output(question, result.get("answers") or {}, result.get("other"))
        if state != "pending" or remaining <= 0:
            return None
