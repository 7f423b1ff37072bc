"""Mobile reply end to end with real processes: daphne, the bridge daemon paired through the API, and
the `hook` command run as the agent host runs it (Claude Code's stdin JSON). The phone is an HTTP
client logged in as the user. The hook's stdout is asserted exactly.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from clients.bridge.audit import AuditLog
from clients.common.credentials import load_credential
from devices.models import Device
from mobile.models import AgentSession, Question
from tests.bridge.questions import FEATURES, FRAMEWORK
from tests.e2e_support import ROOT, Daphne, Process, csrf, logged_in, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

FAST = {"AI1NET_HEARTBEAT_SEC": "2", "AI1NET_PAIRING_INTERVAL_SEC": "1"}
DB_NAME = {
    "question": "Database name?",
    "header": "DB",
    "options": [{"label": "app", "description": "default"}, {"label": "main", "description": "short"}],
    "multiSelect": False,
}


def client_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "DATABASE_URL", "REDIS_URL"))}
    env.update({"PYTHONUNBUFFERED": "1", "AI1NET_BACKOFF_CAP": "1"})
    return env


def phone(server: Daphne, username: str, password: str) -> contextlib.AbstractContextManager[httpx.Client]:
    """The phone: an HTTP session of the user, logged in through the form."""
    return logged_in(server.url, username, password)


class Desk:
    """The user's desktop: a paired bridge daemon and the hook command."""

    def __init__(self, tmp_path: Path) -> None:
        self.home = tmp_path / "home"
        self.logs = tmp_path
        self.starts = 0
        self.process: Process | None = None
        self.pool = ThreadPoolExecutor(4)

    def pair(self, server: Daphne, session: httpx.Client) -> None:
        pairing = Process([sys.executable, "-m", "clients.bridge", "--home", str(self.home), "pair", server.url,
                           "--name", "desk"], self.logs / "pair.log", env=client_env())
        try:
            match = wait_until(lambda: re.search(r"code: ([A-Z0-9]{4}-[A-Z0-9]{4})", pairing.log()), timeout=30,
                               message="the user code")
            approved = session.post(f"/api/devices/pairings/code/{match.group(1)}/approve", headers=csrf(session))
            assert approved.status_code == 200, approved.text
            wait_until(lambda: not pairing.alive, timeout=30, message="pair to finish")
            assert pairing.popen.returncode == 0, pairing.log()
        finally:
            pairing.stop()
        self.device_id = load_credential(self.home).device_id

    def start(self) -> None:
        self.starts += 1
        (self.home / "local.json").unlink(missing_ok=True)
        self.process = Process([sys.executable, "-m", "clients.bridge", "-v", "--home", str(self.home), "run"],
                               self.logs / f"bridge-{self.starts}.log", env=client_env())
        wait_until(lambda: (self.home / "local.json").exists(), timeout=30, message="the daemon's local API")
        wait_until(lambda: Device.objects.get(pk=self.device_id).is_online, timeout=30, message="the tunnel")

    def kill(self) -> None:
        self.process.kill()
        self.process.stop()

    def stop(self) -> None:
        if self.process:
            self.process.stop()
        self.pool.shutdown(wait=False, cancel_futures=True)

    def hook(self, event: dict, *args: str) -> dict | None:
        started = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-m", "clients.bridge", "--home", str(self.home), "hook", *args],
            cwd=ROOT, input=json.dumps(event).encode(), capture_output=True, timeout=120, env=client_env(),
        )
        self.elapsed = time.monotonic() - started
        assert (result.returncode, result.stderr) == (0, b""), result.stderr
        if not result.stdout.strip():
            return None
        assert result.stdout.count(b"\n") == 1
        return json.loads(result.stdout)

    def hook_async(self, event: dict, *args: str) -> Future:
        return self.pool.submit(self.hook, event, *args)

    def health(self) -> dict:
        from clients.bridge.hook import Daemon

        try:
            return Daemon(str(self.home)).post("health", {}, timeout=2)
        except Exception:
            return {}

    def waiting(self) -> list[str]:
        """Questions a hook is long-polling the daemon for (so it is past the ask: a kill is no race)."""
        return self.health().get("waiting", [])

    def audit(self) -> list[str]:
        return [e["event"] for e in AuditLog(self.home / "audit.jsonl").entries()]


@pytest.fixture
def world(tmp_path, user, password):
    user.mobile_reply_enabled = True
    user.save(update_fields=["mobile_reply_enabled"])
    server = Daphne(tmp_path, **FAST)
    desk = Desk(tmp_path)
    try:
        with phone(server, user.username, password) as session:
            desk.pair(server, session)
            desk.start()
            yield server, desk, session
    finally:
        desk.stop()
        server.stop()


