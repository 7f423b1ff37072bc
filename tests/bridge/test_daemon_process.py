"""The hook command against a real daemon process, with a fake platform on the other end of the tunnel.

The fake platform (tests.clients.fakes.FakeTunnelServer) answers the mobile.* requests and delivers
outbox items; the hook runs as a subprocess with Claude Code's stdin JSON, as the agent host runs it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

import pytest

from clients import protocol
from clients.bridge.audit import AuditLog
from clients.common.credentials import Credential, save_credential
from tests.bridge.questions import FEATURES, FRAMEWORK
from tests.clients.fakes import FakeTunnelServer
from tests.e2e_support import ROOT, Process

pytestmark = [pytest.mark.e2e]


class Platform(FakeTunnelServer):
    """Answers like the platform's mobile/rpc.py."""

    def __init__(self):
        super().__init__(heartbeat_sec=2)
        self.mobile_reply = True
        self.on_request = self.answer

    def answer(self, ws, message):
        method, params, request_id = message["method"], message["params"], message["id"]
        if method == "mobile.session_start":
            return protocol.result(request_id, {"room_id": "room-1", "mobile_reply": self.mobile_reply})
        if method == "mobile.question":
            if not self.mobile_reply:
                return protocol.error(
                    request_id, protocol.APPLICATION_ERROR, "mobile reply is off", {"code": "mobile_reply_off"}
                )
            return protocol.result(
                request_id,
                {"question_id": params["question_id"], "state": "pending", "expires_at": "x", "mobile_reply": True},
            )
        return protocol.result(request_id, {"state": "ok"})

    def calls(self, method):
        return [r["params"] for r in self.requests if r["method"] == method]

    async def push(self, kind, payload):
        self.items.append((len(self.items) + 1, kind, payload))
        await self.deliver_new()


async def until(condition, timeout=15.0, message=""):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {message or condition}")


class Bridge:
    def __init__(self, home, platform):
        self.home = home
        self.platform = platform
        self.process = None
        save_credential(home, Credential(url=platform.url, device_id="dev-1", token=platform.token, kind="bridge",
                                         name="desk"))

    async def start(self):
        (self.home / "local.json").unlink(missing_ok=True)
        connections = len(self.platform.hellos)
        env = {**os.environ, "AI1NET_BACKOFF_BASE": "0.05", "AI1NET_BACKOFF_CAP": "0.3", "PYTHONUNBUFFERED": "1"}
        self.process = Process(
            [sys.executable, "-m", "clients.bridge", "--home", str(self.home), "run"],
            self.home / "daemon.log",
            env=env,
        )
        await until(lambda: (self.home / "local.json").exists() and len(self.platform.hellos) > connections,
                    message=f"the daemon to start: {self.home / 'daemon.log'}")
        await until(lambda: self.platform.current is not None)

    def kill(self):
        self.process.kill()
        self.process.stop()  # closes the log

    def stop(self):
        if self.process:
            self.process.stop()

    async def hook(self, event, *args, timeout=60):
        started = time.monotonic()
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "clients.bridge", "--home", str(self.home), "hook", *args,
            cwd=ROOT, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(process.communicate(json.dumps(event).encode()), timeout)
        assert process.returncode == 0 and err == b"", err
        self.elapsed = time.monotonic() - started
        return json.loads(out) if out.strip() else None

    def health(self):
        from clients.bridge.hook import Daemon

        try:
            return Daemon(str(self.home)).post("health", {}, timeout=2)
        except Exception:
            return {}

    async def hook_waiting(self, question_id):
        """Until a hook long-polls the daemon for this question (past the ask, so a kill is no race)."""
        await until(lambda: question_id in self.health().get("waiting", []), message="a waiting hook")

    def audit(self):
        return [entry["event"] for entry in AuditLog(self.home / "audit.jsonl").entries()]


@pytest.fixture
async def bridge(tmp_path):
    async with Platform() as platform:
        bridge = Bridge(tmp_path, platform)
        await bridge.start()
        yield bridge
        await asyncio.to_thread(bridge.stop)  # the platform in this loop must answer the close handshake


def ask_event(questions, tool_use_id="toolu_1", session_id="sess-1"):
    return {
        "session_id": session_id,
        "transcript_path": "/tmp/t.jsonl",
        "cwd": "/tmp/project",
        "permission_mode": "default",
        "hook_event_name": "PreToolUse",
        "tool_name": "AskUserQuestion",
        "tool_input": {"questions": questions},
        "tool_use_id": tool_use_id,
    }


