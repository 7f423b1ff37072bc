"""What the hook prints: the exact JSON shapes Claude Code reads."""

import io
import json

import pytest

from clients.bridge import hook
from tests.bridge.questions import FEATURES, FRAMEWORK


def test_single_question_allow_echoes_the_questions_and_adds_answers():
    tool_input = {"questions": [FRAMEWORK]}
    out = hook.pre_tool_use_output(tool_input, {"Which framework?": ["React"]}, None)
    assert out == {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "allow",
            "updatedInput": {"questions": [FRAMEWORK], "answers": {"Which framework?": "React"}},
        }
    }
    assert tool_input == {"questions": [FRAMEWORK]}  # the original is not modified


def test_several_questions_multi_select_joined_and_other_text_appended_in_asked_order():
    tool_input = {"questions": [FRAMEWORK, FEATURES], "metadata": {"source": "x"}}
    out = hook.pre_tool_use_output(
        tool_input,
        {"Which features?": ["Auth", "Export"], "Which framework?": []},
        {"Which framework?": "  Svelte, please "},
    )
    updated = out["hookSpecificOutput"]["updatedInput"]
    assert updated == {
        "questions": [FRAMEWORK, FEATURES],
        "metadata": {"source": "x"},
        "answers": {"Which framework?": "Svelte, please", "Which features?": "Auth, Export"},
    }
    assert list(updated["answers"]) == ["Which framework?", "Which features?"]


def test_labels_and_other_text_together():
    values = hook.answer_values([FEATURES], {"Which features?": ["Search"]}, {"Which features?": "and dark mode"})
    assert values == {"Which features?": "Search, and dark mode"}


def test_deny_style_says_it_is_the_users_answer_and_quotes_it():
    out = hook.pre_tool_use_output(
        {"questions": [FRAMEWORK, FEATURES]},
        {"Which framework?": ["Vue"], "Which features?": ["Auth", "Search"]},
        {},
        style="deny",
    )
    assert out == {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "deny",
            "permissionDecisionReason": "The user answered on their phone (this is their answer, not a refusal): "
            '"Which framework?"="Vue", "Which features?"="Auth, Search". Continue with this answer.',
        }
    }


def test_no_usable_answer_means_no_output():
    assert hook.pre_tool_use_output({"questions": [FRAMEWORK]}, {"Something else?": ["x"]}, {}) is None
    assert hook.pre_tool_use_output({"questions": [FRAMEWORK]}, {}, {"Which framework?": "   "}) is None


def test_user_prompt_submit_and_stop_shapes():
    assert hook.user_prompt_output([]) is None
    assert hook.user_prompt_output(["run the tests", "then push"]) == {
        "hookSpecificOutput": {
            "hookEventName": "UserPromptSubmit",
            "additionalContext": "Message from the user's phone: run the tests\n\n"
            "Message from the user's phone: then push",
        }
    }
    assert hook.stop_output("keep going with B") == {"decision": "block", "reason": "keep going with B"}


class _Daemon:
    """A stand-in for the daemon's HTTP API (hook.Daemon's interface)."""

    def __init__(self, replies):
        self.replies = replies
        self.posts = []

    def post(self, route, body, timeout):
        self.posts.append((route, body))
        reply = self.replies[route]
        return reply.pop(0) if isinstance(reply, list) else reply

    def post_retrying(self, route, body, timeout, deadline):
        return self.post(route, body, timeout)


def test_pre_tool_use_flow_long_polls_until_the_answer():
    daemon = _Daemon(
        {
            "pre-tool-use": {"question_id": "q1"},
            "questions/wait": [{"state": "pending"}, {"state": "answered", "answers": {"Which framework?": ["Vue"]}}],
        }
    )
    event = {
        "hook_event_name": "PreToolUse",
        "session_id": "s1",
        "tool_name": "AskUserQuestion",
        "tool_use_id": "toolu_1",
        "tool_input": {"questions": [FRAMEWORK]},
    }
    out = hook.handle(event, daemon, window=30, style="allow")
    assert out["hookSpecificOutput"]["updatedInput"]["answers"] == {"Which framework?": "Vue"}
    assert [route for route, _ in daemon.posts] == ["pre-tool-use", "questions/wait", "questions/wait"]
    assert daemon.posts[0][1]["window_sec"] == 30


