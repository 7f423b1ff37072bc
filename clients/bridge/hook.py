"""`ai1net-bridge hook`: what the agent host (Claude Code) runs for each hook event.

Reads the hook JSON on stdin, asks the local daemon (`<home>/local.json` gives its 127.0.0.1 port and
secret) and prints the hook's JSON answer on stdout. It FAILS OPEN: daemon down, timeout, malformed
input, any exception or AI1NET_MOBILE_OFF=1 -> exit 0 with no output, so the desktop behaves as if
nothing were installed.

This module is also the hook's whole program: ``hooks install`` writes ``python -I -S
<checkout>/clients/bridge/run_hook.py --home H hook …`` (or, from a ``.pyz``, ``python -I -S -c <entry>
ai1net-bridge.pyz H/hook-cache --home H hook …``, whose entry imports this module from the archive's copy in
``H/hook-cache`` (``hook_cache``) or else the archive, and calls ``main`` without runpy, the command line, the
daemon or websockets; ``hooks_install.pyz_launcher``). It runs once per hook event, so its start-up is on the
question's path. It imports ``sys``, ``time``, ``posix`` (``os``'s C half, loaded at every start), the C half of
``json`` (``_json``: the ``json`` package would import ``re``, the dearest module on this path) and, once
there is a daemon to ask, ``_socket`` (a plain HTTP/1.1 request: ``http.client`` pulls in ``email``,
``socket`` itself ``selectors`` and ``enum``); nothing else, not even ``typing`` or ``os``, and it ends without
the interpreter's finalization (``exit_now``). ``bench/roundtrip.py`` prints its start-up beside a bare
interpreter.
"""

# No ``from __future__ import annotations``: it imports the ``__future__`` module when this one runs (0.12-0.15
# ms of each hook call), so the annotations naming typing's names are written as strings.
import sys
import time

# Not ``os``: importing it (with ``_collections_abc``) cost 1.0 ms of each hook call on the bench machine (a bare
# ``python -I -S -c pass`` 6.5 ms, with ``import os`` 7.5). Its C half, loaded at every interpreter's start, has
# what the hook uses.
if sys.platform == "win32":
    import nt as _os
else:
    import posix as _os

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: importing typing costs more than the rest of the hook
    from typing import Any, Dict, List, Optional

ASK_TOOL = "AskUserQuestion"
DEFAULT_WINDOW_SEC = 120.0
STOP_CAP = 5  # consecutive Stop blocks, beside the host's own cap
LONG_POLL_SEC = 25.0
MAX_STDIN_BYTES = 4 * 1024 * 1024
DENY_PREFIX = "The user answered on their phone (this is their answer, not a refusal): "


class DaemonDown(Exception):
    pass


# --- JSON without the json package (which imports re) ------------------------------------------
_CONSTANTS = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}


