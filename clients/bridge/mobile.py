"""The daemon's mobile-reply logic: questions, waiting hooks, answers, phone messages, keep-going, switch.

Runs in the daemon's asyncio loop. The `hook` command reaches it through the local API
(`dispatch(route, body)`); the platform reaches it through delivered outbox items (`handlers()`:
`mobile.answer`, `mobile.question_closed`, `mobile.message`, `mobile.keep_going`, `mobile.switch`)
and it reaches the platform through `tunnel.call(method, params, timeout=...)`. Everything the
platform must learn after the fact (session start/end, a question moved to the desktop, a desktop
answer, consumed messages) goes through a durable report queue in the store, retried in order until
the platform answers, so it survives a restart of the daemon or of the platform.

Every take and give-up is written to the audit log before it happens.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import time
import uuid
from pathlib import Path
from typing import Any, Awaitable, Callable, Dict, List, Optional

from clients import limits, permission

from .audit import AuditLog
from .local_api import RequestRefused
from .store import OPEN_STATES, Store

log = logging.getLogger("ai1net.bridge.mobile")

STOP_CAP = 5  # consecutive Stop blocks per session
LAST_SAID_CHARS = 100_000  # of the agent's last message, kept to spot it coming back as a "phone" message
HOOK_GRACE_SEC = 10.0  # a question nobody polls for this long after its window is handed to the desktop
MAX_WAIT_SEC = 60.0
QUESTION_CALL_TIMEOUT = 15.0
REPORT_CALL_TIMEOUT = 30.0
MOBILE_REPLY_OFF = "mobile_reply_off"


def error_code(exc: BaseException) -> Optional[str]:
    """The platform's application error code carried by a failed `tunnel.call`, or None when the call
    did not get an answer at all (timeout, connection lost), so the outcome is unknown."""
    data = getattr(exc, "data", None)
    if isinstance(data, dict) and isinstance(data.get("code"), str):
        return data["code"]
    for attr in ("error_code", "app_code", "code"):
        value = getattr(exc, attr, None)
        if isinstance(value, str) and value:
            return value
        if isinstance(value, int) and not isinstance(value, bool) and not isinstance(exc, OSError):
            return str(value)
    return None


# Each field's declared limit (clients.limits): the platform refuses oversize input, so the bridge
# refuses it first (the hook then fails open); display-only fields are cut to fit instead.
LIMIT_OF = {"session_id": "session.session_id", "tool_use_id": "question.tool_use_id", "cwd": "session.cwd",
            "source": "session.source", "title": "session.title", "question_id": "question.question_id",
            "reason": "session.reason"}
CUT_TO_FIT = ("cwd", "title")


def _text(body: Dict[str, Any], key: str, *, required: bool = True) -> str:
    value = body.get(key, "")
    if value is None:
        value = ""
    if not isinstance(value, str) or (required and not value):
        raise RequestRefused(400, f"bad_{key}")
    limit = limits.LIMITS[LIMIT_OF[key]].max
    if len(value) > limit:
        if key not in CUT_TO_FIT:
            raise RequestRefused(413, f"{key}_too_large")
        value = ("…" + value[-(limit - 1):]) if key == "cwd" else value[: limit - 1] + "…"
    return value


class MobileBridge:
    def __init__(
        self,
        home: Path,
        tunnel: Any,
        *,
        store: Optional[Store] = None,
        audit: Optional[AuditLog] = None,
        hook_grace_sec: float = HOOK_GRACE_SEC,
        sweep_interval: float = 1.0,
        stop_cap: int = STOP_CAP,
    ) -> None:
        self.home = Path(home)
        self.tunnel = tunnel
        self.store = store or Store(self.home / "mobile.sqlite3")
        self.audit = audit or AuditLog(self.home / "audit.jsonl")
        self.hook_grace_sec = hook_grace_sec
        self.sweep_interval = sweep_interval
        self.stop_cap = stop_cap
        self._changed = asyncio.Event()
        self._reports_ready = asyncio.Event()
        self._waiting: Dict[str, int] = {}
        self._waiting_sessions: Dict[str, int] = {}
        self._last_poll: Dict[str, float] = {}
        self._agent_said: Dict[str, str] = {}  # session -> the agent's last message (normalised), from Stop
        self._tasks: List[asyncio.Task] = []

    # --- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        self._tasks = [
            asyncio.ensure_future(self._report_loop()),
            asyncio.ensure_future(self._sweep_loop()),
        ]
        self._reports_ready.set()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):  # noqa: S110 - shutting down
                pass
        self._tasks = []

    def handlers(self) -> Dict[str, Callable[[Dict[str, Any]], Awaitable[None]]]:
        """Delivered outbox kinds -> async handler(payload). Each is idempotent (a replay is a no-op)."""
        return {
            "mobile.answer": self.on_answer,
            "mobile.question_closed": self.on_question_closed,
            "mobile.message": self.on_message,
            "mobile.keep_going": self.on_keep_going,
            "mobile.switch": self.on_switch,
        }

    @property
    def switch(self) -> Optional[bool]:
        """The user's effective mobile-reply switch as last heard from the platform (None: not yet)."""
        return self.store.get("switch")

    # --- waking waiters ----------------------------------------------------------------------
    def _wake(self) -> None:
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    async def _wait_change(self, event: asyncio.Event, timeout: float) -> None:
        try:
            await asyncio.wait_for(event.wait(), max(timeout, 0.0))
        except asyncio.TimeoutError:
            pass

    def _report(self, method: str, params: Dict[str, Any]) -> None:
        self.store.report_add(method, params)
        self._reports_ready.set()

    # --- the local API -----------------------------------------------------------------------
    async def dispatch(self, route: str, body: Dict[str, Any]) -> Dict[str, Any]:
        routes = {
            "health": self._health,
            "session-start": self._session_start,
            "pre-tool-use": self._ask,
            "permission-request": self._ask_permission,
            "permission/desktop": self._desktop_decided,
            "questions/wait": self._wait_question,
            "questions/give-up": self._give_up_route,
            "post-tool-use": self._desktop_answer,
            "user-prompt-submit": self._inject,
            "stop": self._stop,
            "sessions/wait-message": self._wait_message,
            "session-end": self._session_end,
        }
        handler = routes.get(route)
        if handler is None:
            raise RequestRefused(404, "not_found")
        return await handler(body)

    async def _health(self, body: Dict[str, Any]) -> Dict[str, Any]:
        return {
            "ok": True,
            "pid": os.getpid(),
            "switch": self.switch,
            "queue_depth": self.store.queue_depth(),
            "waiting": sorted(self._waiting),  # questions a hook is waiting on right now
            "waiting_sessions": sorted(self._waiting_sessions),  # Stop hooks waiting for a phone message
        }

    async def _session_start(self, body: Dict[str, Any]) -> Dict[str, Any]:
        session_id = _text(body, "session_id")
        params = {
            "session_id": session_id,
            "cwd": _text(body, "cwd", required=False),
            "source": _text(body, "source", required=False) or "startup",
            "host": _hostname(),
        }
        title = _text(body, "title", required=False)
        if title:
            params["title"] = title
        self.audit.write("session.start", session_id=session_id, source=params["source"])
        self.store.session_upsert(session_id, ended=0)
        self._report("mobile.session_start", params)  # hand off: the hook returns at once
        return {}

    async def _ensure_session(self, session_id: str, cwd: str) -> None:
        session = self.store.session(session_id)
        if session and session["started"]:
            return
        params = {"session_id": session_id, "cwd": cwd, "source": "resume", "host": _hostname()}
        result = await self.tunnel.call("mobile.session_start", params, timeout=QUESTION_CALL_TIMEOUT)
        self._session_started(session_id, result)

    def _session_started(self, session_id: str, result: Any) -> None:
        result = result if isinstance(result, dict) else {}
        self.store.session_upsert(session_id, started=1, room_id=str(result.get("room_id") or ""))
        if isinstance(result.get("mobile_reply"), bool):
            self.store.set("switch", result["mobile_reply"])

    async def _ask(self, body: Dict[str, Any]) -> Dict[str, Any]:
        session_id = _text(body, "session_id")
        tool_use_id = _text(body, "tool_use_id", required=False)
        cwd = _text(body, "cwd", required=False)
        tool_input = body.get("tool_input")
        if not isinstance(tool_input, dict):
            raise RequestRefused(400, "bad_tool_input")
        questions = tool_input.get("questions")
        if (
            not isinstance(questions, list)
            or not 1 <= len(questions) <= 8
            or not all(isinstance(q, dict) and isinstance(q.get("question"), str) for q in questions)
        ):
            raise RequestRefused(400, "bad_questions")
        try:
            limits.check_questions(questions)
        except limits.LimitExceeded as exc:
            self.audit.write("question.refused", session_id=session_id, tool_use_id=tool_use_id, code="too_large",
                             detail=str(exc))
            raise RequestRefused(413, "questions_too_large") from None
        window = _window(body)
        session = self.store.session(session_id)
        if session and session["ended"]:
            return {"skip": "session_ended"}
        if self.switch is False:
            # The platform told us (mobile.switch, sent on every connect and change): stay out of the way.
            self.audit.write("question.skipped", session_id=session_id, tool_use_id=tool_use_id, code=MOBILE_REPLY_OFF)
            return {"skip": MOBILE_REPLY_OFF}
        if tool_use_id:
            existing = self.store.question_for_tool_use(tool_use_id)
            if existing and existing["state"] in OPEN_STATES:
                return {"question_id": existing["question_id"]}

        question_id = str(uuid.uuid4())
        self.store.question_insert(
            question_id=question_id,
            session_id=session_id,
            tool_use_id=tool_use_id,
            tool_input=tool_input,
            window_sec=window,
        )
        self.audit.write(
            "question.ask",
            durable=False,  # what went out, not a decision: the take or give-up that ends it fsyncs it
            question_id=question_id,
            session_id=session_id,
            tool_use_id=tool_use_id,
            questions=[q["question"] for q in questions],
        )
        params = {"question_id": question_id, "session_id": session_id, "tool_use_id": tool_use_id,
                  "questions": questions}
        return await self._send(question_id, session_id, cwd, "mobile.question", params, window)

    async def _ask_permission(self, body: Dict[str, Any]) -> Dict[str, Any]:
        """A tool asks to run (PermissionRequest, or PreToolUse of a routed tool): a question with the fixed
        options of clients.permission, bound to the hash of the exact input. A call the user allowed "for
        this session" is allowed again at once, for the same session, tool and input only."""
        session_id = _text(body, "session_id")
        tool_use_id = _text(body, "tool_use_id", required=False)
        cwd = _text(body, "cwd", required=False)
        tool_name, tool_input = body.get("tool_name"), body.get("tool_input")
        try:
            permission.check(tool_name, tool_input)
        except limits.LimitExceeded as exc:
            self.audit.write("permission.refused", session_id=session_id, tool_name=str(tool_name)[:200],
                             code="too_large", detail=str(exc))
            raise RequestRefused(413, "tool_input_too_large") from None
        except ValueError:
            raise RequestRefused(400, "bad_tool_input") from None
        window = _window(body)
        input_hash = permission.input_hash(tool_input)
        session = self.store.session(session_id)
        if session and session["ended"]:
            return {"skip": "session_ended"}
        if self.switch is False:
            self.audit.write("permission.skipped", session_id=session_id, tool_name=tool_name, code=MOBILE_REPLY_OFF)
            return {"skip": MOBILE_REPLY_OFF}
        remembered = self.store.remembered(session_id=session_id, tool_name=tool_name, input_hash=input_hash)
        if remembered:
            self.audit.write("permission.remembered", session_id=session_id, tool_name=tool_name,
                             input_hash=input_hash, question_id=remembered)
            return {"state": "answered", "decision": "allow", "input_hash": input_hash, "remembered": True}
        if tool_use_id:
            existing = self.store.question_for_tool_use(tool_use_id)
            if existing and existing["state"] in OPEN_STATES:
                return {"question_id": existing["question_id"]}
        question_id = str(uuid.uuid4())
        self.store.question_insert(
            question_id=question_id, session_id=session_id, tool_use_id=tool_use_id, window_sec=window,
            tool_input={"tool_name": tool_name, "tool_input": tool_input, "input_hash": input_hash},
            kind="permission",
        )
        self.audit.write("permission.ask", durable=False, question_id=question_id, session_id=session_id,
                         hook_event=str(body.get("event") or "")[:32], tool_name=tool_name, input_hash=input_hash)
        params = {"question_id": question_id, "session_id": session_id, "tool_use_id": tool_use_id,
                  "tool_name": tool_name, "tool_input": tool_input, "input_hash": input_hash}
        return await self._send(question_id, session_id, cwd, "mobile.permission", params, window)

    async def _send(self, question_id: str, session_id: str, cwd: str, method: str, params: Dict[str, Any],
                    window: float) -> Dict[str, Any]:
        """Put a stored question (or permission request) on the platform; name what became of it."""
        self._last_poll[question_id] = time.monotonic()
        try:
            await self._ensure_session(session_id, cwd)
            result = await self.tunnel.call(
                method,
                {**params, "window_sec": max(1, int(-(-window // 1)))},  # whole seconds, rounded up
                timeout=min(QUESTION_CALL_TIMEOUT, window),
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            code = error_code(exc)
            if code is None:
                # No answer: the platform may hold the question, so tell it (later) that it moved.
                self.audit.write("question.moved", question_id=question_id, reason="unreachable", error=repr(exc))
                if self.store.question_transition(question_id, ("asking",), "failed", "unreachable"):
                    self._report("mobile.question_moved", {"question_id": question_id, "reason": "timeout"})
            else:
                self.audit.write("question.refused", question_id=question_id, code=code)
                self.store.question_transition(question_id, ("asking",), "failed", code)
                if code == MOBILE_REPLY_OFF:
                    self.store.set("switch", False)
            self._wake()
            return {"skip": code or "unreachable"}
        result = result if isinstance(result, dict) else {}
        if result.get("mobile_reply") is False:
            self.store.set("switch", False)
            self._move(question_id, "switch_off")
            return {"skip": MOBILE_REPLY_OFF}
        self.store.set("switch", True)
        self.store.question_transition(question_id, ("asking",), "pending")
        platform_state = result.get("state")
        if platform_state in ("expired", "cancelled", "answered_on_desktop", "moved_to_desktop", "session_ended"):
            self.audit.write("question.closed", question_id=question_id, state=platform_state)
            self.store.question_transition(question_id, ("pending",), "closed", str(platform_state))
        self._wake()
        return {"question_id": question_id, "expires_at": result.get("expires_at")}

    async def _wait_question(self, body: Dict[str, Any]) -> Dict[str, Any]:
        question_id = _text(body, "question_id")
        timeout = _timeout(body)
        deadline = time.monotonic() + timeout
        self._waiting[question_id] = self._waiting.get(question_id, 0) + 1
        try:
            while True:
                event = self._changed
                question = self.store.question(question_id)
                if question is None:
                    return {"state": "unknown"}
                if question["state"] == "answered":
                    return self._take(question)
                if question["state"] == "taken":
                    return self._take_again(question)
                if question["state"] not in OPEN_STATES:
                    return {"state": question["state"], "reason": question["reason"]}
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return {"state": "pending"}
                await self._wait_change(event, remaining)
        finally:
            self._waiting[question_id] -= 1
            if not self._waiting[question_id]:
                del self._waiting[question_id]
            self._last_poll[question_id] = time.monotonic()

    def _take(self, question: Dict[str, Any]) -> Dict[str, Any]:
        question_id = question["question_id"]
        if question.get("kind") == "permission":
            return self._take_decision(question)
        self.audit.write("question.take", question_id=question_id, answers=question["answers"], other=question["other"])
        if not self.store.question_transition(question_id, ("answered",), "taken"):
            return {"state": "gone"}
        self._last_poll.pop(question_id, None)
        return {"state": "answered", "answers": question["answers"] or {}, "other": question["other"] or {}}

    def _take_again(self, question: Dict[str, Any]) -> Dict[str, Any]:
        """The hook asks again for a question it took: the daemon that answered it died before the reply
        left (the take is on disk, the hook never saw it). Only that hook knows the question id, and it
        prints once, so handing the stored answer again is what makes it reach the agent exactly once."""
        if question.get("kind") == "permission":
            request = question["tool_input"]
            decision = permission.decision_of(request["tool_name"], question["answers"] or {})
            reason = permission.deny_reason(request["tool_name"], question["other"]) if decision == "deny" else ""
            self.audit.write("permission.take_again", question_id=question["question_id"], decision=decision)
            return {"state": "answered", "decision": decision, "input_hash": request["input_hash"], "reason": reason}
        self.audit.write("question.take_again", question_id=question["question_id"])
        return {"state": "answered", "answers": question["answers"] or {}, "other": question["other"] or {}}

    def _take_decision(self, question: Dict[str, Any]) -> Dict[str, Any]:
        """A permission request's decision (checked against its hash when it arrived, in on_answer)."""
        question_id, request = question["question_id"], question["tool_input"]
        tool_name, input_hash = request["tool_name"], request["input_hash"]
        decision = permission.decision_of(tool_name, question["answers"] or {})
        reason = permission.deny_reason(tool_name, question["other"]) if decision == "deny" else ""
        self.audit.write("permission.take", question_id=question_id, session_id=question["session_id"],
                         tool_name=tool_name, input_hash=input_hash, decision=decision, reason=reason)
        if not self.store.question_transition(question_id, ("answered",), "taken"):
            return {"state": "gone"}
        self._last_poll.pop(question_id, None)
        if decision == "allow_session":
            self.store.remember(session_id=question["session_id"], tool_name=tool_name, input_hash=input_hash,
                                question_id=question_id)
        return {"state": "answered", "decision": decision, "input_hash": input_hash, "reason": reason}

    async def _give_up_route(self, body: Dict[str, Any]) -> Dict[str, Any]:
        question_id = _text(body, "question_id")
        reason = body.get("reason") if body.get("reason") in ("timeout", "hook_gone") else "timeout"
        question = self.store.question(question_id)
        if question is None:
            return {"state": "unknown"}
        if question["state"] == "answered":
            return self._take(question)  # the answer came in just in time
        if question["state"] == "taken":
            return self._take_again(question)
        if question["state"] in OPEN_STATES:
            self._move(question_id, reason)
            return {"state": "moved", "reason": reason}
        return {"state": question["state"], "reason": question["reason"]}

    def _move(self, question_id: str, reason: str) -> bool:
        """Hand a question to the desktop: audit, mark moved, tell the platform (durably)."""
        self.audit.write("question.moved", question_id=question_id, reason=reason)
        moved = self.store.question_transition(question_id, OPEN_STATES, "moved", reason)
        if moved:
            self._report("mobile.question_moved", {"question_id": question_id, "reason": reason})
            self._last_poll.pop(question_id, None)
            self._wake()
        return moved

    async def _desktop_decided(self, body: Dict[str, Any]) -> Dict[str, Any]:
        """The person at the desk answered Claude Code's own dialog first (the hook saw it in the
        transcript): the request leaves the phone as "answered on the desktop"; a phone answer that
        arrives later is refused by the platform, and one that arrived meanwhile is never taken."""
        question_id = _text(body, "question_id")
        decided = body.get("decided") if body.get("decided") in ("allow", "deny") else ""
        question = self.store.question(question_id)
        if question is None or question.get("kind") != "permission":
            return {"state": "unknown"}
        self.audit.write("permission.desktop", question_id=question_id, session_id=question["session_id"],
                         decided=decided, state=question["state"])
        if not self.store.question_transition(question_id, OPEN_STATES, "desktop", "answered_on_desktop"):
            return {"state": question["state"]}
        self._last_poll.pop(question_id, None)
        self._wake()
        self._report("mobile.desktop_answer", {"session_id": question["session_id"], "question_id": question_id,
                                               "tool_use_id": question["tool_use_id"], "answers": {}})
        return {"state": "desktop"}

    async def _desktop_answer(self, body: Dict[str, Any]) -> Dict[str, Any]:
        session_id = _text(body, "session_id")
        tool_use_id = _text(body, "tool_use_id", required=False)
        # The room shows that the agent got its answer, wherever it came from.
        self._report("mobile.hook_event",
                     {"session_id": session_id, "event": "PostToolUse", "tool_use_id": tool_use_id})
        question = self.store.question_for_tool_use(tool_use_id) if tool_use_id else None
        if question is None:
            return {"skipped": "unknown_question"}  # never reached the phone: nothing to tell
        if question["state"] == "taken":
            return {"skipped": "answered_remotely"}
        if question["state"] == "failed" and question["reason"] != "unreachable":
            return {"skipped": "not_on_platform"}
        answers = _desktop_answers(body.get("tool_input"), body.get("tool_response"))
        if answers is None:
            return {"skipped": "no_answers"}
        try:
            limits.check("answer.answers", answers, "answers")
            for text, value in answers.items():
                limits.check("answer.desktop", value if isinstance(value, str) else json.dumps(value),
                             f"answers[{text!r}]")
        except limits.LimitExceeded as exc:
            self.audit.write("desktop.answer_too_large", question_id=question["question_id"], detail=str(exc))
            return {"skipped": "too_large"}
        self.audit.write(
            "desktop.answer", question_id=question["question_id"], tool_use_id=tool_use_id, answers=answers
        )
        if self.store.question_transition(question["question_id"], OPEN_STATES, "desktop", "answered_on_desktop"):
            self._wake()
        self._report(
            "mobile.desktop_answer",
            {
                "session_id": session_id,
                "tool_use_id": tool_use_id,
                "question_id": question["question_id"],
                "answers": answers,
            },
        )
        return {}

    def _consume(self, session_id: str, event: str) -> List[Dict[str, Any]]:
        messages = self.store.messages_queued(session_id)
        if not messages:
            return []
        echo = self._agent_said.get(session_id)
        if echo:
            # The agent's own last words coming back (a phone that forwards them) never restart it.
            echoes = [m for m in messages if _normal(m["text"]) == echo]
            for message in echoes:
                if self.store.message_consume(message["message_id"]):
                    self.audit.write("message.echo_dropped", session_id=session_id,
                                     message_id=message["message_id"])
            if echoes:
                self._report("mobile.message_consumed", {"message_ids": [m["message_id"] for m in echoes]})
            messages = [m for m in messages if m not in echoes]
            if not messages:
                return []
        self.audit.write(event, session_id=session_id, message_ids=[m["message_id"] for m in messages])
        taken = [m for m in messages if self.store.message_consume(m["message_id"])]
        if taken:
            self._report("mobile.message_consumed", {"message_ids": [m["message_id"] for m in taken]})
        return taken

    async def _inject(self, body: Dict[str, Any]) -> Dict[str, Any]:
        session_id = _text(body, "session_id")
        taken = self._consume(session_id, "message.inject")
        return {"messages": [{"message_id": m["message_id"], "text": m["text"]} for m in taken]}

    def _keep_going(self, session_id: str) -> bool:
        session = self.store.session(session_id)
        return bool(session and session["keep_going"] and not session["ended"] and self.switch is not False)

    def _block_with_messages(self, session_id: str) -> Optional[Dict[str, Any]]:
        taken = self._consume(session_id, "stop.block")
        if not taken:
            return None
        session = self.store.session(session_id) or {}
        self.store.session_upsert(session_id, stop_blocks=int(session.get("stop_blocks") or 0) + 1)
        return {"state": "message", "text": "\n\n".join(m["text"] for m in taken)}

    async def _stop(self, body: Dict[str, Any]) -> Dict[str, Any]:
        session_id = _text(body, "session_id")
        self._report("mobile.hook_event", {"session_id": session_id, "event": "Stop"})
        said = body.get("last_assistant_message")
        if isinstance(said, str) and said.strip():
            self._agent_said[session_id] = _normal(said[:LAST_SAID_CHARS])
        if not self._keep_going(session_id):
            return {"state": "no"}
        if not body.get("stop_hook_active"):
            self.store.session_upsert(session_id, stop_blocks=0)  # a fresh stop, not one we caused
        session = self.store.session(session_id) or {}
        if int(session.get("stop_blocks") or 0) >= self.stop_cap:
            self.audit.write("stop.cap", session_id=session_id, blocks=session.get("stop_blocks"))
            return {"state": "no"}
        return self._block_with_messages(session_id) or {"state": "wait"}

    async def _wait_message(self, body: Dict[str, Any]) -> Dict[str, Any]:
        session_id = _text(body, "session_id")
        deadline = time.monotonic() + _timeout(body)
        self._waiting_sessions[session_id] = self._waiting_sessions.get(session_id, 0) + 1
        try:
            while True:
                event = self._changed
                if not self._keep_going(session_id):
                    return {"state": "off"}
                blocked = self._block_with_messages(session_id)
                if blocked:
                    return blocked
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return {"state": "pending"}
                await self._wait_change(event, remaining)
        finally:
            self._waiting_sessions[session_id] -= 1
            if not self._waiting_sessions[session_id]:
                del self._waiting_sessions[session_id]

    async def _session_end(self, body: Dict[str, Any]) -> Dict[str, Any]:
        session_id = _text(body, "session_id")
        reason = _text(body, "reason", required=False) or "other"
        self.audit.write("session.end", session_id=session_id, reason=reason)
        self.store.session_upsert(session_id, ended=1, keep_going=0)
        self.store.forget_session(session_id)  # "remember for this session" ends with it
        for question in self.store.questions_open(session_id):
            # The platform cancels the session's open questions itself when it hears of the end.
            self.store.question_transition(question["question_id"], OPEN_STATES, "closed", "session_ended")
        self._report("mobile.session_end", {"session_id": session_id, "reason": reason})
        self._wake()
        return {}

    # --- delivered outbox items --------------------------------------------------------------
    async def on_answer(self, payload: Dict[str, Any]) -> None:
        question_id = str(payload.get("question_id") or "")
        answers = payload.get("answers") if isinstance(payload.get("answers"), dict) else {}
        other = payload.get("other") if isinstance(payload.get("other"), dict) else {}
        question = self.store.question(question_id)
        if question is None:
            self.audit.write("answer.unknown", question_id=question_id)
            return
        if question["state"] in ("asking", "pending") and question.get("kind") == "permission":
            refusal = _decision_refusal(question, payload, answers)
            if refusal:
                # Never apply a decision made for another input: the hook stops waiting, the desktop asks.
                self.audit.write("permission.refused", question_id=question_id, code=refusal,
                                 got=str(payload.get("input_hash") or "")[:64])
                if self.store.question_transition(question_id, ("asking", "pending"), "failed", refusal):
                    self._report("mobile.question_moved", {"question_id": question_id, "reason": "hook_gone"})
                    self._wake()
                return
        if question["state"] in ("asking", "pending"):
            # A receipt, not a decision: the take that follows fsyncs it (clients.bridge.audit).
            self.audit.write("answer.apply", durable=False, question_id=question_id, answers=answers, other=other)
            self.store.question_answer(question_id, answers, other)
            self._wake()
        elif question["state"] in ("answered", "taken"):
            return  # a replay after a reconnect: already applied
        else:
            self.audit.write("answer.late", question_id=question_id, state=question["state"])

    async def on_question_closed(self, payload: Dict[str, Any]) -> None:
        question_id = str(payload.get("question_id") or "")
        state = str(payload.get("state") or "closed")
        question = self.store.question(question_id)
        if question is None or question["state"] not in OPEN_STATES:
            return
        self.audit.write("question.closed", question_id=question_id, state=state)
        if self.store.question_transition(question_id, OPEN_STATES, "closed", state):
            self._wake()

    async def on_message(self, payload: Dict[str, Any]) -> None:
        message_id = str(payload.get("message_id") or "")
        session_id = str(payload.get("session_id") or "")
        text = payload.get("text")
        if not message_id or not session_id or not isinstance(text, str):
            log.warning("ignoring a malformed mobile.message")
            return
        if payload.get("author") != "user":
            # No self-excitation: only what a person typed on the phone is ever injected.
            self.audit.write("message.refused", message_id=message_id, session_id=session_id, reason="not_user")
            return
        if self.store.message_insert(message_id=message_id, session_id=session_id, text=text):
            self.audit.write("message.queued", message_id=message_id, session_id=session_id)
            self._wake()

    async def on_keep_going(self, payload: Dict[str, Any]) -> None:
        session_id = str(payload.get("session_id") or "")
        if not session_id:
            return
        enabled = bool(payload.get("enabled"))
        self.audit.write("keep_going.set", session_id=session_id, enabled=enabled)
        self.store.session_upsert(session_id, keep_going=int(enabled), stop_blocks=0)
        self._wake()

    async def on_switch(self, payload: Dict[str, Any]) -> None:
        enabled = bool(payload.get("enabled"))
        self.audit.write("switch.set", enabled=enabled)
        self.store.set("switch", enabled)
        if not enabled:
            for question in self.store.questions_open():
                self._move(question["question_id"], "switch_off")
        self._wake()

    # --- background loops --------------------------------------------------------------------
    async def _report_loop(self) -> None:
        backoff = 0.5
        while True:
            await self._reports_ready.wait()
            self._reports_ready.clear()
            for report in self.store.reports_pending():
                try:
                    result = await self.tunnel.call(report["method"], report["params"], timeout=REPORT_CALL_TIMEOUT)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    code = error_code(exc)
                    if code is None:  # no answer: retry the same report later, in order
                        log.info("report %s not delivered yet: %r", report["method"], exc)
                        await asyncio.sleep(random.uniform(0, backoff))  # noqa: S311 - jitter
                        backoff = min(backoff * 2, 30.0)
                        self._reports_ready.set()
                        break
                    log.info("platform refused %s: %s", report["method"], code)
                    self.store.report_done(report["id"], f"error:{code}")
                    continue
                backoff = 0.5
                self.store.report_done(report["id"], "ok")
                if report["method"] == "mobile.session_start":
                    self._session_started(report["params"]["session_id"], result)

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_interval)
            try:
                self.sweep()
            except Exception:
                log.exception("sweep failed")

    def sweep(self) -> None:
        """Hand to the desktop the questions whose hook is gone (window over, nobody polling)."""
        now_wall, now = time.time(), time.monotonic()
        for question in self.store.questions_open():
            question_id = question["question_id"]
            if self._waiting.get(question_id):
                continue
            last_poll = self._last_poll.get(question_id)
            if question["deadline"] + self.hook_grace_sec > now_wall:
                continue
            if last_poll is not None and now - last_poll < self.hook_grace_sec:
                continue
            self._move(question_id, "hook_gone")


def _decision_refusal(question: Dict[str, Any], payload: Dict[str, Any], answers: Dict[str, Any]) -> Optional[str]:
    """Why a delivered decision cannot stand for this permission request (None: it can)."""
    request = question["tool_input"]
    if payload.get("input_hash") != request.get("input_hash"):
        return "input_mismatch"
    decision = permission.decision_of(request.get("tool_name") or "", answers)
    if decision is None or payload.get("decision") != decision:
        return "bad_decision"
    return None


def _normal(text: str) -> str:
    return " ".join(str(text).split()).casefold()


def _window(body: Dict[str, Any]) -> float:
    try:
        return min(max(float(body.get("window_sec") or 120), 1.0), 3600.0)
    except (TypeError, ValueError):
        raise RequestRefused(400, "bad_window_sec") from None


def _timeout(body: Dict[str, Any]) -> float:
    try:
        return min(max(float(body.get("timeout") or 0), 0.0), MAX_WAIT_SEC)
    except (TypeError, ValueError):
        raise RequestRefused(400, "bad_timeout") from None


def _desktop_answers(tool_input: Any, tool_response: Any) -> Optional[Dict[str, str]]:
    for source in (tool_input, tool_response):
        if isinstance(source, dict) and isinstance(source.get("answers"), dict) and source["answers"]:
            return {str(k): str(v) for k, v in source["answers"].items()}
    return None


def _hostname() -> str:
    import socket

    return socket.gethostname()


# --- plugging into the daemon (clients.bridge.daemon imports this module as an extension) ---------
def install_into_daemon() -> None:
    from clients.bridge import daemon as core
    from clients.bridge.local_api import LocalApi

    async def startup(daemon: Any) -> None:
        bridge = MobileBridge(daemon.home, daemon)  # daemon.call(method, params, timeout) is tunnel.call
        await bridge.start()
        api = LocalApi(daemon.home, bridge.dispatch)
        port = api.start()
        daemon.mobile = bridge
        daemon.local_api = api
        log.info("mobile reply: local API on 127.0.0.1:%s", port)

        async def serve_until_stopped() -> None:
            try:
                await asyncio.Event().wait()
            finally:
                api.stop()
                await bridge.stop()
                bridge.store.close()

        daemon.spawn(serve_until_stopped())

    def kind_handler(kind: str) -> Callable[[Any, int, Dict[str, Any]], Awaitable[None]]:
        async def handle(daemon: Any, seq: int, payload: Dict[str, Any]) -> None:
            await daemon.mobile.handlers()[kind](payload)

        return handle

    core.on_startup(startup)
    for kind in ("mobile.answer", "mobile.question_closed", "mobile.message", "mobile.keep_going", "mobile.switch"):
        core.register_kind(kind, kind_handler(kind))
    core.add_capability("mobile_reply")


if __name__ != "__main__":
    install_into_daemon()