def start_session(desk: Desk, session_id: str = "sess-1") -> None:
    event = {"session_id": session_id, "transcript_path": "/tmp/t.jsonl", "cwd": "/tmp/project",
             "hook_event_name": "SessionStart", "source": "startup"}
    assert desk.hook(event) is None
    assert desk.elapsed < 1.0
    # The hook hands off; the daemon tells the platform a moment later.
    wait_until(lambda: AgentSession.objects.filter(session_id=session_id).exists(), timeout=15,
               message="the session on the platform")


def ask(questions, tool_use_id="toolu_1", session_id="sess-1") -> dict:
    return {"session_id": session_id, "transcript_path": "/tmp/t.jsonl", "cwd": "/tmp/project",
            "permission_mode": "default", "hook_event_name": "PreToolUse", "tool_name": "AskUserQuestion",
            "tool_input": {"questions": questions}, "tool_use_id": tool_use_id}


def pending(session: httpx.Client, count: int = 1) -> list[dict]:
    def got():
        response = session.get("/api/mobile/pending")
        assert response.status_code == 200, response.text
        questions = response.json()["questions"]
        return questions if len(questions) >= count else None

    return wait_until(got, timeout=30, message="the question on the phone")


def answer(session: httpx.Client, question: dict, answers: dict, other: dict | None = None) -> httpx.Response:
    body = {"question_id": question["question_id"], "nonce": question["nonce"], "answers": answers}
    if other is not None:
        body["other"] = other
    return session.post("/api/mobile/answer", json=body, headers=csrf(session))


def test_phone_answers_reach_the_agent_single_several_multiselect_and_other(world, other_user, password):
    server, desk, session = world
    start_session(desk)

    hook = desk.hook_async(ask([FRAMEWORK]))
    [question] = pending(session)
    assert question["questions"] == [FRAMEWORK] and question["session_id"] == "sess-1"
    assert question["device_id"] == desk.device_id
    response = answer(session, question, {"Which framework?": ["Vue"]})
    assert (response.status_code, response.json()) == (200, {"state": "answered"})
    assert hook.result(30) == {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "allow",
            "updatedInput": {"questions": [FRAMEWORK], "answers": {"Which framework?": "Vue"}},
        }
    }
    replay = answer(session, question, {"Which framework?": ["React"]})
    assert (replay.status_code, replay.json()["error"]) == (409, "already_answered")

    hook = desk.hook_async(ask([FRAMEWORK, FEATURES, DB_NAME], tool_use_id="toolu_2"))
    [question] = pending(session)
    with phone(server, other_user.username, password) as mallory:
        other_user.mobile_reply_enabled = True
        other_user.save(update_fields=["mobile_reply_enabled"])
        stolen = answer(mallory, question, {"Which framework?": ["React"]})
        assert stolen.status_code == 404
    response = answer(session, question,
                      {"Which framework?": ["React"], "Which features?": ["Auth", "Export"], "Database name?": []},
                      {"Which features?": "audit log", "Database name?": "ledger"})
    assert response.status_code == 200, response.text
    assert hook.result(30) == {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "allow",
            "updatedInput": {
                "questions": [FRAMEWORK, FEATURES, DB_NAME],
                "answers": {
                    "Which framework?": "React",
                    "Which features?": "Auth, Export, audit log",
                    "Database name?": "ledger",
                },
            },
        }
    }
    # PostToolUse after a phone answer is not a desktop answer; SessionEnd hands off in time.
    post = dict(ask([FRAMEWORK], tool_use_id="toolu_1"), hook_event_name="PostToolUse",
                tool_input={"questions": [FRAMEWORK], "answers": {"Which framework?": "Vue"}})
    assert desk.hook(post) is None
    assert desk.hook({"session_id": "sess-1", "hook_event_name": "SessionEnd", "reason": "other"}) is None
    assert desk.elapsed < 1.0
    wait_until(lambda: Question.objects.filter(state=Question.State.ANSWERED).count() == 2, timeout=10)
    assert desk.audit().count("question.take") == 2


def test_no_answer_in_time_then_the_desk_answers_first(world):
    server, desk, session = world
    start_session(desk)
    assert desk.hook(ask([FRAMEWORK]), "--window", "2") is None
    [question] = Question.objects.all()
    wait_until(lambda: Question.objects.get(pk=question.pk).state == Question.State.MOVED_TO_DESKTOP, timeout=15,
               message="moved to the desktop")
    post = dict(ask([FRAMEWORK]), hook_event_name="PostToolUse",
                tool_input={"questions": [FRAMEWORK], "answers": {"Which framework?": "React"}},
                tool_response={"questions": [FRAMEWORK], "answers": {"Which framework?": "React"}})
    assert desk.hook(post) is None
    wait_until(lambda: Question.objects.get(pk=question.pk).state == Question.State.ANSWERED_ON_DESKTOP, timeout=15,
               message="answered on the desktop")
    nonce = _nonce(question)
    late = session.post("/api/mobile/answer", json={"question_id": str(question.pk), "nonce": nonce,
                                                    "answers": {"Which framework?": ["Vue"]}}, headers=csrf(session))
    assert (late.status_code, late.json()["error"]) == (409, "answered_on_desktop")
    assert desk.audit()[-2:] == ["question.moved", "desktop.answer"]


