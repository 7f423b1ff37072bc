"""The daemon's mobile-reply logic against a fake tunnel (no processes, no network)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from clients.bridge.audit import AuditLog
from clients.bridge.local_api import RequestRefused
from clients.bridge.mobile import MobileBridge, error_code
from clients.bridge.store import Store

from .fakes import FakeTunnel, app_error

QUESTION = {
    "question": "Which framework?",
    "header": "Framework",
    "options": [{"label": "React", "description": "SPA"}, {"label": "Vue", "description": "SPA"}],
    "multiSelect": False,
}


@pytest.fixture
async def bridge(tmp_path):
    tunnel = FakeTunnel()
    bridge = MobileBridge(tmp_path, tunnel, sweep_interval=3600)
    await bridge.start()
    yield bridge
    await bridge.stop()
    bridge.store.close()


def ask_body(**extra):
    body = {
        "session_id": "s1",
        "tool_use_id": "toolu_1",
        "tool_input": {"questions": [QUESTION]},
        "cwd": "/work",
        "window_sec": 60,
    }
    body.update(extra)
    return body


async def drain_reports(bridge, method, count=1, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(bridge.tunnel.params(method)) >= count and not bridge.store.reports_pending():
            return bridge.tunnel.params(method)
        await asyncio.sleep(0.01)
    raise AssertionError(f"{method} not reported: {bridge.tunnel.calls}")


def events(bridge):
    return [entry["event"] for entry in bridge.audit.entries()]


async def test_question_answered_on_the_phone_is_taken_once(bridge):
    asked = await bridge.dispatch("pre-tool-use", ask_body())
    question_id = asked["question_id"]
    assert bridge.tunnel.methods()[:2] == ["mobile.session_start", "mobile.question"]
    sent = bridge.tunnel.params("mobile.question")[0]
    assert sent == {
        "question_id": question_id,
        "session_id": "s1",
        "tool_use_id": "toolu_1",
        "questions": [QUESTION],
        "window_sec": 60,
    }

    waiter = asyncio.ensure_future(bridge.dispatch("questions/wait", {"question_id": question_id, "timeout": 10}))
    await asyncio.sleep(0.05)
    assert not waiter.done()
    answer = {"question_id": question_id, "answers": {"Which framework?": ["Vue"]}, "other": {}, "answered_at": "x"}
    await bridge.on_answer(answer)
    result = await asyncio.wait_for(waiter, 2)
    assert result == {"state": "answered", "answers": {"Which framework?": ["Vue"]}, "other": {}}

    await bridge.on_answer(answer)  # the platform resends after a reconnect: no effect
    assert bridge.store.question(question_id)["state"] == "taken"
    assert events(bridge) == ["question.ask", "answer.apply", "question.take"]

    # PostToolUse after a phone answer is not reported as a desktop answer.
    post = {"session_id": "s1", "tool_use_id": "toolu_1", "tool_input": {"answers": {"Which framework?": "Vue"}}}
    assert await bridge.dispatch("post-tool-use", post) == {"skipped": "answered_remotely"}


async def test_an_answer_delivered_before_the_hook_asks_is_kept_across_a_restart(tmp_path):
    tunnel = FakeTunnel()
    first = MobileBridge(tmp_path, tunnel, sweep_interval=3600)
    question_id = (await first.dispatch("pre-tool-use", ask_body()))["question_id"]
    await first.on_answer({"question_id": question_id, "answers": {"Which framework?": ["React"]}, "other": {}})
    first.store.close()

    second = MobileBridge(tmp_path, FakeTunnel(), sweep_interval=3600)
    result = await second.dispatch("questions/wait", {"question_id": question_id, "timeout": 1})
    assert result["answers"] == {"Which framework?": ["React"]}
    assert second.store.question(question_id)["state"] == "taken"
    second.store.close()


async def test_a_take_whose_reply_died_with_the_daemon_is_handed_again_to_the_hook(tmp_path):
    # kill -9 after the take was written and before its reply left: the hook retries on the new daemon
    # (tests/faults/test_bridge_kill.py lost one answer in 100 this way before the fix).
    first = MobileBridge(tmp_path, FakeTunnel(), sweep_interval=3600)
    question_id = (await first.dispatch("pre-tool-use", ask_body()))["question_id"]
    await first.on_answer({"question_id": question_id, "answers": {"Which framework?": ["Vue"]}, "other": {}})
    await first.dispatch("questions/wait", {"question_id": question_id, "timeout": 1})  # the reply is lost
    first.store.close()

    second = MobileBridge(tmp_path, FakeTunnel(), sweep_interval=3600)
    again = await second.dispatch("questions/wait", {"question_id": question_id, "timeout": 0})
    assert again == {"state": "answered", "answers": {"Which framework?": ["Vue"]}, "other": {}}
    late = await second.dispatch("questions/give-up", {"question_id": question_id, "reason": "timeout"})
    assert late["answers"] == {"Which framework?": ["Vue"]}
    assert events(second).count("question.take") == 1
    assert events(second)[-2:] == ["question.take_again", "question.take_again"]
    assert second.store.question(question_id)["state"] == "taken"
    assert "mobile.question_moved" not in second.tunnel.methods()
    second.store.close()


async def test_window_over_moves_the_question_to_the_desktop_and_tells_the_platform(bridge):
    question_id = (await bridge.dispatch("pre-tool-use", ask_body()))["question_id"]
    assert await bridge.dispatch("questions/wait", {"question_id": question_id, "timeout": 0.05}) == {"state": "pending"}
    moved = await bridge.dispatch("questions/give-up", {"question_id": question_id, "reason": "timeout"})
    assert moved == {"state": "moved", "reason": "timeout"}
    assert await drain_reports(bridge, "mobile.question_moved") == [{"question_id": question_id, "reason": "timeout"}]

    await bridge.on_answer({"question_id": question_id, "answers": {"Which framework?": ["Vue"]}})  # too late
    assert (await bridge.dispatch("questions/wait", {"question_id": question_id, "timeout": 0}))["state"] == "moved"
    log = bridge.audit.entries()
    assert [e["event"] for e in log] == ["question.ask", "question.moved", "answer.late"]
    assert log[1]["reason"] == "timeout"


async def test_give_up_races_an_answer_and_takes_it(bridge):
    question_id = (await bridge.dispatch("pre-tool-use", ask_body()))["question_id"]
    await bridge.on_answer({"question_id": question_id, "answers": {"Which framework?": ["React"]}})
    result = await bridge.dispatch("questions/give-up", {"question_id": question_id, "reason": "timeout"})
    assert result["state"] == "answered"
    assert "mobile.question_moved" not in bridge.tunnel.methods()


async def test_switch_turned_off_meanwhile_wakes_the_hook_with_nothing(bridge):
    question_id = (await bridge.dispatch("pre-tool-use", ask_body()))["question_id"]
    waiter = asyncio.ensure_future(bridge.dispatch("questions/wait", {"question_id": question_id, "timeout": 10}))
    await asyncio.sleep(0.02)
    await bridge.on_switch({"enabled": False})
    assert await asyncio.wait_for(waiter, 2) == {"state": "moved", "reason": "switch_off"}
    assert await drain_reports(bridge, "mobile.question_moved") == [{"question_id": question_id, "reason": "switch_off"}]
    assert bridge.switch is False


async def test_switch_off_on_the_platform_means_no_question(bridge):
    bridge.tunnel.results["mobile.question"] = app_error("mobile_reply_off")
    assert await bridge.dispatch("pre-tool-use", ask_body()) == {"skip": "mobile_reply_off"}
    assert bridge.switch is False
    assert events(bridge) == ["question.ask", "question.refused"]
    # Told that the switch is off, the bridge no longer asks the platform at all.
    assert await bridge.dispatch("pre-tool-use", ask_body(tool_use_id="toolu_2")) == {"skip": "mobile_reply_off"}
    assert bridge.tunnel.methods().count("mobile.question") == 1
    await bridge.on_switch({"enabled": True})
    del bridge.tunnel.results["mobile.question"]
    assert "question_id" in await bridge.dispatch("pre-tool-use", ask_body(tool_use_id="toolu_3"))


async def test_platform_unreachable_means_no_question_and_a_later_moved_report(bridge):
    bridge.tunnel.results["mobile.question"] = TimeoutError()
    assert await bridge.dispatch("pre-tool-use", ask_body()) == {"skip": "unreachable"}
    bridge.tunnel.results["mobile.question_moved"] = {"state": "moved_to_desktop"}
    reported = await drain_reports(bridge, "mobile.question_moved")
    assert reported[0]["reason"] == "timeout"


async def test_reports_are_retried_in_order_until_the_platform_answers(bridge):
    attempts = []

    def flaky(params):
        attempts.append(params)
        return ConnectionError("tunnel down") if len(attempts) < 3 else {}

    bridge.tunnel.results["mobile.session_start"] = flaky
    await bridge.dispatch("session-start", {"session_id": "s9", "cwd": "/w", "source": "startup"})
    await bridge.dispatch("session-end", {"session_id": "s9", "reason": "other"})
    await drain_reports(bridge, "mobile.session_end", timeout=10)
    methods = [m for m in bridge.tunnel.methods() if m in ("mobile.session_start", "mobile.session_end")]
    assert methods == ["mobile.session_start"] * 3 + ["mobile.session_end"]
    assert bridge.tunnel.params("mobile.session_end") == [{"session_id": "s9", "reason": "other"}]


async def test_a_refused_report_is_not_retried(bridge):
    bridge.tunnel.results["mobile.session_end"] = app_error("not_found")
    await bridge.dispatch("session-end", {"session_id": "s9", "reason": "other"})
    await drain_reports(bridge, "mobile.session_end")
    await asyncio.sleep(0.05)
    assert bridge.tunnel.methods().count("mobile.session_end") == 1


async def test_desktop_answer_is_reported_and_wakes_the_hook(bridge):
    question_id = (await bridge.dispatch("pre-tool-use", ask_body()))["question_id"]
    await bridge.dispatch("questions/give-up", {"question_id": question_id})
    post = {
        "session_id": "s1",
        "tool_use_id": "toolu_1",
        "tool_input": {"questions": [QUESTION], "answers": {"Which framework?": "React"}},
    }
    assert await bridge.dispatch("post-tool-use", post) == {}
    reported = await drain_reports(bridge, "mobile.desktop_answer")
    assert reported == [
        {
            "session_id": "s1",
            "tool_use_id": "toolu_1",
            "question_id": question_id,
            "answers": {"Which framework?": "React"},
        }
    ]


async def test_desktop_answer_for_a_question_the_phone_never_saw_is_not_sent(bridge):
    bridge.tunnel.results["mobile.question"] = app_error("mobile_reply_off")
    await bridge.dispatch("pre-tool-use", ask_body())
    post = {"session_id": "s1", "tool_use_id": "toolu_1", "tool_input": {"answers": {"Which framework?": "React"}}}
    assert await bridge.dispatch("post-tool-use", post) == {"skipped": "not_on_platform"}
    assert await bridge.dispatch("post-tool-use", dict(post, tool_use_id="other")) == {"skipped": "unknown_question"}


async def test_question_closed_by_the_platform_ends_the_wait(bridge):
    question_id = (await bridge.dispatch("pre-tool-use", ask_body()))["question_id"]
    waiter = asyncio.ensure_future(bridge.dispatch("questions/wait", {"question_id": question_id, "timeout": 10}))
    await asyncio.sleep(0.02)
    await bridge.on_question_closed({"question_id": question_id, "state": "expired"})
    assert await asyncio.wait_for(waiter, 2) == {"state": "closed", "reason": "expired"}


async def test_the_same_tool_use_is_one_question(bridge):
    first = await bridge.dispatch("pre-tool-use", ask_body())
    second = await bridge.dispatch("pre-tool-use", ask_body())
    assert first["question_id"] == second["question_id"]
    assert bridge.tunnel.methods().count("mobile.question") == 1


async def test_phone_messages_are_injected_once_each(bridge):
    await bridge.on_message({"message_id": "m1", "session_id": "s1", "text": "use tabs", "author": "user"})
    await bridge.on_message({"message_id": "m1", "session_id": "s1", "text": "use tabs", "author": "user"})  # replay
    await bridge.on_message({"message_id": "m2", "session_id": "s1", "text": "and run tests", "author": "user"})
    await bridge.on_message({"message_id": "m3", "session_id": "s2", "text": "other session", "author": "user"})
    first = await bridge.dispatch("user-prompt-submit", {"session_id": "s1"})
    assert [m["text"] for m in first["messages"]] == ["use tabs", "and run tests"]
    assert await bridge.dispatch("user-prompt-submit", {"session_id": "s1"}) == {"messages": []}
    assert await drain_reports(bridge, "mobile.message_consumed") == [{"message_ids": ["m1", "m2"]}]
    log = bridge.audit.entries()
    inject = [e for e in log if e["event"] == "message.inject"]
    assert inject == [dict(inject[0], session_id="s1", message_ids=["m1", "m2"])]


async def test_stop_keeps_going_with_the_next_phone_message_up_to_a_cap(bridge):
    assert await bridge.dispatch("stop", {"session_id": "s1", "stop_hook_active": False}) == {"state": "no"}
    await bridge.on_keep_going({"session_id": "s1", "enabled": True})
    assert await bridge.dispatch("stop", {"session_id": "s1", "stop_hook_active": False}) == {"state": "wait"}
    waiter = asyncio.ensure_future(bridge.dispatch("sessions/wait-message", {"session_id": "s1", "timeout": 10}))
    await asyncio.sleep(0.02)
    await bridge.on_message({"message_id": "m1", "session_id": "s1", "text": "now do part B", "author": "user"})
    assert await asyncio.wait_for(waiter, 2) == {"state": "message", "text": "now do part B"}

    for n in range(2, bridge.stop_cap + 1):
        await bridge.on_message({"message_id": f"m{n}", "session_id": "s1", "text": f"step {n}", "author": "user"})
        result = await bridge.dispatch("stop", {"session_id": "s1", "stop_hook_active": True})
        assert result == {"state": "message", "text": f"step {n}"}
    await bridge.on_message({"message_id": "over", "session_id": "s1", "text": "one too many", "author": "user"})
    assert await bridge.dispatch("stop", {"session_id": "s1", "stop_hook_active": True}) == {"state": "no"}
    # A stop the user caused at the desk (stop_hook_active false) starts counting again.
    assert (await bridge.dispatch("stop", {"session_id": "s1", "stop_hook_active": False}))["text"] == "one too many"

    waiter = asyncio.ensure_future(bridge.dispatch("sessions/wait-message", {"session_id": "s1", "timeout": 10}))
    await asyncio.sleep(0.02)
    await bridge.on_keep_going({"session_id": "s1", "enabled": False})
    assert await asyncio.wait_for(waiter, 2) == {"state": "off"}


async def test_session_end_closes_open_questions_and_reports(bridge):
    question_id = (await bridge.dispatch("pre-tool-use", ask_body()))["question_id"]
    waiter = asyncio.ensure_future(bridge.dispatch("questions/wait", {"question_id": question_id, "timeout": 10}))
    await asyncio.sleep(0.02)
    await bridge.dispatch("session-end", {"session_id": "s1", "reason": "prompt_input_exit"})
    assert (await asyncio.wait_for(waiter, 2))["state"] == "closed"
    assert await drain_reports(bridge, "mobile.session_end") == [{"session_id": "s1", "reason": "prompt_input_exit"}]
    assert await bridge.dispatch("pre-tool-use", ask_body(tool_use_id="toolu_2")) == {"skip": "session_ended"}


async def test_session_start_hands_off_and_records_the_room(bridge):
    assert await bridge.dispatch("session-start", {"session_id": "s5", "cwd": "/w", "source": "startup"}) == {}
    sent = (await drain_reports(bridge, "mobile.session_start"))[0]
    assert sent["session_id"] == "s5" and sent["cwd"] == "/w" and sent["source"] == "startup" and sent["host"]
    assert bridge.store.session("s5")["room_id"] == "r1"


async def test_sweep_moves_questions_whose_hook_is_gone(tmp_path):
    bridge = MobileBridge(tmp_path, FakeTunnel(), sweep_interval=3600, hook_grace_sec=0)
    question_id = (await bridge.dispatch("pre-tool-use", ask_body(window_sec=1)))["question_id"]
    bridge.sweep()
    assert bridge.store.question(question_id)["state"] == "pending"  # inside its window
    bridge.store._run("UPDATE questions SET deadline = ? WHERE question_id = ?", (time.time() - 1, question_id))
    bridge.sweep()
    assert bridge.store.question(question_id)["state"] == "moved"
    assert bridge.store.question(question_id)["reason"] == "hook_gone"
    bridge.store.close()


async def test_bad_requests_are_refused(bridge):
    with pytest.raises(RequestRefused):
        await bridge.dispatch("nope", {})
    with pytest.raises(RequestRefused):
        await bridge.dispatch("pre-tool-use", ask_body(tool_input={"questions": "x"}))
    with pytest.raises(RequestRefused):
        await bridge.dispatch("session-start", {"session_id": 5})


def test_error_code_reads_the_platforms_code():
    assert error_code(app_error("mobile_reply_off")) == "mobile_reply_off"
    assert error_code(TimeoutError()) is None
    assert error_code(ConnectionError("down")) is None


def test_audit_lines_are_json_and_private(tmp_path):
    log = AuditLog(tmp_path / "audit.jsonl")
    log.write("question.take", question_id="q")
    log.write("question.moved", question_id="q", reason="timeout")
    lines = (tmp_path / "audit.jsonl").read_text().splitlines()
    assert [json.loads(line)["event"] for line in lines] == ["question.take", "question.moved"]
    assert (tmp_path / "audit.jsonl").stat().st_mode & 0o777 == 0o600


def test_store_file_is_private(tmp_path):
    Store(tmp_path / "m.sqlite3").close()
    assert (tmp_path / "m.sqlite3").stat().st_mode & 0o777 == 0o600


def test_receipts_are_written_without_their_own_fsync_and_decisions_with_one(tmp_path, monkeypatch):
    """The audit log's rule (clients.bridge.audit): a take or a give-up is fsync'd before it happens; a
    receipt (question asked, answer received) is appended and made durable by the next fsync."""
    import os

    from clients.bridge.audit import AuditLog

    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    log = AuditLog(tmp_path / "audit.jsonl")
    log.write("answer.apply", durable=False, question_id="q1")
    assert not synced
    log.write("question.take", question_id="q1")
    assert len(synced) == 1
    assert [e["event"] for e in log.entries()] == ["answer.apply", "question.take"]