async def test_phone_answer_reaches_the_hook_as_allow_with_updated_input(bridge):
    platform = bridge.platform
    assert await bridge.hook({"session_id": "sess-1", "hook_event_name": "SessionStart", "source": "startup",
                              "cwd": "/tmp/project"}) is None
    assert bridge.elapsed < 1.0
    await until(lambda: platform.calls("mobile.session_start"))
    assert platform.calls("mobile.session_start")[0]["cwd"] == "/tmp/project"

    hook = asyncio.ensure_future(bridge.hook(ask_event([FRAMEWORK, FEATURES])))
    asked = (await until(lambda: platform.calls("mobile.question")))[0]
    assert asked["questions"] == [FRAMEWORK, FEATURES] and asked["tool_use_id"] == "toolu_1"
    assert asked["window_sec"] == 120
    await asyncio.sleep(0.2)
    assert not hook.done()
    await platform.push("mobile.answer", {
        "question_id": asked["question_id"],
        "answers": {"Which framework?": ["Vue"], "Which features?": ["Auth", "Export"]},
        "other": {"Which features?": "dark mode"},
        "answered_at": "2030-01-01T00:00:00Z",
    })
    output = await asyncio.wait_for(hook, 15)
    assert output == {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "allow",
            "updatedInput": {
                "questions": [FRAMEWORK, FEATURES],
                "answers": {"Which framework?": "Vue", "Which features?": "Auth, Export, dark mode"},
            },
        }
    }
    await until(lambda: platform.acked == 1)

    # PostToolUse of a phone-answered question is not a desktop answer.
    post = dict(ask_event([FRAMEWORK, FEATURES]), hook_event_name="PostToolUse")
    post["tool_input"] = output["hookSpecificOutput"]["updatedInput"]
    assert await bridge.hook(post) is None
    assert await bridge.hook({"session_id": "sess-1", "hook_event_name": "SessionEnd", "reason": "other"}) is None
    assert bridge.elapsed < 1.0
    await until(lambda: platform.calls("mobile.session_end"))
    assert platform.calls("mobile.desktop_answer") == []
    assert bridge.audit() == ["session.start", "question.ask", "answer.apply", "question.take", "session.end"]


async def test_deny_style(bridge):
    hook = asyncio.ensure_future(bridge.hook(ask_event([FRAMEWORK]), "--answer-style", "deny"))
    asked = (await until(lambda: bridge.platform.calls("mobile.question")))[0]
    await bridge.platform.push("mobile.answer", {"question_id": asked["question_id"],
                                                 "answers": {"Which framework?": ["React"]}, "other": {}})
    assert await asyncio.wait_for(hook, 15) == {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "deny",
            "permissionDecisionReason": "The user answered on their phone (this is their answer, not a refusal): "
            '"Which framework?"="React". Continue with this answer.',
        }
    }


async def test_no_answer_in_the_window_moves_the_question_to_the_desktop(bridge):
    platform = bridge.platform
    assert await bridge.hook(ask_event([FRAMEWORK]), "--window", "1.5") is None
    asked = platform.calls("mobile.question")[0]
    moved = await until(lambda: platform.calls("mobile.question_moved"))
    assert moved == [{"question_id": asked["question_id"], "reason": "timeout"}]
    # The desk answers after the dialog appeared: the platform hears it.
    post = dict(ask_event([FRAMEWORK]), hook_event_name="PostToolUse",
                tool_input={"questions": [FRAMEWORK], "answers": {"Which framework?": "React"}})
    assert await bridge.hook(post) is None
    reported = await until(lambda: platform.calls("mobile.desktop_answer"))
    assert reported == [{"session_id": "sess-1", "tool_use_id": "toolu_1", "question_id": asked["question_id"],
                         "answers": {"Which framework?": "React"}}]
    assert bridge.audit() == ["question.ask", "question.moved", "desktop.answer"]


async def test_switch_off_meanwhile_silences_the_hook_and_switch_off_up_front_skips_it(bridge):
    platform = bridge.platform
    hook = asyncio.ensure_future(bridge.hook(ask_event([FRAMEWORK])))
    asked = (await until(lambda: platform.calls("mobile.question")))[0]
    platform.mobile_reply = False
    await platform.push("mobile.switch", {"enabled": False})
    assert await asyncio.wait_for(hook, 15) is None
    assert (await until(lambda: platform.calls("mobile.question_moved")))[0] == {
        "question_id": asked["question_id"], "reason": "switch_off"}

    assert await bridge.hook(ask_event([FRAMEWORK], tool_use_id="toolu_2")) is None
    assert bridge.elapsed < 2.0
    assert bridge.audit()[-1] == "question.skipped"  # told the switch is off: the platform is not asked
    assert len(platform.calls("mobile.question")) == 1


