"""Tool-permission requests on the desktop side, without processes: the daemon's logic against a fake
tunnel (hash binding, single take, remember for the session, fail open) and the hook's exact output."""

from __future__ import annotations

import pytest

from clients import permission
from clients.bridge import hook, permission_hook
from clients.bridge.local_api import RequestRefused
from clients.bridge.mobile import MobileBridge

from .fakes import FakeTunnel

BASH = {"command": "ls -la", "description": "list"}
TEXT = permission.question_text("Bash")


@pytest.fixture
async def bridge(tmp_path):
    tunnel = FakeTunnel()
    tunnel.results["mobile.permission"] = lambda p: {"question_id": p["question_id"], "state": "pending",
                                                    "expires_at": "2030-01-01T00:00:00Z", "mobile_reply": True}
    bridge = MobileBridge(tmp_path, tunnel, sweep_interval=3600)
    await bridge.start()
    yield bridge
    await bridge.stop()
    bridge.store.close()


def body(**extra):
    return {"session_id": "s1", "event": "PreToolUse", "tool_use_id": "toolu_7", "tool_name": "Bash",
            "tool_input": BASH, "cwd": "/work", "window_sec": 60, **extra}


def delivered(question_id, label, **extra):
    return {"question_id": question_id, "answers": {TEXT: [label]}, "other": {},
            "input_hash": permission.input_hash(BASH), "decision": permission.DECISIONS[label], **extra}


def events(bridge):
    return [entry["event"] for entry in bridge.audit.entries()]


async def test_the_request_goes_out_bound_to_the_input_hash_and_its_decision_is_taken_once(bridge):
    asked = await bridge.dispatch("permission-request", body())
    [sent] = bridge.tunnel.params("mobile.permission")
    assert sent == {"question_id": asked["question_id"], "session_id": "s1", "tool_use_id": "toolu_7",
                    "tool_name": "Bash", "tool_input": BASH, "input_hash": permission.input_hash(BASH),
                    "window_sec": 60}
    await bridge.on_answer(delivered(asked["question_id"], permission.DENY, other={TEXT: "not now"}))
    taken = await bridge.dispatch("questions/wait", {"question_id": asked["question_id"], "timeout": 2})
    assert taken == {"state": "answered", "decision": "deny", "input_hash": permission.input_hash(BASH),
                     "reason": "The user denied this tool call from their phone: not now"}
    # Asked again (the reply died with a killed daemon): the same decision, audited, still taken once.
    again = await bridge.dispatch("questions/wait", {"question_id": asked["question_id"], "timeout": 0})
    assert again == taken
    assert events(bridge) == ["permission.ask", "answer.apply", "permission.take", "permission.take_again"]


async def test_a_decision_for_another_input_is_never_applied(bridge):
    asked = await bridge.dispatch("permission-request", body())
    await bridge.on_answer(delivered(asked["question_id"], permission.ALLOW, input_hash="f" * 64))
    result = await bridge.dispatch("questions/wait", {"question_id": asked["question_id"], "timeout": 2})
    assert result == {"state": "failed", "reason": "input_mismatch"}
    assert events(bridge)[-1] == "permission.refused"


async def test_a_decision_that_is_not_the_chosen_option_is_never_applied(bridge):
    asked = await bridge.dispatch("permission-request", body())
    await bridge.on_answer(delivered(asked["question_id"], permission.DENY, decision="allow"))
    result = await bridge.dispatch("questions/wait", {"question_id": asked["question_id"], "timeout": 2})
    assert result == {"state": "failed", "reason": "bad_decision"}


async def test_allow_for_the_session_allows_the_same_call_again_and_nothing_else(bridge):
    asked = await bridge.dispatch("permission-request", body())
    await bridge.on_answer(delivered(asked["question_id"], permission.ALLOW_SESSION))
    taken = await bridge.dispatch("questions/wait", {"question_id": asked["question_id"], "timeout": 2})
    assert taken["decision"] == "allow_session"
    again = await bridge.dispatch("permission-request", body(tool_use_id="toolu_8"))
    assert again == {"state": "answered", "decision": "allow", "input_hash": permission.input_hash(BASH),
                     "remembered": True}
    assert len(bridge.tunnel.params("mobile.permission")) == 1
    other = await bridge.dispatch("permission-request", body(tool_use_id="toolu_9", tool_input={"command": "rm x"}))
    assert "question_id" in other  # another input asks again
    elsewhere = await bridge.dispatch("permission-request", body(session_id="s2", tool_use_id="toolu_10"))
    assert "question_id" in elsewhere  # another session asks again
    await bridge.dispatch("session-end", {"session_id": "s1", "reason": "other"})
    assert bridge.store.remembered(session_id="s1", tool_name="Bash", input_hash=permission.input_hash(BASH)) is None
    assert "permission.remembered" in events(bridge)


