"""`hooks install` / `--rollback` on a Claude Code settings.json."""

from __future__ import annotations

import json
import subprocess
import sys

from clients.bridge.hooks_install import MANIFEST, install, rollback
from tests.e2e_support import ROOT

ORIGINAL = (
    b'{\n    "model": "opus",\n    "hooks": {\n        "PreToolUse": [\n            {\n'
    b'                "matcher": "Bash",\n                "hooks": [{"type": "command", "command": "audit.sh"}]\n'
    b'            }\n        ]\n    },\n    "permissions": {"allow": ["Read"]}\n}\n'
)
LAUNCHER = "/usr/bin/python3 /opt/ai1net-bridge.pyz"


def test_install_adds_every_event_and_keeps_the_users_entries(tmp_path):
    settings = tmp_path / "settings.json"
    settings.write_bytes(ORIGINAL)
    home = tmp_path / "home"
    result = install(home=home, settings_path=settings, window=90, style="deny", launcher=LAUNCHER)
    assert result["changed"] is True
    data = json.loads(settings.read_bytes())
    assert list(data) == ["model", "hooks", "permissions"]
    assert list(data["hooks"]) == ["PreToolUse", "SessionStart", "PostToolUse", "UserPromptSubmit", "Stop", "SessionEnd"]
    command = f"{LAUNCHER} --home {home.resolve()} hook --window 90 --answer-style deny"
    assert data["hooks"]["PreToolUse"] == [
        {"matcher": "Bash", "hooks": [{"type": "command", "command": "audit.sh"}]},
        {
            "matcher": "AskUserQuestion",
            "hooks": [
                {"type": "command", "command": command, "timeout": 120, "statusMessage": "Question sent to your phone (ai1net)…"}
            ],
        },
    ]
    assert data["hooks"]["PostToolUse"] == [
        {"matcher": "AskUserQuestion", "hooks": [{"type": "command", "command": command, "timeout": 10}]}
    ]
    assert data["hooks"]["Stop"][0]["hooks"][0]["timeout"] == 120
    assert data["hooks"]["SessionEnd"] == [{"hooks": [{"type": "command", "command": command, "timeout": 2}]}]
    assert "matcher" not in data["hooks"]["UserPromptSubmit"][0]
    assert settings.read_text().startswith('{\n    "model"')  # the file's own indentation is kept
    assert (tmp_path / result["backup"].split("/")[-1]).read_bytes() == ORIGINAL
    assert (home / MANIFEST).stat().st_mode & 0o777 == 0o600


def test_install_twice_then_rollback_gives_back_the_exact_bytes(tmp_path):
    settings = tmp_path / "settings.json"
    settings.write_bytes(ORIGINAL)
    home = tmp_path / "home"
    install(home=home, settings_path=settings, launcher=LAUNCHER)
    after_first = settings.read_bytes()
    second = install(home=home, settings_path=settings, launcher=LAUNCHER)
    assert second["changed"] is False
    assert settings.read_bytes() == after_first
    assert len(list(tmp_path.glob("settings.json.ai1net-backup-*"))) == 1
    assert rollback(home=home) == [{"settings": str(settings.resolve()), "action": "restored"}]
    assert settings.read_bytes() == ORIGINAL
    assert not (home / MANIFEST).exists()
    assert rollback(home=home) == []


def test_changed_options_replace_the_entries_and_rollback_still_restores(tmp_path):
    settings = tmp_path / "settings.json"
    settings.write_bytes(ORIGINAL)
    home = tmp_path / "home"
    install(home=home, settings_path=settings, launcher=LAUNCHER, window=60)
    install(home=home, settings_path=settings, launcher=LAUNCHER, window=300)
    data = json.loads(settings.read_bytes())
    assert len(data["hooks"]["PreToolUse"]) == 2
    assert data["hooks"]["PreToolUse"][1]["hooks"][0]["timeout"] == 330
    rollback(home=home, settings_path=settings)
    assert settings.read_bytes() == ORIGINAL


