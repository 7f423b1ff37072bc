"""Hypothesis strategies for hostile input: JSON of every shape, text the database cannot store, sizes past
every declared limit, ids of the wrong kind, frames that are not JSON at all."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

from clients import protocol

# Characters that break things downstream: NUL (PostgreSQL text refuses it), lone surrogates (not
# encodable as UTF-8), a right-to-left override, a byte-order mark, quotes, escapes, a 4-byte emoji.
NASTY_CHARS = ["\x00", "\ud800", "\udfff", "\u202e", "\ufeff", '"', "\\", "\n", "\r", "💥", "\u0085", "\x7f"]

nasty_text = st.text(st.characters() | st.sampled_from(NASTY_CHARS), max_size=40)
# Strings just past the limits declared in clients.limits (32 ... 4096 characters) and far past them.
oversize_text = st.builds(lambda size, char: char * size,
                          st.sampled_from([33, 65, 101, 201, 256, 1001, 2001, 4097, 70_000]),
                          st.sampled_from(["a", "é", "💥", "\x00"]))
extreme_ints = st.sampled_from([-1, 0, 2**31, 2**53 + 1, 2**63, -(2**63) - 1, 10**30, -(10**30)])
extreme_floats = st.sampled_from([float("nan"), float("inf"), float("-inf"), 1e308, -0.0, 5e-324])
scalars = (st.none() | st.booleans() | st.integers() | extreme_ints | st.floats() | extreme_floats
           | nasty_text | oversize_text)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(nasty_text, inner, max_size=6),
    max_leaves=25,
)


def near_valid_questions() -> st.SearchStrategy[Any]:
    """AskUserQuestion's ``questions``, shaped right with wrong sizes and types inside."""
    option = st.fixed_dictionaries({"label": nasty_text | oversize_text | scalars},
                                   optional={"description": nasty_text | oversize_text | scalars})
    question = st.fixed_dictionaries(
        {"question": nasty_text | oversize_text | scalars, "options": st.lists(option, max_size=6) | scalars},
        optional={"header": nasty_text | oversize_text | scalars, "multiSelect": st.booleans() | scalars})
    return st.lists(question, max_size=6)


# Parameter names the platform's handlers read (so the fuzzer reaches past "X is required"), and random ones.
KNOWN_KEYS = ["session_id", "cwd", "source", "host", "title", "question_id", "tool_use_id", "reason", "event",
              "questions", "window_sec", "answers", "message_ids", "seq", "stream", "status", "headers",
              "data", "code", "bytes", "text", "end", "body", "protocolVersion", "kind", "version",
              "capabilities", "ports", "roots", "ackedSeq"]
param_values = json_values | near_valid_questions() | st.lists(nasty_text | st.integers() | extreme_ints,
                                                               max_size=5)
params = st.dictionaries(st.sampled_from(KNOWN_KEYS) | nasty_text, param_values, max_size=8)


def _plausible(session: str, question: str) -> dict[str, Any]:
    """Params every handler accepts (the names it ignores cost nothing), so one hostile field gets past the
    "X is required" checks and into the service and the database."""
    return {"session_id": session, "question_id": question, "tool_use_id": f"toolu_{session[:8]}",
            "cwd": "/home/alice/project", "source": "startup", "host": "laptop", "title": "fuzz", "reason": "timeout",
            "event": "Stop", "window_sec": 30, "answers": {"Which?": "A"}, "message_ids": [],
            "questions": [{"question": "Which?", "header": "Pick", "multiSelect": False,
                           "options": [{"label": "A", "description": "a"}, {"label": "B", "description": "b"}]}]}


# What the protocol's own notifications carry, right but for a field (ack {seq}, web.* {stream, seq, ...}).
notification_params = st.builds(
    lambda overrides: {"seq": 1, "stream": "s1", "status": 200, "headers": [], "data": "", "bytes": 1, **overrides},
    st.dictionaries(st.sampled_from(["seq", "stream", "status", "headers", "data", "bytes", "code", "reason",
                                     "text", "end", "body", "subprotocol"]),
                    extreme_ints | scalars | json_values, min_size=1, max_size=3))
hostile_field = nasty_text | oversize_text | scalars | json_values | near_valid_questions()
plausible_params = st.builds(
    lambda session, question, overrides: {**_plausible(session, question), **overrides},
    st.uuids().map(str), st.uuids().map(str),
    st.dictionaries(st.sampled_from(KNOWN_KEYS), hostile_field, min_size=1, max_size=3))
# Everything a ``params`` member can be: mostly objects (half of them right but for a field or three),
# sometimes not an object at all.
any_params = plausible_params | plausible_params | params | json_values

# Request ids: fine ones, and ones that are too long, of the wrong type, or hostile text.
request_ids = (st.uuids().map(str) | st.integers() | extreme_ints | nasty_text.filter(bool) | oversize_text
               | st.floats() | st.booleans() | st.lists(st.integers(), max_size=2) | st.none())


def dumps(message: Any) -> str:
    """JSON as a sloppy client writes it: NaN and Infinity allowed, lone surrogates escaped."""
    return json.dumps(message, allow_nan=True)


def strict_json(text: str) -> bool:
    """``text`` is JSON as the standard has it (what the platform accepts: clients.protocol.loads)."""
    try:
        protocol.loads(text)
    except (ValueError, RecursionError):
        return False
    return True


def deep(depth: int) -> str:
    return "[" * depth + "]" * depth


# Frames that are not a valid JSON-RPC message.
garbage_text = (
    st.text(max_size=200)  # mostly not JSON
    | st.builds(deep, st.sampled_from([100, 1000, 100_000]))  # nesting past the parser's recursion limit
    | st.builds(lambda v: dumps(v), json_values)  # JSON, not an object or a wrong object
    | st.builds(lambda i, m, p: dumps({"id": i, "method": m, "params": p}),  # no "jsonrpc"
                request_ids, nasty_text, any_params)
    | st.builds(lambda v, i, m: dumps({"jsonrpc": v, "id": i, "method": m}),  # wrong version, id or method
                scalars, request_ids, scalars)
    | st.builds(lambda i, r, e: dumps({"jsonrpc": "2.0", "id": i, "result": r, "error": e}),  # bad response
                request_ids, json_values, json_values)
    | st.builds(lambda i, r: dumps({"jsonrpc": "2.0", "id": i, "result": r}), request_ids, json_values)
    | st.just('{"jsonrpc": "2.0", "id": ' + "9" * 5000 + ', "method": "devices.ping"}')  # a 5000-digit id
)
garbage_bytes = st.binary(max_size=300) | st.builds(lambda tail: b"\x01\x05" + tail, st.binary(max_size=40)) \
    | st.builds(lambda tail: b"\x02" + tail, st.binary(max_size=40))

# hello as a device sends it, right but for a field or two.
hello_params = st.builds(
    lambda overrides: {"protocolVersion": 1, "kind": "bridge", "version": "0.1", "capabilities": ["mobile"],
                       "ports": [], "roots": [], "ackedSeq": 0, **overrides},
    st.dictionaries(st.sampled_from(["protocolVersion", "kind", "version", "capabilities", "ports", "roots",
                                     "ackedSeq"]),
                    hostile_field | st.lists(nasty_text | extreme_ints, min_size=1, max_size=3), min_size=1, max_size=2))
