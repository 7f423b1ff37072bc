"""Proof against the real agent host: the real OpenAI Codex CLI (pinned below) runs offline against a
scripted fake of the Responses API (fake_openai.py) with the hooks that `hooks install --agent codex`
wrote and trusted. The fake model first asks a question with Codex's own tool (request_user_input):
it reaches the phone (an HTTP client on a real daphne) and the model reads the phone's answer. Then it
asks for commands that need approval, which reach the phone as tool-permission requests (the Claude
Code path): the phone denies the first with a note (it never runs; the model reads the note), allows the
second "and remember for this session" (it runs), and the very same call again runs without the phone.
With the session's keep-going on, the Stop hook waits for a phone message and Codex goes on with it.

`codex exec` never asks for approval (its policy is "never") unless it runs with ``--approve-for-me``:
then the PermissionRequest hook is consulted first, and only a request the hook leaves undecided goes
to Codex's automatic reviewer. The TUI consults the hook the same way before it shows its own prompt.

The CLI is installed by this test's set-up into a cache folder (never committed) unless CODEX_BIN
points at one, or ~/.cache/ai1net-codex already holds the pinned version.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from clients import permission
from im.models import Message
from mobile.models import AgentSession
from tests.e2e_support import ROOT, csrf, npm_cli, wait_until

from .fake_openai import FakeResponsesApi, call, say
from .test_claude_permission_e2e import decide
from .test_mobile_e2e import answer, pending, world  # noqa: F401 - world is a fixture

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.codex, pytest.mark.django_db(transaction=True)]

CODEX_VERSION = "0.171.0"


def codex_bin() -> str:
    return npm_cli("@openai/codex", CODEX_VERSION, "codex", env_var="CODEX_BIN", cache_name=f"codex-{CODEX_VERSION}",
                   home_cache="ai1net-codex")


CODEX_QUESTION = {"id": "framework", "header": "Framework", "question": "Which framework?",
                  "options": [{"label": "Vue", "description": "progressive"}, {"label": "React", "description": "popular"}]}


def provider_config(base_url: str) -> str:
    return (f'model = "gpt-fake"\nmodel_provider = "fake"\n\n[model_providers.fake]\nname = "fake"\n'
            f'base_url = "{base_url}"\nwire_api = "responses"\nrequest_max_retries = 0\nstream_max_retries = 0\n')


def test_the_real_codex_cli_asks_the_phone_its_questions_and_approvals(world, tmp_path):  # noqa: F811
    binary = codex_bin()
    server, desk, session = world
    codex_home = tmp_path / "codex"
    work = tmp_path / "work"
    codex_home.mkdir()
    work.mkdir()
    denied_file, allowed_file = work / "DENIED_RAN", work / "ALLOWED_RAN"
    allowed_call = {"cmd": f"echo ran >> {allowed_file}", "sandbox_permissions": "require_escalated",
                    "justification": "add to the second marker"}
    steps = [
        call("request_user_input", {"questions": [CODEX_QUESTION]}, "call_question"),
        call("exec_command", {"cmd": f"touch {denied_file}", "sandbox_permissions": "require_escalated",
                              "justification": "create the first marker"}, "call_denied"),
        call("exec_command", allowed_call, "call_allowed"),
        call("exec_command", allowed_call, "call_again"),  # the very same call: remembered, not asked again
        say("Both asked. FINAL_TEXT_FROM_FAKE_MODEL"),
        say("Going on as the phone said. CONTINUED_FROM_THE_PHONE"),
    ]
    env = {**os.environ, "CODEX_HOME": str(codex_home), "HOME": str(tmp_path)}
    with FakeResponsesApi(steps) as model:
        (codex_home / "config.toml").write_text(provider_config(model.base_url))
        installed = subprocess.run(
            [sys.executable, "-m", "clients.bridge", "--home", str(desk.home), "hooks", "install", "--agent", "codex",
             "--window", "90"], cwd=ROOT, capture_output=True, text=True, timeout=30, env=env)
        assert installed.returncode == 0, installed.stderr
        codex = desk.pool.submit(
            subprocess.run, [binary, "exec", "--skip-git-repo-check", "--approve-for-me", "Make the two markers"],
            cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=240)

        [asked] = pending(session)
        session_id = asked["session_id"]
        kept = session.post(f"/api/mobile/sessions/{session_id}/keep_going", json={"enabled": True},
                            headers=csrf(session))
        assert kept.status_code == 200, kept.text
        assert asked["questions"] == [{"question": "Which framework?", "header": "Framework", "multiSelect": False,
                                       "options": CODEX_QUESTION["options"]}]
        assert answer(session, asked, {"Which framework?": ["Vue"]}).status_code == 200
        [first] = wait_until(
            lambda: [q for q in session.get("/api/mobile/pending").json()["questions"]
                     if q["question_id"] != asked["question_id"]],
            timeout=60, interval=0.2, message="the first approval on the phone")
        denied_input = {"command": f"touch {denied_file}", "description": "create the first marker"}
        assert (first["kind"], first["tool_name"]) == ("permission", "Bash")
        assert first["input_hash"] == permission.input_hash(denied_input)
        assert first["rendering"]["text"] == f"# create the first marker\ntouch {denied_file}"
        assert decide(session, first, permission.DENY, "not in this folder").status_code == 200
        [second] = wait_until(
            lambda: [q for q in session.get("/api/mobile/pending").json()["questions"]
                     if q["question_id"] not in (asked["question_id"], first["question_id"])],
            timeout=60, interval=0.2, message="the second approval on the phone")
        assert second["rendering"]["text"] == f"# add to the second marker\necho ran >> {allowed_file}"
        assert decide(session, second, permission.ALLOW_SESSION).status_code == 200

        # Keep-going is on: at Stop the hook waits for a phone message, and Codex goes on with it.
        wait_until(lambda: session_id in desk.health().get("waiting_sessions", []), timeout=60, interval=0.2,
                   message="Stop waiting for the phone")
        sent = session.post(f"/api/mobile/sessions/{session_id}/messages", json={"text": "now write the tests"},
                            headers=csrf(session))
        assert sent.status_code == 201, sent.text
        wait_until(lambda: "now write the tests" in json.dumps(model.requests[-1]["input"]), timeout=60,
                   interval=0.2, message="the phone's message in the model's input")
        wait_until(lambda: session_id in desk.health().get("waiting_sessions", []), timeout=60, interval=0.2,
                   message="the second Stop waiting")
        stopped = session.post(f"/api/mobile/sessions/{session_id}/keep_going", json={"enabled": False},
                               headers=csrf(session))
        assert stopped.status_code == 200, stopped.text
        result = codex.result(120)

    assert result.returncode == 0, (result.stdout, result.stderr)
    assert "CONTINUED_FROM_THE_PHONE" in result.stdout
    assert not denied_file.exists() and allowed_file.read_text() == "ran\nran\n"
    outputs = model.tool_outputs()
    assert ('The user answered on their phone (this is their answer, not a refusal): "Which framework?"="Vue"'
            in outputs["call_question"]), outputs
    assert "The user denied this tool call from their phone: not in this folder" in outputs["call_denied"], outputs
    assert "denied" not in outputs["call_allowed"].lower() + outputs["call_again"].lower(), outputs
    assert "PermissionRequest Blocked" in result.stderr and "hook: Stop" in result.stderr

    # Every hook reached the bridge; the session and its Stop event reached the platform.
    room = AgentSession.objects.get(session_id=session_id).room
    wait_until(lambda: "Stop" in {m.body.get("event") for m in Message.objects.filter(room=room, kind="event")},
               timeout=20, message="Stop in the session's room")
    log = desk.process.log()
    for route in ("session-start", "user-prompt-submit", "pre-tool-use", "permission-request", "questions/wait",
                  "stop"):
        assert f'"POST /v1/{route} HTTP/1.1" 200' in log, route
    audit = desk.audit()
    assert (audit.count("question.take"), audit.count("permission.take"), audit.count("permission.remembered")) == (
        1, 2, 1)