def test_rollback_when_install_created_the_file_removes_it(tmp_path):
    settings = tmp_path / ".claude" / "settings.json"
    home = tmp_path / "home"
    install(home=home, settings_path=settings, launcher=LAUNCHER)
    install(home=home, settings_path=settings, launcher=LAUNCHER)
    assert settings.exists()
    assert rollback(home=home) == [{"settings": str(settings.resolve()), "action": "removed"}]
    assert not settings.exists()


def test_rollback_keeps_what_the_user_changed_meanwhile(tmp_path):
    settings = tmp_path / "settings.json"
    settings.write_bytes(b'{"theme": "dark"}')
    home = tmp_path / "home"
    install(home=home, settings_path=settings, launcher=LAUNCHER)
    data = json.loads(settings.read_bytes())
    data["theme"] = "light"
    data["hooks"]["Stop"].append({"hooks": [{"type": "command", "command": "notify.sh"}]})
    settings.write_text(json.dumps(data, indent=2))
    assert rollback(home=home)[0]["action"] == "edited"
    assert json.loads(settings.read_bytes()) == {
        "theme": "light",
        "hooks": {"Stop": [{"hooks": [{"type": "command", "command": "notify.sh"}]}]},
    }


def test_invalid_settings_are_left_untouched(tmp_path):
    settings = tmp_path / "settings.json"
    settings.write_bytes(b"{not json")
    result = subprocess.run(
        [sys.executable, "-m", "clients.bridge", "--home", str(tmp_path / "h"), "hooks", "install",
         "--settings", str(settings)],
        cwd=ROOT, capture_output=True, text=True, timeout=30,
    )
    assert result.returncode == 1
    assert "not valid JSON" in result.stderr
    assert settings.read_bytes() == b"{not json"


def test_cli_install_writes_a_command_that_runs_this_checkout(tmp_path):
    settings = tmp_path / "settings.json"
    settings.write_bytes(ORIGINAL)
    home = tmp_path / "home"
    args = ["--home", str(home), "hooks", "install", "--settings", str(settings), "--window", "45"]
    for _ in range(2):
        done = subprocess.run([sys.executable, "-m", "clients.bridge", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
    assert "nothing changed" in done.stdout
    command = json.loads(settings.read_bytes())["hooks"]["SessionEnd"][0]["hooks"][0]["command"]
    assert command.endswith(f" -I -S {ROOT / 'clients' / 'bridge' / 'run_hook.py'} --home {home.resolve()} hook "
                            "--window 45 --answer-style allow")
    assert "PYTHONPATH" not in command
    # The command works from any directory (the host runs it in the project's folder) and fails open.
    ran = subprocess.run(
        ["/bin/sh", "-c", command], cwd=tmp_path, input=b'{"hook_event_name":"SessionEnd","session_id":"s"}',
        capture_output=True, timeout=10,
    )
    assert (ran.returncode, ran.stdout, ran.stderr) == (0, b"", b"")
    done = subprocess.run(
        [sys.executable, "-m", "clients.bridge", "--home", str(home), "hooks", "install", "--rollback"],
        cwd=ROOT, capture_output=True, text=True, timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert settings.read_bytes() == ORIGINAL


def test_the_hooks_copy_of_the_archive_goes_with_the_last_hooks(tmp_path):
    """The copy of the .pyz's modules (hook_cache) serves every settings file's hooks: a rollback of one keeps it,
    the last one removes it (and with it the bridge's start writes none)."""
    home = tmp_path / "home"
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    install(home=home, settings_path=first, launcher=LAUNCHER)
    install(home=home, settings_path=second, launcher=LAUNCHER)
    copy = home.resolve() / "hook-cache" / "1-2-3" / "clients"
    copy.mkdir(parents=True)  # as `hooks install` from a .pyz writes it
    rollback(home=home, settings_path=first)
    assert copy.is_dir()
    rollback(home=home, settings_path=second)
    assert not (home / "hook-cache").exists()