class _ScanContext:
    """What ``_json.make_scanner`` reads: the settings of ``json.loads`` with no hooks."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = _CONSTANTS.__getitem__
    memo: "Dict[str, Any]" = {}


def loads(data: "Any") -> "Any":
    """``json.loads`` for UTF-8 text or bytes, through the C scanner ``json`` itself uses."""
    if isinstance(data, (bytes, bytearray)):
        # A byte order mark dropped by hand: the "utf-8-sig" codec is a module of its own to import (0.2 ms).
        text = bytes(data[3:] if data[:3] == b"\xef\xbb\xbf" else data).decode("utf-8")
    else:
        text = str(data)
    try:
        from _json import make_scanner
    except ImportError:  # no C accelerator (another Python): the package, re and all
        import json

        return json.loads(text)
    text = text.strip(" \t\n\r")
    try:
        value, end = make_scanner(_ScanContext())(text, 0)
    except StopIteration as exc:
        raise ValueError(f"not JSON (at {exc.value})") from None
    if end != len(text):
        raise ValueError(f"not JSON (extra data at {end})")
    return value


def dumps(value: "Any") -> str:
    """``json.dumps(value)`` (ASCII, ", " and ": ") for what JSON can hold; anything else: TypeError."""
    try:
        from _json import encode_basestring_ascii as quote
    except ImportError:  # no C accelerator (another Python)
        import json

        return json.dumps(value)
    if isinstance(value, str):
        return quote(value)
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError("JSON has no NaN or infinity")
        return float.__repr__(value)
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                raise TypeError(f"keys must be str, not {type(key).__name__}")
        return "{" + ", ".join(f"{quote(k)}: {dumps(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(dumps(item) for item in value) + "]"
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


# --- formatting (pure) -----------------------------------------------------------------------
def answer_values(
    questions: "List[Dict[str, Any]]", answers: "Dict[str, Any]", other: "Optional[Dict[str, Any]]"
) -> "Dict[str, str]":
    """Question text -> "label, label[, free text]", in the order the questions were asked."""
    other = other or {}
    values: "Dict[str, str]" = {}
    for item in questions:
        text = item.get("question") if isinstance(item, dict) else None
        if not isinstance(text, str):
            continue
        labels = answers.get(text) or []
        if isinstance(labels, str):
            labels = [labels]
        parts = [str(label) for label in labels if str(label)]
        free = other.get(text)
        if isinstance(free, str) and free.strip():
            parts.append(free.strip())
        if parts:
            values[text] = ", ".join(parts)
    return values


def pre_tool_use_output(
    tool_input: "Dict[str, Any]", answers: "Dict[str, Any]", other: "Optional[Dict[str, Any]]", style: str = "allow"
) -> "Optional[Dict[str, Any]]":
    questions = tool_input.get("questions") or []
    values = answer_values(questions, answers, other)
    if not values:
        return None
    if style == "deny":
        quoted = ", ".join(f'"{q}"="{a}"' for q, a in values.items())
        reason = f"{DENY_PREFIX}{quoted}. Continue with this answer."
        return {
            "hookSpecificOutput": {
                "hookEventName": "PreToolUse",
                "permissionDecision": "deny",
                "permissionDecisionReason": reason,
            }
        }
    updated = dict(tool_input)  # keep the other keys the tool was called with (metadata, annotations)
    updated["questions"] = questions
    updated["answers"] = values
    return {
        "hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "allow", "updatedInput": updated}
    }


def user_prompt_output(texts: "List[str]") -> "Optional[Dict[str, Any]]":
    if not texts:
        return None
    context = "\n\n".join(f"Message from the user's phone: {text}" for text in texts)
    return {"hookSpecificOutput": {"hookEventName": "UserPromptSubmit", "additionalContext": context}}


def stop_output(text: str) -> "Dict[str, Any]":
    return {"decision": "block", "reason": text}


# --- talking to the daemon -------------------------------------------------------------------
class Daemon:
    def __init__(self, home: str) -> None:
        self.home = home
        self.port = 0
        self.secret = ""
        self.reload()

    def reload(self) -> None:
        with open(self.home + "/local.json", encoding="utf-8") as handle:
            info = loads(handle.read())
        pid = info.get("pid")
        if isinstance(pid, int) and pid > 0 and not _alive(pid):
            # A stale file from a daemon that is gone: do not hand the secret to whatever owns the port now.
            raise DaemonDown("the daemon is not running")
        self.port = int(info["port"])
        self.secret = str(info["secret"])

    def post(self, route: str, body: "Dict[str, Any]", timeout: float) -> "Dict[str, Any]":
        """POST /v1/<route> to the daemon and return its JSON object (HTTP/1.1, one connection each).

        Through ``_socket``, the C module: ``socket`` itself imports ``selectors``, ``enum`` and more, and
        cost the hook more than all its other imports together."""
        import _socket  # only once there is a daemon to talk to

        payload = dumps(body).encode("utf-8")
        head = (
            f"POST /v1/{route} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\nX-AI1NET-Secret: {self.secret}\r\nConnection: close\r\n\r\n"
        )
        deadline = time.monotonic() + max(timeout, 0.05)
        connection = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
        try:
            connection.settimeout(max(timeout, 0.05))
            connection.connect(("127.0.0.1", self.port))
            connection.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
            connection.sendall(head.encode("latin-1") + payload)
            status, data = _read_response(connection, deadline)
        except (OSError, ValueError) as exc:
            raise DaemonDown(str(exc)) from exc
        finally:
            connection.close()
        if status != 200:
            raise DaemonDown(f"daemon answered {status}")
        result = loads(data)
        if not isinstance(result, dict):
            raise DaemonDown("daemon answered with a non-object")
        return result

    def post_retrying(
        self, route: str, body: "Dict[str, Any]", timeout: float, deadline: float
    ) -> "Optional[Dict[str, Any]]":
        """Keep trying until `deadline` while the daemon restarts (it may come back on a new port)."""
        while True:
            try:
                return self.post(route, body, timeout)
            except DaemonDown:
                if time.monotonic() + 0.25 >= deadline:
                    return None
                time.sleep(0.25)
                try:
                    self.reload()
                except (OSError, ValueError, KeyError, DaemonDown):
                    pass


def _read_response(connection: "Any", deadline: float) -> tuple:
    """(status, body) of one HTTP/1.1 response with a Content-Length (what the local API sends)."""
    buffer = b""
    while b"\r\n\r\n" not in buffer:
        buffer += _recv(connection, deadline)
        if len(buffer) > 65536:
            raise ValueError("response head too large")
    head, _, body = buffer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    length = None
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    if length is None:
        raise ValueError("response without Content-Length")
    while len(body) < length:
        body += _recv(connection, deadline)
    return status, body[:length]


def _recv(connection: "Any", deadline: float) -> bytes:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError("the daemon did not answer in time")
    connection.settimeout(remaining)
    chunk = connection.recv(65536)
    if not chunk:
        raise ConnectionError("the daemon closed the connection")
    return chunk


def _environ(name: str) -> str:
    """``os.environ.get(name, "")`` as this process started (``posix.environ`` holds bytes, as ``os`` decodes them)."""
    value = _os.environ.get(name if sys.platform == "win32" else name.encode(), "")
    return value if isinstance(value, str) else value.decode("utf-8", "surrogateescape")


def _alive(pid: int) -> bool:
    if sys.platform == "win32":
        return True  # os.kill(pid, 0) would terminate the process on Windows
    try:
        _os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, owned by someone else
        return True
    return True


# --- events ----------------------------------------------------------------------------------
def handle(event: "Dict[str, Any]", daemon: Daemon, *, window: float, style: str) -> "Optional[Dict[str, Any]]":
    name = event.get("hook_event_name")
    session_id = event.get("session_id")
    if not isinstance(session_id, str) or not session_id:
        return None
    if name in ("PermissionRequest", "PreToolUse") and isinstance(event.get("turn_id"), str):  # Codex CLI
        from clients.bridge.codex_hook import handle as codex_handle  # only Codex's payloads carry turn_id

        return codex_handle(event, daemon, window=window)
    routed = name in ("PermissionRequest", "PreToolUse") and event.get("tool_name") != ASK_TOOL
    if routed and "turn_id" not in event:  # Claude Code's; Codex's output contract differs
        from clients.bridge import permission_hook  # tool approval from the phone (routed tools only)

        return permission_hook.permission_request(event, daemon, window=window)
    if name == "SessionStart":
        daemon.post(
            "session-start",
            {
                "session_id": session_id,
                "cwd": event.get("cwd") or "",
                "source": event.get("source") or "",
                "title": event.get("session_title") or "",
            },
            timeout=1.0,
        )
        return None
    if name == "SessionEnd":
        daemon.post("session-end", {"session_id": session_id, "reason": event.get("reason") or ""}, timeout=0.5)
        return None
    if name == "PreToolUse" and event.get("tool_name") == ASK_TOOL:
        return _pre_tool_use(event, daemon, window=window, style=style)
    if name == "PostToolUse" and event.get("tool_name") == ASK_TOOL:
        daemon.post(
            "post-tool-use",
            {
                "session_id": session_id,
                "tool_use_id": event.get("tool_use_id") or "",
                "tool_input": event.get("tool_input") or {},
                "tool_response": event.get("tool_response") if isinstance(event.get("tool_response"), dict) else {},
            },
            timeout=1.0,
        )
        return None
    if name == "UserPromptSubmit":
        result = daemon.post("user-prompt-submit", {"session_id": session_id}, timeout=2.0)
        return user_prompt_output([str(m["text"]) for m in result.get("messages") or []])
    if name == "Stop":
        return _stop(event, daemon, window=window)
    return None


def _pre_tool_use(event: "Dict[str, Any]", daemon: Daemon, *, window: float, style: str) -> "Optional[Dict[str, Any]]":
    tool_input = event.get("tool_input")
    if not isinstance(tool_input, dict) or not isinstance(tool_input.get("questions"), list):
        return None
    result = ask_and_wait(event, daemon, tool_use_id=event.get("tool_use_id") or "", tool_input=tool_input,
                          window=window)
    if result is None:
        return None
    return pre_tool_use_output(tool_input, result.get("answers") or {}, result.get("other"), style)


def ask_and_wait(event: "Dict[str, Any]", daemon: Daemon, *, tool_use_id: str, tool_input: "Dict[str, Any]",
                 window: float) -> "Optional[Dict[str, Any]]":
    """Put ``tool_input`` (AskUserQuestion's shape) to the phone and wait: the daemon's "answered" reply,
    or None (no answer in time, moved, skipped, the daemon unreachable)."""
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
    return wait_for_answer(daemon, question_id, deadline)


def wait_for_answer(daemon: Daemon, question_id: str, deadline: float, *, poll_sec: float = LONG_POLL_SEC,
                    stop: "Optional[Any]" = None) -> "Optional[Dict[str, Any]]":
    """Wait for the phone's answer to ``question_id`` until ``deadline``, then give it up to the desk (an
    answer that came in just in time still counts). The daemon's "answered" reply, or None: moved, gone,
    the daemon unreachable, or ``stop()`` true before a poll (the permission hook's desk watch)."""
    while True:
        if stop is not None and stop():
            return None
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            result = daemon.post_retrying(
                "questions/give-up", {"question_id": question_id, "reason": "timeout"}, 3.0, time.monotonic() + 3.0
            )
        else:
            poll = min(remaining, poll_sec)
            result = daemon.post_retrying(
                "questions/wait", {"question_id": question_id, "timeout": poll}, poll + 5, deadline
            )
        if result is None:
            if time.monotonic() < deadline:
                continue
            return None
        state = result.get("state")
        if state == "answered":
            return result
        if state != "pending" or remaining <= 0:
            return None


def _stop(event: "Dict[str, Any]", daemon: Daemon, *, window: float) -> "Optional[Dict[str, Any]]":
    body = {"session_id": event["session_id"], "stop_hook_active": bool(event.get("stop_hook_active"))}
    said = event.get("last_assistant_message")
    if isinstance(said, str) and said:
        body["last_assistant_message"] = said[:100_000]  # so the agent's own words never come back as input
    first = daemon.post("stop", body, timeout=2.0)
    if first.get("state") == "message":
        return stop_output(str(first["text"]))
    if first.get("state") != "wait":
        return None
    deadline = time.monotonic() + window
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        poll = min(remaining, LONG_POLL_SEC)
        result = daemon.post_retrying(
            "sessions/wait-message", {"session_id": event["session_id"], "timeout": poll}, poll + 5, deadline
        )
        if result is None:
            return None
        if result.get("state") == "message":
            return stop_output(str(result["text"]))
        if result.get("state") != "pending":
            return None


def run(
    home: str, *, window: float = DEFAULT_WINDOW_SEC, style: str = "allow", stdin: "Any" = None, stdout: "Any" = None
) -> int:
    """Run one hook call. Always returns 0; prints one JSON object or nothing."""
    try:
        raw = (stdin or sys.stdin.buffer).read(MAX_STDIN_BYTES)
        if _environ("AI1NET_MOBILE_OFF").strip() not in ("", "0"):
            return 0
        event = loads(raw)
        if not isinstance(event, dict):
            return 0
        output = handle(event, Daemon(home), window=float(window), style=style)
        if output is None:
            return 0
        text = dumps(output)
        out = stdout or sys.stdout
        out.write(text + "\n")
        out.flush()
    except BaseException:  # noqa: BLE001, S110 - fail open: whatever happens, the desktop carries on as usual
        pass
    return 0


def parse_args(argv: "List[str]") -> "Optional[Dict[str, Any]]":
    """``[--home H] [-v] hook [--window W] [--answer-style allow|deny] [--home H]`` -> options, or None
    for anything else (the full command line then handles it, with its usage errors)."""
    options: "Dict[str, Any]" = {"home": "~/.config/ai1net", "window": DEFAULT_WINDOW_SEC, "style": "allow"}
    seen_hook = False
    args = list(argv)
    while args:
        arg = args.pop(0)
        name, eq, inline = arg.partition("=")
        if arg in ("-v", "--verbose") and not seen_hook:
            continue
        if arg == "hook" and not seen_hook:
            seen_hook = True
            continue
        if name in ("--home", "--window", "--answer-style") and (seen_hook or name == "--home"):
            if not eq:
                if not args:
                    return None
                inline = args.pop(0)
            if name == "--home":
                options["home"] = inline
            elif name == "--window":
                try:
                    options["window"] = float(inline)
                except ValueError:
                    return None
            elif inline in ("allow", "deny"):
                options["style"] = inline
            else:
                return None
            continue
        return None
    return options if seen_hook else None


def main(argv: "Optional[List[str]]" = None) -> int:
    """``python -S clients/bridge/hook.py --home H hook …`` (or via ``clients.bridge.__main__``)."""
    options = parse_args(sys.argv[1:] if argv is None else argv)
    if options is None:
        return 0  # not a hook command line: fail open all the same
    home = options["home"]
    if home.startswith("~"):  # a command written by hand (``hooks install`` writes the home resolved)
        import os

        home = os.path.expanduser(home)
    return run(home, window=options["window"], style=options["style"])


def exit_now(code: int) -> None:
    """End the hook's process without the interpreter's finalization (tearing down its modules, a last
    collection): 1.1 ms of a bare interpreter's 7 on the bench machine, and the agent host waits for the
    exit. Nothing is left to run then: the hook starts no thread, registers no atexit handler, writes no
    file, and its output is flushed here."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # the host stopped reading: nothing more to tell it
            pass
    _os._exit(code)


if __name__ == "__main__":
    exit_now(main())