async def test_switch_off_and_oversize_input_fail_open(bridge):
    big = {"command": "x" * (permission.limits.LIMITS["permission.tool_input"].max + 1)}
    with pytest.raises(RequestRefused) as refused:
        await bridge.dispatch("permission-request", body(tool_input=big))
    assert refused.value.status == 413
    await bridge.on_switch({"enabled": False})
    assert await bridge.dispatch("permission-request", body()) == {"skip": "mobile_reply_off"}
    assert bridge.tunnel.params("mobile.permission") == []


# --- the hook ------------------------------------------------------------------------------------------


class ScriptedDaemon:
    """The daemon as the hook sees it: canned answers per route, calls recorded."""

    def __init__(self, answers):
        self.answers = answers
        self.calls = []

    def post(self, route, body, timeout):
        self.calls.append((route, body))
        answer = self.answers[route]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def post_retrying(self, route, body, timeout, deadline):
        return self.post(route, body, timeout)


def event(name, tool_input=None):
    event = {"session_id": "s1", "transcript_path": "/t", "cwd": "/work", "hook_event_name": name,
             "tool_name": "Bash", "tool_input": BASH if tool_input is None else tool_input}
    if name == "PreToolUse":
        event["tool_use_id"] = "toolu_7"
    return event


def answered(decision, reason="", input_hash=None):
    return {"state": "answered", "decision": decision, "reason": reason,
            "input_hash": input_hash or permission.input_hash(BASH)}


@pytest.mark.parametrize(("name", "decision", "expected"), [
    ("PermissionRequest", "allow", {"behavior": "allow"}),
    ("PermissionRequest", "allow_session", {"behavior": "allow"}),
    ("PermissionRequest", "deny", {"behavior": "deny", "message": "no: not now"}),
])
def test_permission_request_output_is_the_documented_decision(name, decision, expected):
    daemon = ScriptedDaemon({"permission-request": {"question_id": "q1"},
                             "questions/wait": answered(decision, "no: not now")})
    out = hook.handle(event(name), daemon, window=5, style="allow")
    assert out == {"hookSpecificOutput": {"hookEventName": "PermissionRequest", "decision": expected}}
    route, sent = daemon.calls[0]
    assert route == "permission-request" and sent["tool_use_id"] == "" and sent["event"] == "PermissionRequest"


def test_pre_tool_use_output_allows_or_denies_with_a_reason_the_model_reads():
    daemon = ScriptedDaemon({"permission-request": {"question_id": "q1"}, "questions/wait": answered("allow")})
    assert hook.handle(event("PreToolUse"), daemon, window=5, style="allow") == {"hookSpecificOutput": {
        "hookEventName": "PreToolUse", "permissionDecision": "allow",
        "permissionDecisionReason": permission_hook.ALLOW_REASON}}
    daemon = ScriptedDaemon({"permission-request": {"question_id": "q1"},
                             "questions/wait": answered("deny", "The user denied this: use make")})
    assert hook.handle(event("PreToolUse"), daemon, window=5, style="allow") == {"hookSpecificOutput": {
        "hookEventName": "PreToolUse", "permissionDecision": "deny",
        "permissionDecisionReason": "The user denied this: use make"}}
    remembered = ScriptedDaemon({"permission-request": {**answered("allow"), "remembered": True}})
    out = hook.handle(event("PreToolUse"), remembered, window=5, style="allow")
    assert out["hookSpecificOutput"]["permissionDecisionReason"] == permission_hook.REMEMBERED_REASON
    assert [route for route, _ in remembered.calls] == ["permission-request"]


def test_a_decision_for_another_input_gives_no_output():
    daemon = ScriptedDaemon({"permission-request": {"question_id": "q1"},
                             "questions/wait": answered("allow", input_hash=permission.input_hash({"command": "rm"}))})
    assert hook.handle(event("PreToolUse"), daemon, window=5, style="allow") is None