def _nonce(question: Question) -> str:
    from mobile.services import nonce_for

    return nonce_for(Question.objects.get(pk=question.pk))


def test_switch_off_meanwhile_silences_the_hook_and_the_phone_api(world, user):
    server, desk, session = world
    start_session(desk)
    hook = desk.hook_async(ask([FRAMEWORK]))
    pending(session)
    from ai1net.accounts.services import user_switch_set

    user_switch_set(actor=user, user=user, switch="mobile_reply", enabled=False)
    assert hook.result(30) is None
    assert session.get("/api/mobile/pending").status_code == 404
    wait_until(lambda: Question.objects.get().state == Question.State.MOVED_TO_DESKTOP, timeout=15)
    # Off up front: the hook stays silent at once.
    assert desk.hook(ask([FRAMEWORK], tool_use_id="toolu_2")) is None
    assert desk.elapsed < 2.0
    assert Question.objects.count() == 1


def test_bridge_killed_while_an_answer_is_pending_delivers_it_once(world):
    server, desk, session = world
    start_session(desk)
    hook = desk.hook_async(ask([FRAMEWORK]))
    [question] = pending(session)
    wait_until(lambda: question["question_id"] in desk.waiting(), timeout=15, message="the hook waiting")
    desk.kill()
    wait_until(lambda: not Device.objects.get(pk=desk.device_id).is_online, timeout=30, message="offline")
    assert answer(session, question, {"Which framework?": ["React"]}).status_code == 200
    desk.start()
    output = hook.result(60)
    assert output["hookSpecificOutput"]["updatedInput"]["answers"] == {"Which framework?": "React"}
    desk.kill()
    desk.start()
    assert desk.audit().count("answer.apply") == 1 and desk.audit().count("question.take") == 1


def test_daphne_restarted_while_an_answer_is_pending_delivers_it_once(world):
    server, desk, session = world
    start_session(desk)
    hook = desk.hook_async(ask([FRAMEWORK]))
    [question] = pending(session)
    wait_until(lambda: question["question_id"] in desk.waiting(), timeout=15, message="the hook waiting")
    server.restart()
    assert answer(session, question, {"Which framework?": ["Vue"]}).status_code == 200
    output = hook.result(60)
    assert output["hookSpecificOutput"]["updatedInput"]["answers"] == {"Which framework?": "Vue"}
    assert desk.audit().count("answer.apply") == 1 and desk.audit().count("question.take") == 1


def test_phone_messages_reach_the_session_once(world):
    server, desk, session = world
    start_session(desk)
    sent = session.post("/api/mobile/sessions/sess-1/messages", json={"text": "also update the changelog"},
                        headers=csrf(session))
    assert sent.status_code == 201, sent.text
    prompt = {"session_id": "sess-1", "hook_event_name": "UserPromptSubmit", "prompt": "go on"}
    wait_until(lambda: "message.queued" in desk.audit(), timeout=15, message="the message on the desk")
    assert desk.hook(prompt) == {
        "hookSpecificOutput": {
            "hookEventName": "UserPromptSubmit",
            "additionalContext": "Message from the user's phone: also update the changelog",
        }
    }
    assert desk.hook(prompt) is None

    # "Keep this session going" from the phone: Stop waits for the next phone message and continues with it.
    stop = {"session_id": "sess-1", "hook_event_name": "Stop", "stop_hook_active": False}
    assert desk.hook(stop) is None
    kept = session.post("/api/mobile/sessions/sess-1/keep_going", json={"enabled": True}, headers=csrf(session))
    assert kept.status_code == 200, kept.text
    wait_until(lambda: "keep_going.set" in desk.audit(), timeout=15, message="keep-going on the desk")
    hook = desk.hook_async(stop)
    wait_until(lambda: "sess-1" in desk.health().get("waiting_sessions", []), timeout=15, message="Stop waiting")
    sent = session.post("/api/mobile/sessions/sess-1/messages", json={"text": "now write the tests"},
                        headers=csrf(session))
    assert sent.status_code == 201, sent.text
    assert hook.result(30) == {"decision": "block", "reason": "now write the tests"}