def test_pre_tool_use_moved_or_skipped_prints_nothing():
    event = {
        "hook_event_name": "PreToolUse",
        "session_id": "s1",
        "tool_name": "AskUserQuestion",
        "tool_input": {"questions": [FRAMEWORK]},
    }
    skipped = _Daemon({"pre-tool-use": {"skip": "mobile_reply_off"}})
    assert hook.handle(event, skipped, window=30, style="allow") is None
    moved = _Daemon({"pre-tool-use": {"question_id": "q1"}, "questions/wait": {"state": "moved"}})
    assert hook.handle(event, moved, window=30, style="allow") is None


def test_pre_tool_use_window_over_gives_up_but_takes_a_last_moment_answer():
    event = {
        "hook_event_name": "PreToolUse",
        "session_id": "s1",
        "tool_name": "AskUserQuestion",
        "tool_input": {"questions": [FRAMEWORK]},
    }
    daemon = _Daemon(
        {
            "pre-tool-use": {"question_id": "q1"},
            "questions/wait": {"state": "pending"},
            "questions/give-up": {"state": "answered", "answers": {"Which framework?": ["React"]}},
        }
    )
    out = hook.handle(event, daemon, window=0.0001, style="allow")
    assert out["hookSpecificOutput"]["updatedInput"]["answers"] == {"Which framework?": "React"}
    assert daemon.posts[-1] == ("questions/give-up", {"question_id": "q1", "reason": "timeout"})


def test_other_tools_and_events_are_left_alone():
    daemon = _Daemon({})
    assert hook.handle({"hook_event_name": "PreToolUse", "session_id": "s", "tool_name": "Bash"}, daemon, window=5, style="allow") is None
    assert hook.handle({"hook_event_name": "Notification", "session_id": "s"}, daemon, window=5, style="allow") is None
    assert daemon.posts == []


def test_run_prints_one_json_line(tmp_path, monkeypatch):
    monkeypatch.setattr(hook, "Daemon", lambda home: _Daemon({"user-prompt-submit": {"messages": [{"text": "hi"}]}}))
    out = io.StringIO()
    event = {"hook_event_name": "UserPromptSubmit", "session_id": "s", "prompt": "x"}
    assert hook.run(str(tmp_path), stdin=io.BytesIO(json.dumps(event).encode()), stdout=out) == 0
    assert json.loads(out.getvalue()) == hook.user_prompt_output(["hi"])
    assert out.getvalue().count("\n") == 1


def test_run_fails_open_on_any_error(tmp_path, monkeypatch):
    def broken(home):
        raise RuntimeError("boom")

    monkeypatch.setattr(hook, "Daemon", broken)
    for raw in (b"", b"not json", b"[1, 2]", json.dumps({"hook_event_name": "SessionStart", "session_id": "s"}).encode()):
        out = io.StringIO()
        assert hook.run(str(tmp_path), stdin=io.BytesIO(raw), stdout=out) == 0
        assert out.getvalue() == ""


# --- the hook's own command line and start-up (it runs once per hook event) ------------------------
def test_hook_command_line_is_parsed_without_argparse():
    assert hook.parse_args(["--home", "/h", "hook", "--window", "90", "--answer-style", "deny"]) == {
        "home": "/h", "window": 90.0, "style": "deny"}
    assert hook.parse_args(["hook", "--home=/x", "--window=5"]) == {"home": "/x", "window": 5.0, "style": "allow"}
    assert hook.parse_args(["-v", "--home", "/h", "hook"])["home"] == "/h"
    for argv in (["run"], ["--home", "/h"], ["hook", "--window", "soon"], ["hook", "--answer-style", "maybe"],
                 ["hook", "--bogus"], ["hooks", "install"], ["hook", "--window"]):
        assert hook.parse_args(argv) is None, argv


def test_the_hook_reads_json_with_or_without_a_byte_order_mark():
    assert hook.loads(b'\xef\xbb\xbf{"a": "\xc3\xa9"}') == hook.loads(b'{"a": "\xc3\xa9"}') == {"a": "\u00e9"}
    assert hook.loads(bytearray(b" [1, 2.5, null] ")) == [1, 2.5, None]
    with pytest.raises(UnicodeDecodeError):
        hook.loads(b'{"a": "\xff"}')