@pytest.mark.parametrize("answers", [
    {"permission-request": {"skip": "mobile_reply_off"}},
    {"permission-request": hook.DaemonDown("refused")},
    {"permission-request": {"question_id": "q1"}, "questions/wait": {"state": "moved", "reason": "timeout"}},
    {"permission-request": {"question_id": "q1"}, "questions/wait": {"state": "failed", "reason": "input_mismatch"}},
])
def test_no_decision_means_no_output_and_the_desktop_asks(answers, tmp_path):
    daemon = ScriptedDaemon(answers)
    if isinstance(answers["permission-request"], Exception):
        with pytest.raises(hook.DaemonDown):  # run() turns it into no output
            hook.handle(event("PermissionRequest"), daemon, window=5, style="allow")
    else:
        assert hook.handle(event("PermissionRequest"), daemon, window=5, style="allow") is None
    out = _run_hook(tmp_path, event("PermissionRequest"))
    assert out == ""  # no daemon at all: nothing printed, exit 0


def test_codex_events_and_ask_user_question_are_not_taken_for_permission_requests():
    daemon = ScriptedDaemon({})
    codex = dict(event("PreToolUse"), turn_id="t1")
    assert hook.handle(codex, daemon, window=5, style="allow") is None
    assert daemon.calls == []


def _run_hook(tmp_path, payload):
    import io
    import json

    out = io.StringIO()
    assert hook.run(str(tmp_path), stdin=io.BytesIO(json.dumps(payload).encode()), stdout=out) == 0
    return out.getvalue()


def test_the_pending_state_keeps_the_hook_waiting_until_the_answer():
    daemon = ScriptedDaemon({"permission-request": {"question_id": "q1"}})
    states = iter([{"state": "pending"}, {"state": "pending"}, answered("allow")])
    daemon.post_retrying = lambda route, body, timeout, deadline: next(states)
    out = permission_hook.permission_request(event("PreToolUse"), daemon, window=5)
    assert out["hookSpecificOutput"]["permissionDecision"] == "allow"


# --- hooks install --approve ---------------------------------------------------------------------------


def test_hooks_install_approve_routes_the_tools_and_rollback_removes_exactly_that(tmp_path):
    import json

    from clients.bridge.hooks_install import HooksInstallError, install, parse_approve, rollback

    settings = tmp_path / "settings.json"
    original = b'{\n  "hooks": {\n    "PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": "x"}]}]\n  }\n}\n'
    settings.write_bytes(original)
    home = tmp_path / "home"
    approve = parse_approve("Bash, Write,Edit,Bash")
    assert approve == ["Bash", "Write", "Edit"]
    first = install(home=home, settings_path=settings, window=60, launcher="bridge", approve=approve)
    hooks = json.loads(settings.read_text())["hooks"]
    handler = {"type": "command", "command": first["command"], "timeout": 90,
               "statusMessage": "Approval request sent to your phone (ai1net)…"}
    assert hooks["PermissionRequest"] == [{"matcher": "^(?!(AskUserQuestion|Bash|Write|Edit)$)", "hooks": [handler]}]
    assert hooks["PreToolUse"][0]["matcher"] == "Bash"  # the user's own entry stays first
    assert {"matcher": "Bash|Write|Edit", "hooks": [handler]} in hooks["PreToolUse"]
    again = install(home=home, settings_path=settings, window=60, launcher="bridge", approve=approve)
    assert again["changed"] is False
    only_asked = install(home=home, settings_path=settings, window=60, launcher="bridge", approve=parse_approve("asked"))
    hooks = json.loads(settings.read_text())["hooks"]
    assert only_asked["changed"] and hooks["PermissionRequest"][0]["matcher"] == "^(?!(AskUserQuestion)$)"
    assert not any(group.get("matcher") == "Bash|Write|Edit" for group in hooks["PreToolUse"])
    assert rollback(home=home) == [{"settings": str(settings.resolve()), "action": "restored"}]
    assert settings.read_bytes() == original
    for bad in ("Bash(rm)", "AskUserQuestion", "", "a|b"):
        with pytest.raises(HooksInstallError):
            parse_approve(bad)
    assert parse_approve(None) is None
    assert parse_approve("mcp__my-server__deploy") == ["mcp__my-server__deploy"]  # MCP tools by full name


# --- desk versus phone ---------------------------------------------------------------------------------


def _line(role, block):
    import json

    return json.dumps({"type": role, "message": {"role": role, "content": [block]}}) + "\n"


