"""Claude Code's tool-permission requests, decided on the phone: ``PermissionRequest`` (any tool that asks)
and ``PreToolUse`` for the tools the user routed (``hooks install --approve Bash,Write,Edit``).

The daemon's ``permission-request`` route sends the request to the platform (or answers at once when
the user chose "Allow and remember for this session" for this very call); the hook then long-polls
``questions/wait`` like a question. The decision comes back with the SHA-256 of the tool input it was
made for, and the hook checks it against the input it was given: a decision for any other input is
no decision. Output, documented fields only (reference/agent-hooks.md):

- PermissionRequest: ``hookSpecificOutput.decision = {behavior: allow}`` or ``{behavior: deny, message}``;
- PreToolUse: ``permissionDecision`` allow or deny with ``permissionDecisionReason`` (a deny reason
  reaches the model).

No answer in the window, the switch off, the daemon down, a hash that does not match: no output, and
the desktop asks as usual. Loaded by ``hook.py`` only for these events (the question path stays lean).

Desk versus phone: Claude Code (2.1.197, interactive) shows its own permission dialog while a
PermissionRequest hook runs, and when the person at the desk answers first it neither stops the hook nor
tells it. The hook learns it from the session's transcript (``transcript_path``): the tool call it was
asked about (same tool, same input hash) gets its ``tool_result``. It then tells the daemon
(``permission/desktop``), the phone shows "Answered on the desktop" and a late phone answer is refused.
That transcript reading is observed behaviour, not a documented contract; without a transcript the
request simply stays on the phone until the window ends.
"""

from __future__ import annotations

import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only (typing costs the hook start-up time)
    from typing import Any, Dict, Optional

    from clients.bridge.hook import Daemon

LONG_POLL_SEC = 25.0
DESK_POLL_SEC = 1.0  # while watching the transcript for the desk's answer
TRANSCRIPT_TAIL_BYTES = 1024 * 1024
ALLOW_REASON = "Allowed from the user's phone (ai1net)."
REMEMBERED_REASON = "Allowed from the user's phone earlier in this session (ai1net)."


def decision_output(event_name: str, decision: str, reason: str = "", remembered: bool = False) -> Dict[str, Any]:
    """The documented hook output for "allow" | "allow_session" | "deny" on ``event_name``."""
    allowed = decision in ("allow", "allow_session")
    if event_name == "PermissionRequest":
        verdict: Dict[str, Any] = {"behavior": "allow"} if allowed else {"behavior": "deny", "message": reason}
        return {"hookSpecificOutput": {"hookEventName": "PermissionRequest", "decision": verdict}}
    return {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "allow" if allowed else "deny",
            "permissionDecisionReason": (REMEMBERED_REASON if remembered else ALLOW_REASON) if allowed else reason,
        }
    }


def input_hash(tool_input: Any) -> str:
    """``clients.permission.input_hash`` from the C halves of json and sha256: importing ``json``,
    ``hashlib`` and ``clients.limits`` cost the hook 20-45 ms before it could ask the phone."""
    try:
        from _json import encode_basestring, make_encoder

        try:
            from _sha256 import sha256  # Python <= 3.11
        except ImportError:
            from _sha2 import sha256  # type: ignore[no-redef]  # Python >= 3.12
    except ImportError:  # no C accelerators (another Python): the plain modules
        from clients import permission

        return permission.input_hash(tool_input)

    def refuse(value: Any) -> Any:
        raise TypeError(f"{type(value).__name__} is not JSON serializable")

    # The settings of permission.canonical: sorted keys, no spaces, UTF-8 kept, no NaN.
    encode = make_encoder(None, refuse, encode_basestring, None, ":", ",", True, False, False)
    return sha256("".join(encode(tool_input, 0)).encode("utf-8")).hexdigest()


