"""`hooks install --agent codex` (clients/bridge/codex.py) and the Codex payload translation
(clients/bridge/codex_hook.py: approvals take Claude Code's tool-permission path, questions the question
path), without processes. The payloads below are what the real Codex CLI
0.171.0 sent to a hook (recorded from `codex exec` runs); the trust hashes are ones that build accepted
(its hook ran with no bypass flag). test_codex_e2e.py runs the real CLI itself.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from clients import permission
from clients.bridge import codex
from clients.bridge.hook import handle
from clients.bridge.hooks_install import HooksInstallError
from tests.e2e_support import ROOT

SESSION = "01a23bd3-0ded-7621-b67b-1029ec75fdb5"
TURN = "01a23bd3-0e0a-7d51-8a5e-6f1c2d3b4a59"
PERMISSION_REQUEST = {
    "session_id": SESSION, "turn_id": TURN, "transcript_path": "/tmp/codex/sessions/rollout.jsonl",
    "cwd": "/tmp/work", "hook_event_name": "PermissionRequest", "model": "gpt-fake", "permission_mode": "default",
    "tool_name": "Bash", "tool_input": {"command": "touch /tmp/work/RAN", "description": "need it"},
}
REQUEST_USER_INPUT = {
    "session_id": SESSION, "turn_id": TURN, "transcript_path": "/tmp/codex/sessions/rollout.jsonl",
    "cwd": "/tmp/work", "hook_event_name": "PreToolUse", "model": "gpt-fake", "permission_mode": "default",
    "tool_name": "request_user_input", "tool_use_id": "call_q",
    "tool_input": {"questions": [{"id": "fw", "header": "Framework", "question": "Which framework?",
                                  "options": [{"label": "Vue", "description": "v"},
                                              {"label": "React", "description": "r"}]}]},
}


# --- trust hashes ------------------------------------------------------------------------------
def test_trust_hashes_are_the_ones_codex_0_171_accepted():
    plain = {"hooks": [{"type": "command", "command": "/tmp/h2cache/try/logger.sh", "timeout": 10}]}
    assert codex.handler_hash("SessionStart", plain, plain["hooks"][0]) == (
        "sha256:cb063acd228d6eeecbad7ff9912d77206c0199cd98b7431b8536e68186ae157e")
    command = "/tmp/h2cache/try/logger.sh --home /tmp/h2cache/try/bh hook --window 120 --answer-style allow"
    with_status = {"hooks": [{"type": "command", "command": command, "timeout": 150,
                              "statusMessage": codex.STATUS_APPROVAL}]}
    assert codex.handler_hash("PermissionRequest", with_status, with_status["hooks"][0]) == (
        "sha256:97b39333090666a7652ca6f70f7720b269948005d61f5352fa36288b55da8ced")
    # Stop ignores a matcher, so it is not part of the identity; PreToolUse keeps it.
    assert codex.handler_hash("Stop", {**plain, "matcher": "x"}, plain["hooks"][0]) == codex.handler_hash(
        "Stop", plain, plain["hooks"][0])
    assert codex.handler_hash("PreToolUse", {**plain, "matcher": "x"}, plain["hooks"][0]) != codex.handler_hash(
        "PreToolUse", plain, plain["hooks"][0])


# --- install / rollback ------------------------------------------------------------------------
@pytest.fixture
def codex_home(tmp_path, monkeypatch):
    folder = tmp_path / "codex home"  # a space: the keys are quoted
    folder.mkdir()
    monkeypatch.setenv("CODEX_HOME", str(folder))
    return folder


USER_HOOKS = {"hooks": {"PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": "audit.sh"}]}]}}
USER_CONFIG = 'model = "o3"\n\n[hooks.state."/elsewhere/hooks.json:stop:0:0"]\nenabled = false'  # no final newline


def trust_in(config: Path) -> dict[str, str]:
    state = tomllib.loads(config.read_text())["hooks"]["state"]
    return {key: value["trusted_hash"] for key, value in state.items() if "trusted_hash" in value}


def test_install_is_idempotent_trusts_exactly_its_handlers_and_rollback_restores_both_files(tmp_path, codex_home):
    hooks_json, config = codex_home / "hooks.json", codex_home / "config.toml"
    hooks_json.write_text(json.dumps(USER_HOOKS, indent=4))
    config.write_text(USER_CONFIG)
    before = (hooks_json.read_bytes(), config.read_bytes())
    home = tmp_path / "bridge"

    first = codex.install(home=home, window=60, launcher="/opt/bridge")
    assert first["changed"] and first["trust_changed"] and first["backup"] and first["config_backup"]
    data = json.loads(hooks_json.read_text())
    assert data["hooks"]["PreToolUse"][0] == USER_HOOKS["hooks"]["PreToolUse"][0]  # the user's own, first
    ours = data["hooks"]["PreToolUse"][1]
    assert ours["matcher"] == "request_user_input" and ours["hooks"][0]["timeout"] == 90
    assert sorted(data["hooks"]) == ["PermissionRequest", "PreToolUse", "SessionStart", "Stop", "UserPromptSubmit"]
    command = data["hooks"]["PermissionRequest"][0]["hooks"][0]["command"]
    assert command.startswith("/opt/bridge --home ") and command.endswith(" hook --window 60 --answer-style allow")

    trusted = trust_in(config)
    expected_keys = {f"{hooks_json}:{label}:{index}:0" for label, index in (
        ("session_start", 0), ("user_prompt_submit", 0), ("permission_request", 0), ("pre_tool_use", 1),
        ("stop", 0))}
    assert set(trusted) == expected_keys  # the user's own hook stays untrusted: that is theirs to decide
    assert trusted[f"{hooks_json}:pre_tool_use:1:0"] == codex.handler_hash("PreToolUse", ours, ours["hooks"][0])
    assert tomllib.loads(config.read_text())["hooks"]["state"]["/elsewhere/hooks.json:stop:0:0"] == {
        "enabled": False}
    assert config.read_text().startswith(USER_CONFIG + "\n# >>> ai1net-bridge")

    after_first = (hooks_json.read_bytes(), config.read_bytes())
    again = codex.install(home=home, window=60, launcher="/opt/bridge")
    assert not again["changed"] and not again["trust_changed"]
    assert (hooks_json.read_bytes(), config.read_bytes()) == after_first

    # Another window changes the commands: one block still, with the new hashes.
    codex.install(home=home, window=200, launcher="/opt/bridge")
    assert config.read_text().count("# >>> ai1net-bridge") == 1
    assert trust_in(config) != trusted and set(trust_in(config)) == expected_keys

    done = codex.rollback(home=home)
    assert {item["action"] for item in done} == {"restored", "edited"}
    assert (hooks_json.read_bytes(), config.read_bytes()) == before
    assert sorted(p.name for p in codex_home.iterdir()) == ["config.toml", "hooks.json"]  # backups gone
    assert not (home / codex.TRUST_MANIFEST).exists() and not (home / "hooks-installed.json").exists()
    assert codex.rollback(home=home) == []


def test_install_into_a_fresh_codex_home_and_rollback_leave_nothing_behind(tmp_path, codex_home):
    home = tmp_path / "bridge"
    result = codex.install(home=home, launcher="/opt/bridge")
    assert result["backup"] is None and result["config_backup"] is None
    assert len(trust_in(codex_home / "config.toml")) == 5
    codex.rollback(home=home)
    assert list(codex_home.iterdir()) == []


def test_a_rollback_of_every_agent_leaves_the_trust_block_for_the_codex_rollback(tmp_path, codex_home):
    from clients.bridge import hooks_install

    home = tmp_path / "bridge"
    codex.install(home=home, launcher="/opt/bridge")
    hooks_install.rollback(home=home)  # `hooks install --rollback` without --agent: every recorded file
    assert not (codex_home / "hooks.json").exists() and len(trust_in(codex_home / "config.toml")) == 5
    assert codex.rollback(home=home) == [{"settings": str(codex_home / "config.toml"), "action": "removed"}]
    assert list(codex_home.iterdir()) == []


def test_a_config_that_would_not_parse_is_refused_and_nothing_changes(tmp_path, codex_home):
    hooks_json, config = codex_home / "hooks.json", codex_home / "config.toml"
    # The user trusted a hook at the very key ours will take: a second table of that name is not TOML.
    config.write_text(f'[hooks.state."{hooks_json}:stop:0:0"]\nenabled = true\n')
    before = config.read_bytes()
    with pytest.raises(HooksInstallError, match="would not be valid TOML"):
        codex.install(home=tmp_path / "bridge", launcher="/opt/bridge")
    assert config.read_bytes() == before and not hooks_json.exists()
    assert not (tmp_path / "bridge" / codex.TRUST_MANIFEST).exists()


def test_the_command_line_installs_and_rolls_back_and_refuses_the_claude_only_option(tmp_path, codex_home):
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "clients.bridge", "--home", str(tmp_path / "bridge"), "hooks",
                               "install", "--agent", "codex", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=30)

    refused = run("--answer-style", "deny")
    assert refused.returncode == 1 and "Codex has no such tool" in refused.stderr
    refused = run("--approve", "Bash")
    assert refused.returncode == 1 and "--approve is Claude Code's" in refused.stderr
    assert list(codex_home.iterdir()) == []
    installed = run()
    assert installed.returncode == 0, installed.stderr
    assert f"Codex hooks installed in {codex_home / 'hooks.json'}" in installed.stdout
    assert "run_hook.py --home" in json.loads((codex_home / "hooks.json").read_text())["hooks"]["Stop"][0][
        "hooks"][0]["command"]
    assert "nothing changed" in run().stdout
    rolled = run("--rollback")
    assert rolled.returncode == 0 and list(codex_home.iterdir()) == []


# --- payload translation -----------------------------------------------------------------------
class FakeDaemon:
    """The daemon's local API as the hook sees it: records the calls, answers the waits with ``result``."""

    def __init__(self, result: dict) -> None:
        self.calls: list[tuple[str, dict]] = []
        self.result = {"state": "answered", **result}

    def post(self, route: str, body: dict, timeout: float) -> dict:
        self.calls.append((route, body))
        return {"question_id": "q-1"}

    def post_retrying(self, route: str, body: dict, timeout: float, deadline: float) -> dict:
        self.calls.append((route, body))
        return self.result