def test_a_home_written_with_a_tilde_is_expanded(monkeypatch, tmp_path):
    """``hooks install`` writes the home resolved; a command written by hand may start it with ~."""
    import os

    monkeypatch.setenv("HOME", str(tmp_path))
    homes = []
    monkeypatch.setattr(hook, "run", lambda home, **options: homes.append(home) or 0)
    assert hook.main(["--home", "~/bridge", "hook"]) == 0
    assert hook.main(["--home", "/abs/bridge", "hook"]) == 0
    assert homes == [os.path.join(str(tmp_path), "bridge"), "/abs/bridge"]


def test_the_hook_entry_imports_only_cheap_stdlib_modules(tmp_path):
    """Neither what `hooks install` writes (`python -I -S clients/bridge/run_hook.py … hook`) nor
    `-m clients.bridge … hook` loads the command line, the daemon, asyncio, sqlite3, websockets,
    http.client, logging, typing, or re (the json package's dearest import)."""
    import subprocess
    import sys

    from tests.e2e_support import ROOT

    heavy = {"argparse", "asyncio", "sqlite3", "websockets", "http.client", "email", "logging", "typing", "re",
             "json", "socket", "selectors", "enum", "clients.bridge.cli", "clients.bridge.daemon", "clients.common.tunnel", "ssl"}
    # run_hook.py ends with posix._exit (hook.exit_now: no atexit handlers), -m clients.bridge with sys.exit.
    report = ("import atexit, posix, sys\n"
              "def _report(*code):\n    sys.__stderr__.write(' '.join(sorted(sys.modules)))\n    sys.__stderr__.flush()\n"
              "    if code:\n        _exit(*code)\n"
              "_exit, posix._exit = posix._exit, _report\natexit.register(_report)\n")
    script = ROOT / "clients" / "bridge" / "run_hook.py"
    runs = {
        "run_hook.py": [sys.executable, "-I", "-S", "-c", report + f"sys.argv = [{str(script)!r}, '--home', "
                        f"{str(tmp_path)!r}, 'hook']\nexec(compile(open({str(script)!r}).read(), {str(script)!r}, "
                        "'exec'), {'__name__': '__main__', '__file__': " + repr(str(script)) + "})"],
        "-m clients.bridge": [sys.executable, "-S", "-c", report + "import runpy\nsys.argv = ['ai1net-bridge', "
                              f"'--home', {str(tmp_path)!r}, 'hook']\n"
                              "runpy.run_module('clients.bridge', run_name='__main__')"],
    }
    import http.server
    import threading

    asked = []

    class Daemon(http.server.BaseHTTPRequestHandler):  # a stand-in daemon: every route answers {}
        def do_POST(self):  # noqa: N802 - the stdlib's name
            asked.append((self.path, self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Daemon)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    (tmp_path / "local.json").write_text(json.dumps({"port": server.server_address[1], "secret": "s" * 43}))
    try:
        for name, argv in runs.items():
            done = subprocess.run(argv, cwd=ROOT, input=b'{"hook_event_name": "Stop", "session_id": "s"}',
                                  capture_output=True, timeout=30)
            assert done.returncode == 0 and not done.stdout, (name, done.stderr)
            loaded = set(done.stderr.decode().split())
            assert "clients.bridge.hook" in loaded and "_socket" in loaded, name
            assert not heavy & loaded, (name, heavy & loaded)
    finally:
        server.shutdown()
        server.server_close()
    assert [path for path, _ in asked] == ["/v1/stop", "/v1/stop"]
    assert json.loads(asked[0][1]) == {"session_id": "s", "stop_hook_active": False}


def test_the_hook_json_matches_the_json_package():
    import json

    samples = [
        {"hook_event_name": "PreToolUse", "tool_input": {"questions": [FRAMEWORK], "n": 3, "x": 1.5, "ok": True,
                                                         "none": None, "list": [1, [2, {"a": "b"}]]}},
        {"text": "été ✓ 😀 \"quoted\" \\ back\nslash\t\u0001", "empty": {}, "also": []},
        [], "plain", 0, -12, 3.25e-9, False,
    ]
    for sample in samples:
        assert hook.dumps(sample) == json.dumps(sample)
        assert hook.loads(json.dumps(sample)) == sample
        assert hook.loads(json.dumps(sample, indent=2).encode()) == sample
        assert hook.loads(b"\xef\xbb\xbf" + json.dumps(sample).encode() + b"\n") == sample
    for bad in ("", "{", '{"a": 1} x', "[1,]", "nope", '{"a": NaN'):
        with pytest.raises(ValueError):
            hook.loads(bad)
    with pytest.raises((TypeError, ValueError)):
        hook.dumps({"a": object()})