def test_desk_watch_sees_the_desks_answer_in_the_transcript_and_nothing_older(tmp_path):
    transcript = tmp_path / "t.jsonl"
    old = {"type": "tool_use", "id": "toolu_old", "name": "Bash", "input": BASH}
    transcript.write_text(_line("assistant", old) + _line("user", {"type": "tool_result", "tool_use_id": "toolu_old",
                                                                    "content": "x", "is_error": False})
                          + _line("assistant", dict(old, id="toolu_now")))
    watch = permission_hook.DeskWatch(str(transcript), "Bash", permission.input_hash(BASH))
    assert watch.usable and watch.answered() == ""  # the same call settled earlier is not this one
    other = permission_hook.DeskWatch(str(transcript), "Bash", permission.input_hash({"command": "rm"}))
    with transcript.open("a") as handle:
        handle.write('{"partial": ')  # a line still being written
    assert watch.answered() == ""
    with transcript.open("a") as handle:
        handle.write("\n" + _line("user", {"type": "tool_result", "tool_use_id": "toolu_now",
                                           "content": "The user doesn't want to proceed", "is_error": True}))
    assert watch.answered() == "deny" and other.answered() == ""
    assert permission_hook.DeskWatch(None, "Bash", "h").answered() == ""


async def test_the_desks_answer_takes_the_request_off_the_phone_and_a_phone_answer_is_never_taken(bridge):
    asked = await bridge.dispatch("permission-request", body())
    done = await bridge.dispatch("permission/desktop", {"question_id": asked["question_id"], "decided": "allow"})
    assert done == {"state": "desktop"}
    [report] = await _reports(bridge, "mobile.desktop_answer")
    assert report == {"session_id": "s1", "question_id": asked["question_id"], "tool_use_id": "toolu_7",
                      "answers": {}}
    await bridge.on_answer(delivered(asked["question_id"], permission.ALLOW))
    result = await bridge.dispatch("questions/wait", {"question_id": asked["question_id"], "timeout": 0})
    assert result == {"state": "desktop", "reason": "answered_on_desktop"}
    assert "permission.take" not in events(bridge)


def test_the_hook_reports_the_desks_answer_and_prints_nothing(tmp_path):
    transcript = tmp_path / "t.jsonl"
    transcript.write_text(_line("assistant", {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": BASH}))
    daemon = ScriptedDaemon({"permission-request": {"question_id": "q1"}, "permission/desktop": {"state": "desktop"}})

    def wait(route, body, timeout, deadline):
        daemon.calls.append((route, body))
        if route == "questions/wait":
            with transcript.open("a") as handle:  # the desk answers while the hook waits
                handle.write(_line("user", {"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}))
            return {"state": "pending"}
        return daemon.answers[route]

    daemon.post_retrying = wait
    assert permission_hook.permission_request(dict(event("PermissionRequest"), transcript_path=str(transcript)),
                                              daemon, window=30) is None
    assert [route for route, _ in daemon.calls] == ["permission-request", "questions/wait", "permission/desktop"]
    assert daemon.calls[1][1]["timeout"] == permission_hook.DESK_POLL_SEC
    assert daemon.calls[2][1] == {"question_id": "q1", "decided": "allow"}


async def _reports(bridge, method):
    import asyncio
    import time

    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if bridge.tunnel.params(method) and not bridge.store.reports_pending():
            return bridge.tunnel.params(method)
        await asyncio.sleep(0.01)
    raise AssertionError(f"{method} not reported: {bridge.tunnel.calls}")


@pytest.mark.parametrize("tool_input", [
    {"command": "ls -la", "description": "list"},
    {"file_path": "/tmp/é.py", "old_string": "a\n\tb \"q\" \\", "new_string": "日本語 \u2028 😀", "replace_all": False},
    {"z": [1, 2.5, -0.0, 1e300, None, True, {"b": 1, "a": [{}]}], "a": {"y": "", "x": 10**30}},
    {},
])
def test_the_hooks_own_hash_is_the_platforms(tool_input):
    # The hook hashes with the C halves of json and sha256 (no json/hashlib import on its way to the phone).
    assert permission_hook.input_hash(tool_input) == permission.input_hash(tool_input)


def test_the_hooks_own_hash_refuses_what_json_cannot_hold():
    with pytest.raises((TypeError, ValueError)):
        permission_hook.input_hash({"x": float("nan")})
    with pytest.raises(TypeError):
        permission_hook.input_hash({"x": object()})
