"""What Codex CLI raises that the phone can answer: approvals and its own questions.

* ``PermissionRequest``: Codex asks for approval when a command needs more than its sandbox allows
  (tool ``Bash``; ``NetworkAccess`` for network); the hook runs before Codex's own prompt (or, under
  ``codex exec --approve-for-me``, before its automatic reviewer). Its payload and its output
  (``hookSpecificOutput.decision.behavior`` allow, or deny with a ``message`` the model reads) are Claude
  Code's, so it takes the same tool-permission path (``permission_hook.py``: the phone shows the command,
  the decision is bound to the input's hash, "remember for this session" is kept by the bridge, so Codex
  only ever gets a plain allow; it rejects ``updatedPermissions``).
* ``PreToolUse`` of ``request_user_input`` (Codex's question tool, offered in Plan mode): its questions
  go to the phone through the question path; the answer goes back as a deny whose reason carries it
  (Claude Code's ``--answer-style deny``), since Codex takes ``allow`` only with ``updatedInput``.

No answer in the window, phone reply off or the daemon down: no output, and Codex asks at the desk as
usual. Loaded by ``hook.py`` only for these events of Codex, so it keeps to the same few imports.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only (typing costs the hook start-up time)
    from typing import Any, Dict, Optional

    from clients.bridge.hook import Daemon

QUESTION_TOOL = "request_user_input"  # Codex's question tool (Plan mode)


def handle(event: Dict[str, Any], daemon: Daemon, *, window: float) -> Optional[Dict[str, Any]]:
    """A Codex hook event that goes to the phone (hook.py sends PermissionRequest and PreToolUse here)."""
    name = event.get("hook_event_name")
    if name == "PermissionRequest":
        return permission_request(event, daemon, window=window)
    if name == "PreToolUse" and event.get("tool_name") == QUESTION_TOOL:
        return user_input_request(event, daemon, window=window)
    return None


def permission_request(event: Dict[str, Any], daemon: Daemon, *, window: float) -> Optional[Dict[str, Any]]:
    """The tool-permission path, as for Claude Code (its PermissionRequest output is Codex's too)."""
    from clients.bridge import permission_hook

    return permission_hook.permission_request(event, daemon, window=window)


def user_input_request(event: Dict[str, Any], daemon: Daemon, *, window: float) -> Optional[Dict[str, Any]]:
    """Codex's own question tool: the phone's answer goes back as a PreToolUse deny whose reason the
    model reads (Codex takes ``allow`` only with ``updatedInput``, which cannot carry answers)."""
    from clients.bridge.hook import ask_and_wait, pre_tool_use_output

    question = user_input_questions(event.get("tool_input"))
    if question is None:
        return None
    tool_use_id = event.get("tool_use_id") if isinstance(event.get("tool_use_id"), str) else ""
    answered = ask_and_wait(event, daemon, tool_use_id=tool_use_id, tool_input=question, window=window)
    if answered is None:
        return None
    return pre_tool_use_output(question, answered.get("answers") or {}, answered.get("other"), style="deny")


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