async def test_phone_messages_are_injected_once_and_keep_going_blocks_stop(bridge):
    platform = bridge.platform
    await platform.push("mobile.message", {"message_id": "m1", "session_id": "sess-1", "text": "also update the docs", "author": "user"})
    await until(lambda: platform.acked == 1)
    prompt = {"session_id": "sess-1", "hook_event_name": "UserPromptSubmit", "prompt": "go"}
    assert await bridge.hook(prompt) == {
        "hookSpecificOutput": {
            "hookEventName": "UserPromptSubmit",
            "additionalContext": "Message from the user's phone: also update the docs",
        }
    }
    assert await bridge.hook(prompt) is None
    assert (await until(lambda: platform.calls("mobile.message_consumed"))) == [{"message_ids": ["m1"]}]

    stop = {"session_id": "sess-1", "hook_event_name": "Stop", "stop_hook_active": False}
    assert await bridge.hook(stop) is None  # keep-going is off
    await platform.push("mobile.keep_going", {"session_id": "sess-1", "enabled": True})
    await until(lambda: platform.acked == 2)
    hook = asyncio.ensure_future(bridge.hook(stop))
    await asyncio.sleep(0.5)
    assert not hook.done()
    await platform.push("mobile.message", {"message_id": "m2", "session_id": "sess-1", "text": "now part B", "author": "user"})
    assert await asyncio.wait_for(hook, 15) == {"decision": "block", "reason": "now part B"}


async def test_daemon_killed_while_an_answer_is_pending_delivers_it_once_after_restart(bridge):
    platform = bridge.platform
    hook = asyncio.ensure_future(bridge.hook(ask_event([FRAMEWORK])))
    asked = (await until(lambda: platform.calls("mobile.question")))[0]
    await bridge.hook_waiting(asked["question_id"])
    bridge.kill()
    await until(lambda: platform.current is None)
    # The phone answers while the bridge is down: the platform keeps it in the outbox.
    platform.items.append((1, "mobile.answer", {"question_id": asked["question_id"],
                                                "answers": {"Which framework?": ["React"]}, "other": {}}))
    await bridge.start()
    output = await asyncio.wait_for(hook, 20)
    assert output["hookSpecificOutput"]["updatedInput"]["answers"] == {"Which framework?": "React"}
    await until(lambda: platform.acked == 1)
    # Another restart replays nothing and the answer is not given twice.
    await asyncio.to_thread(bridge.stop)
    await bridge.start()
    second = dict(ask_event([FRAMEWORK], tool_use_id="toolu_9"))
    hook2 = asyncio.ensure_future(bridge.hook(second, "--window", "1"))
    assert await asyncio.wait_for(hook2, 15) is None
    events = bridge.audit()
    assert events.count("answer.apply") == 1 and events.count("question.take") == 1


async def test_the_hook_waits_through_a_daemon_restart(bridge):
    platform = bridge.platform
    first = asyncio.ensure_future(bridge.hook(ask_event([FRAMEWORK])))
    asked = (await until(lambda: platform.calls("mobile.question")))[0]
    await bridge.hook_waiting(asked["question_id"])
    bridge.kill()  # the hook keeps waiting through the restart
    await bridge.start()
    await platform.push("mobile.answer", {"question_id": asked["question_id"],
                                          "answers": {"Which framework?": ["Vue"]}, "other": {}})
    output = await asyncio.wait_for(first, 20)
    assert output["hookSpecificOutput"]["updatedInput"]["answers"] == {"Which framework?": "Vue"}
    assert len(platform.calls("mobile.question")) == 1


async def test_an_answer_stored_while_no_hook_waits_is_served_from_disk_after_a_crash(bridge):
    from clients.bridge.hook import Daemon

    platform = bridge.platform
    asked = await asyncio.to_thread(  # in a thread: the platform answering it runs in this loop
        Daemon(str(bridge.home)).post,
        "pre-tool-use",
        {"session_id": "sess-1", "tool_use_id": "toolu_5", "tool_input": {"questions": [FRAMEWORK]}, "window_sec": 60},
        10,
    )
    await platform.push("mobile.answer", {"question_id": asked["question_id"],
                                          "answers": {"Which framework?": ["React"]}, "other": {}})
    await until(lambda: platform.acked == 1)
    bridge.kill()
    await bridge.start()
    daemon = Daemon(str(bridge.home))
    taken = await asyncio.to_thread(daemon.post, "questions/wait", {"question_id": asked["question_id"], "timeout": 5}, 10)
    assert taken == {"state": "answered", "answers": {"Which framework?": ["React"]}, "other": {}}
    # Asked again (as a hook whose reply died with a killed daemon): the same answer, the take still one.
    again = daemon.post("questions/wait", {"question_id": asked["question_id"], "timeout": 0}, timeout=10)
    assert again == taken
    assert bridge.audit().count("question.take") == 1 and bridge.audit().count("question.take_again") == 1
    assert bridge.audit().count("answer.apply") == 1
