"""What Codex CLI raises that the phone can answer: approvals and its own questions.

* ``PermissionRequest``: Codex asks for approval when a command needs more than its sandbox allows
  (tool ``Bash``; ``NetworkAccess`` for network); the hook runs before Codex's own prompt (or, under
  ``codex exec --approve-for-me``, before its automatic reviewer). It goes to the phone through the
  ordinary question path (the daemon's ``pre-tool-use`` and ``questions/wait`` routes: one question,
  options Allow and Deny) and is answered with Codex's documented output,
  ``hookSpecificOutput.decision.behavior`` allow or deny (with a ``message`` the model reads).
* ``PreToolUse`` of ``request_user_input`` (Codex's question tool, offered in Plan mode): its questions
  go to the phone as they are; the answer goes back as a deny whose reason carries it (Claude Code's
  ``--answer-style deny``), since Codex takes ``allow`` only with ``updatedInput``.

No answer in the window, phone reply off or the daemon down: no output, and Codex asks at the desk as
usual. Loaded by ``hook.py`` only for these events of Codex, so it keeps to the same few imports.
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
QUESTION_TOOL = "request_user_input"  # Codex's question tool (Plan mode)


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


def handle(event: Dict[str, Any], daemon: Daemon, *, window: float) -> Optional[Dict[str, Any]]:
    """A Codex hook event that goes to the phone (hook.py sends PermissionRequest and PreToolUse here)."""
    name = event.get("hook_event_name")
    if name == "PermissionRequest":
        return permission_request(event, daemon, window=window)
    if name == "PreToolUse" and event.get("tool_name") == QUESTION_TOOL:
        return user_input_request(event, daemon, window=window)
    return None


def permission_request(event: Dict[str, Any], daemon: Daemon, *, window: float) -> Optional[Dict[str, Any]]:
    """Ask the phone and wait up to ``window`` seconds for Allow or Deny."""
    question = approval_question(event)
    if question is None:
        return None
    # Codex gives approval requests no id of their own
    answered = ask_and_wait(event, daemon, tool_use_id="", tool_input=question, window=window)
    return approval_output(question, *answered) if answered else None


def user_input_request(event: Dict[str, Any], daemon: Daemon, *, window: float) -> Optional[Dict[str, Any]]:
    """Codex's own question tool: the phone's answer goes back as a PreToolUse deny whose reason the
    model reads (Codex takes ``allow`` only with ``updatedInput``, which cannot carry answers)."""
    from clients.bridge.hook import pre_tool_use_output

    question = user_input_questions(event.get("tool_input"))
    if question is None:
        return None
    tool_use_id = event.get("tool_use_id") if isinstance(event.get("tool_use_id"), str) else ""
    answered = ask_and_wait(event, daemon, tool_use_id=tool_use_id, tool_input=question, window=window)
    return pre_tool_use_output(question, *answered, style="deny") if answered else None


def user_input_questions(tool_input: Any) -> Optional[Dict[str, Any]]:
    """``request_user_input``'s input ({questions: [{id, header, question, options}]}) as AskUserQuestion's."""
    if not isinstance(tool_input, dict) or not isinstance(tool_input.get("questions"), list):
        return None
    questions = []
    for item in tool_input["questions"]:
        if not isinstance(item, dict) or not isinstance(item.get("question"), str):
            return None
        options = [
            {"label": str(o.get("label") or ""), "description": str(o.get("description") or "")}
            for o in item.get("options") or []
            if isinstance(o, dict) and o.get("label")
        ]
        questions.append({"question": item["question"], "header": str(item.get("header") or "Codex")[:100],
                          "options": options, "multiSelect": False})
    return {"questions": questions} if questions else None


def ask_and_wait(
    event: Dict[str, Any], daemon: Daemon, *, tool_use_id: str, tool_input: Dict[str, Any], window: float
) -> Optional[tuple]:
    """Put ``tool_input`` (AskUserQuestion's shape) to the phone; (answers, other) or None (no answer)."""
    deadline = time.monotonic() + window
    asked = daemon.post(
        "pre-tool-use",
        {
            "session_id": event["session_id"],
            "tool_use_id": tool_use_id,
            "tool_input": tool_input,
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
            return result.get("answers") or {}, result.get("other")
        if state != "pending" or remaining <= 0:
            return None
