"""Tool-permission requests (Claude Code's PermissionRequest, PreToolUse for routed tools): what the
bridge, the hook and the platform agree on.

A decision is bound to the exact tool input through ``input_hash`` (SHA-256 of its canonical JSON): the
platform stores it, the phone presents it with its decision, the bridge and the hook check it on the
way back, so an answer given for one command can never approve another. A permission request travels
as a question with one fixed option set (``OPTIONS``), which the phone answers like any other question.

It lives in ``clients/`` because the clients import nothing from the server; the server imports it
from here (like ``clients.limits``). Standard library only; keep it importable on Python 3.9.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Dict, List, Optional

from clients import limits

ALLOW = "Allow"
DENY = "Deny"
ALLOW_SESSION = "Allow and remember for this session"
OPTIONS = (ALLOW, DENY, ALLOW_SESSION)
DECISIONS = {ALLOW: "allow", DENY: "deny", ALLOW_SESSION: "allow_session"}
DEFAULT_DENY_REASON = "The user denied this tool call from their phone."


def canonical(tool_input: Any) -> str:
    """One spelling per value: sorted keys, no spaces, UTF-8 kept (the same on every side)."""
    return json.dumps(tool_input, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def input_hash(tool_input: Any) -> str:
    return hashlib.sha256(canonical(tool_input).encode("utf-8")).hexdigest()


def check(tool_name: Any, tool_input: Any) -> None:
    """Refuse (``limits.LimitExceeded`` / ``ValueError``) what no side may take: a bad name or an
    oversize input. The rendering is cut to fit instead (``render``)."""
    if not isinstance(tool_name, str) or not tool_name:
        raise ValueError("tool_name must be a non-empty string")
    if not isinstance(tool_input, dict):
        raise ValueError("tool_input must be an object")
    limits.check("permission.tool_name", tool_name, "tool_name")
    limits.check("permission.tool_input", tool_input, "tool_input")


def question_text(tool_name: str) -> str:
    return f"Allow {tool_name}?"


def as_questions(tool_name: str) -> List[Dict[str, Any]]:
    """The request as AskUserQuestion's ``questions``: one question, the three fixed options."""
    return [{
        "question": question_text(tool_name),
        "header": tool_name[: limits.LIMITS["question.header"].max],
        "options": [
            {"label": ALLOW, "description": "Run it this once"},
            {"label": DENY, "description": "Do not run it; the agent is told why"},
            {"label": ALLOW_SESSION, "description": "Run it, and the same call again in this session"},
        ],
        "multiSelect": False,
    }]


def decision_of(tool_name: str, answers: Dict[str, Any]) -> Optional[str]:
    """The phone's answer -> "allow" | "deny" | "allow_session" (None: not exactly one known option)."""
    labels = answers.get(question_text(tool_name))
    if isinstance(labels, str):
        labels = [labels]
    if not isinstance(labels, list) or len(labels) != 1:
        return None
    return DECISIONS.get(labels[0])


def deny_reason(tool_name: str, other: Optional[Dict[str, Any]]) -> str:
    note = (other or {}).get(question_text(tool_name))
    if isinstance(note, str) and note.strip():
        return f"The user denied this tool call from their phone: {note.strip()}"
    return DEFAULT_DENY_REASON


def render(tool_name: str, tool_input: Dict[str, Any]) -> Dict[str, Any]:
    """What the phone shows: {"kind": "command" | "diff" | "input", "text", "truncated"}. Plain text
    only; the page puts it in the DOM as text, never as markup."""
    kind, text = "input", ""
    if tool_name == "Bash" and isinstance(tool_input.get("command"), str):
        kind, text = "command", tool_input["command"]
        if isinstance(tool_input.get("description"), str) and tool_input["description"]:
            text = f"# {tool_input['description']}\n{text}"
    elif tool_name in ("Edit", "Write", "MultiEdit") and isinstance(tool_input.get("file_path"), str):
        path = tool_input["file_path"]
        if tool_name == "Write":
            pairs = [("", str(tool_input.get("content", "")))]
        elif tool_name == "Edit":
            pairs = [(str(tool_input.get("old_string", "")), str(tool_input.get("new_string", "")))]
        else:
            edits = tool_input.get("edits") if isinstance(tool_input.get("edits"), list) else []
            pairs = [(str(e.get("old_string", "")), str(e.get("new_string", ""))) for e in edits if isinstance(e, dict)]
        kind, text = "diff", "".join(_diff(path, old, new, created=tool_name == "Write") for old, new in pairs)
    else:
        text = json.dumps(tool_input, indent=2, ensure_ascii=False, sort_keys=True)
    cap = limits.LIMITS["permission.rendering"].max
    truncated = len(text) > cap
    if truncated:
        text = text[: cap - 1] + "…"
    return {"kind": kind, "text": text, "truncated": truncated}


def _diff(path: str, old: str, new: str, *, created: bool) -> str:
    import difflib  # the platform renders; the hook only hashes, and starts without it

    lines = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                 fromfile="/dev/null" if created else f"a/{path}", tofile=f"b/{path}", n=3)
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)