@pytest.mark.parametrize(("decision", "reason", "verdict"), [
    ("allow", None, {"behavior": "allow"}),
    ("allow_session", None, {"behavior": "allow"}),  # remembered by the bridge: Codex rejects updatedPermissions
    ("deny", "The user denied this tool call from their phone: not here",
     {"behavior": "deny", "message": "The user denied this tool call from their phone: not here"}),
])
def test_codexs_approval_takes_the_tool_permission_path_and_gets_codexs_documented_decision(decision, reason, verdict):
    daemon = FakeDaemon({"decision": decision, "reason": reason,
                         "input_hash": permission.input_hash(PERMISSION_REQUEST["tool_input"])})
    assert handle(PERMISSION_REQUEST, daemon, window=30, style="allow") == {
        "hookSpecificOutput": {"hookEventName": "PermissionRequest", "decision": verdict}}
    (route, body), (wait, _) = daemon.calls
    assert (route, wait) == ("permission-request", "questions/wait")
    assert (body["session_id"], body["event"], body["tool_name"], body["tool_input"], body["window_sec"]) == (
        SESSION, "PermissionRequest", "Bash", PERMISSION_REQUEST["tool_input"], 30)


def test_a_decision_for_another_input_is_no_decision_for_codex_either():
    daemon = FakeDaemon({"decision": "allow", "input_hash": permission.input_hash({"command": "rm -rf /"})})
    assert handle(PERMISSION_REQUEST, daemon, window=30, style="allow") is None