def permission_request(event: Dict[str, Any], daemon: Daemon, *, window: float) -> Optional[Dict[str, Any]]:
    name = event.get("hook_event_name")
    tool_name = event.get("tool_name")
    tool_input = event.get("tool_input")
    if name not in ("PermissionRequest", "PreToolUse") or not isinstance(tool_name, str):
        return None
    if not isinstance(tool_input, dict):
        return None
    expected = input_hash(tool_input)
    deadline = time.monotonic() + window
    asked = daemon.post(
        "permission-request",
        {
            "session_id": event["session_id"],
            "event": name,
            "tool_use_id": event.get("tool_use_id") or "",  # PermissionRequest carries none
            "tool_name": tool_name,
            "tool_input": tool_input,
            "cwd": event.get("cwd") or "",
            "window_sec": window,
        },
        timeout=min(20.0, window),
    )
    result: Optional[Dict[str, Any]] = asked if asked.get("decision") else None
    question_id = asked.get("question_id")
    if result is None and not question_id:
        return None
    desk = DeskWatch(event.get("transcript_path"), tool_name, expected) if name == "PermissionRequest" else None
    if result is None:
        from clients.bridge.hook import wait_for_answer

        result = wait_for_answer(daemon, question_id, deadline,
                                 poll_sec=DESK_POLL_SEC if desk is not None and desk.usable else LONG_POLL_SEC,
                                 stop=desk.answered if desk is not None else None)
        if result is None:
            if desk is not None and desk.answered():
                daemon.post_retrying("permission/desktop", {"question_id": question_id, "decided": desk.answered()},
                                     3.0, time.monotonic() + 3.0)
            return None  # the desk's answer stands (Claude Code no longer reads ours), or the desk asks
    decision = result.get("decision")
    if decision not in ("allow", "allow_session", "deny") or result.get("input_hash") != expected:
        return None  # not a decision for this very input: the desktop asks
    reason = result.get("reason")
    if not reason:
        from clients import permission

        reason = permission.DEFAULT_DENY_REASON
    return decision_output(str(name), str(decision), str(reason), remembered=bool(result.get("remembered")))


class DeskWatch:
    """Whether the tool call a PermissionRequest is about got its result in the transcript meanwhile
    (the person at the desk answered Claude Code's dialog first): "allow", "deny" or ""."""

    def __init__(self, transcript_path: Any, tool_name: str, input_hash: str) -> None:
        import os

        self.path = transcript_path if isinstance(transcript_path, str) else ""
        self.usable = bool(self.path) and os.path.isfile(self.path)
        self.tool_name, self.input_hash = tool_name, input_hash
        self.settled_before: Optional[set] = None  # matching calls that already had a result when we began
        self.offset = 0
        self.verdict = ""
        if self.usable:
            self.offset = max(0, os.path.getsize(self.path) - TRANSCRIPT_TAIL_BYTES)
            self.answered()  # before the request goes out: what was settled already is not the desk's answer

    def answered(self) -> str:
        if self.verdict or not self.usable:
            return self.verdict
        try:
            calls, results = self._scan()
        except (OSError, ValueError):
            return ""
        if self.settled_before is None:
            self.settled_before = {use_id for use_id in calls if use_id in results}
        for use_id in calls:
            if use_id in results and use_id not in self.settled_before:
                self.verdict = "deny" if results[use_id] else "allow"
        return self.verdict

    def _scan(self) -> tuple:
        """(ids of matching tool_use blocks, {tool_use_id: is_error} of tool_result blocks) in the tail."""
        from clients.bridge.hook import loads

        with open(self.path, "rb") as handle:
            handle.seek(self.offset)
            data = handle.read()
        calls, results = [], {}
        for line in data.splitlines():
            try:
                entry = loads(line)
            except ValueError:
                continue  # the first line of a tail, or one being written
            message = entry.get("message") if isinstance(entry, dict) else None
            content = message.get("content") if isinstance(message, dict) else None
            for block in content if isinstance(content, list) else []:
                if not isinstance(block, dict):
                    continue
                if (block.get("type") == "tool_use" and block.get("name") == self.tool_name
                        and isinstance(block.get("input"), dict)
                        and input_hash(block["input"]) == self.input_hash):
                    calls.append(block.get("id"))
                elif block.get("type") == "tool_result":
                    results[block.get("tool_use_id")] = bool(block.get("is_error"))
        return calls, results