def test_codexs_question_tool_goes_to_the_phone_and_the_answer_back_as_a_deny_reason():
    daemon = FakeDaemon({"answers": {"Which framework?": ["Vue"]}, "other": {"Which framework?": "with Pinia"}})
    output = handle(REQUEST_USER_INPUT, daemon, window=30, style="allow")
    assert output == {"hookSpecificOutput": {
        "hookEventName": "PreToolUse", "permissionDecision": "deny",
        "permissionDecisionReason": 'The user answered on their phone (this is their answer, not a refusal): '
                                    '"Which framework?"="Vue, with Pinia". Continue with this answer.'}}
    route, body = daemon.calls[0]
    assert (route, body["tool_use_id"]) == ("pre-tool-use", "call_q")
    assert body["tool_input"] == {"questions": [{
        "question": "Which framework?", "header": "Framework", "multiSelect": False,
        "options": [{"label": "Vue", "description": "v"}, {"label": "React", "description": "r"}]}]}

    # Another tool's PreToolUse from Codex (the matcher should not send it, but if it came): nothing asked.
    daemon = FakeDaemon({})
    bash = {**REQUEST_USER_INPUT, "tool_name": "Bash", "tool_input": {"command": "ls"}}
    assert handle(bash, daemon, window=30, style="allow") is None and daemon.calls == []
