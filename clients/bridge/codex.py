"""`ai1net-bridge hooks install --agent codex [--rollback]`: the bridge's hooks in OpenAI Codex CLI.

Codex reads command hooks from ``$CODEX_HOME/hooks.json`` (default ``~/.codex``; a project's
``.codex/hooks.json`` too) in Claude Code's layout (event -> [{matcher, hooks: [handler]}]), so the
entries go in with ``hooks_install.install`` (same idempotence, backup and manifest). What Codex adds:

* It runs a hook that is not managed only when the user trusted it: ``[hooks.state."<key>"]
  trusted_hash = "sha256:…"`` in the user's ``$CODEX_HOME/config.toml`` (only that layer may hold
  trust), keyed ``<absolute hooks.json path>:<event label>:<group index>:<handler index>``; an untrusted
  or changed hook is skipped without a word. Running ``hooks install`` is the user trusting ours, so it
  writes those entries for exactly our handlers, as one marked block at the end of config.toml (a
  backup first), and rollback takes the block out again: config.toml comes back byte for byte.
* The hash (``codex-rs/hooks/src/engine/discovery.rs``, ``command_hook_hash``) is SHA-256 of the
  handler's normalized identity as compact JSON with sorted keys: ``event_name`` (the label), the
  group's ``matcher`` (absent for UserPromptSubmit and Stop, which ignore it) and ``hooks`` holding the
  one handler with ``timeout`` always present and ``async`` false.

Events installed: SessionStart, UserPromptSubmit (phone messages as context), PermissionRequest
(approvals to the phone), PreToolUse of ``request_user_input`` (Codex's questions to the phone; both in
codex_hook.py) and Stop (wait for a phone message). Codex has no SessionEnd (README: Codex CLI).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Dict, List, Optional

from clients.bridge import hooks_install
from clients.bridge.codex_hook import QUESTION_TOOL
from clients.bridge.hooks_install import STATUS_ASK, HooksInstallError

LABELS = {
    "PreToolUse": "pre_tool_use",
    "PermissionRequest": "permission_request",
    "PostToolUse": "post_tool_use",
    "SessionStart": "session_start",
    "UserPromptSubmit": "user_prompt_submit",
    "Stop": "stop",
}
MATCHERLESS = ("UserPromptSubmit", "Stop")  # Codex drops their matcher (matcher_pattern_for_event)
STATUS_APPROVAL = "Approval sent to your phone (ai1net)…"
BLOCK_BEGIN = "# >>> ai1net-bridge: trust for its hooks in {path} (remove with: ai1net-bridge hooks install " \
              "--agent codex --rollback)\n"
BLOCK_END = "# <<< ai1net-bridge\n"
TRUST_MANIFEST = "codex-trust.json"


def codex_home() -> Path:
    return Path(os.path.expanduser(os.environ.get("CODEX_HOME") or "~/.codex"))


def codex_entries(*, command: str, window: int) -> List[Dict[str, Any]]:
    def handler(timeout: int, status: Optional[str] = None) -> Dict[str, Any]:
        return hooks_install.command_handler(command, timeout, status)

    return [
        {"event": "SessionStart", "group": {"hooks": [handler(10)]}},
        {"event": "UserPromptSubmit", "group": {"hooks": [handler(10)]}},
        {"event": "PermissionRequest", "group": {"hooks": [handler(window + 30, STATUS_APPROVAL)]}},
        {"event": "PreToolUse", "group": {"matcher": QUESTION_TOOL, "hooks": [handler(window + 30, STATUS_ASK)]}},
        {"event": "Stop", "group": {"hooks": [handler(window + 30, hooks_install.STATUS_STOP)]}},
    ]


def handler_hash(event: str, group: Dict[str, Any], handler: Dict[str, Any]) -> str:
    """Codex's ``trusted_hash`` for one command handler of ``group`` under ``event``."""
    normalized: Dict[str, Any] = {
        "type": "command",
        "command": handler["command"],
        "timeout": max(1, int(handler.get("timeout") or 600)),
        "async": bool(handler.get("async", False)),
    }
    if handler.get("statusMessage") is not None:
        normalized["statusMessage"] = handler["statusMessage"]
    identity: Dict[str, Any] = {"event_name": LABELS[event], "hooks": [normalized]}
    if group.get("matcher") is not None and event not in MATCHERLESS:
        identity["matcher"] = group["matcher"]
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def trust_entries(hooks_json: Path, entries: List[Dict[str, Any]]) -> Dict[str, str]:
    """State key -> trusted hash for our entries, at the positions they hold in ``hooks_json`` now."""
    data = json.loads(hooks_json.read_text(encoding="utf-8"))
    trust = {}
    for entry in entries:
        groups = data["hooks"][entry["event"]]
        index = groups.index(entry["group"])
        for handler_index, handler in enumerate(entry["group"]["hooks"]):
            key = f"{hooks_json}:{LABELS[entry['event']]}:{index}:{handler_index}"
            trust[key] = handler_hash(entry["event"], entry["group"], handler)
    return trust


def _toml_string(text: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's, bar surrogate pairs: keep non-ASCII as is)."""
    return json.dumps(text, ensure_ascii=False)


def trust_block(hooks_json: Path, trust: Dict[str, str]) -> str:
    lines = [BLOCK_BEGIN.format(path=hooks_json)]
    for key, digest in trust.items():
        lines.append(f"[hooks.state.{_toml_string(key)}]\ntrusted_hash = {_toml_string(digest)}\n")
    lines.append(BLOCK_END)
    return "".join(lines)


def _check_toml(text: str, path: Path) -> None:
    try:
        import tomllib
    except ImportError:  # Python < 3.11: Codex will say so itself if the file is broken
        return
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise HooksInstallError(
            f"{path} would not be valid TOML with the trust entries ({exc}); nothing was changed"
        ) from None


def _load(home: Path) -> Dict[str, Any]:
    try:
        return json.loads((home / TRUST_MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except ValueError as exc:
        raise HooksInstallError(f"{home / TRUST_MANIFEST} is not valid JSON: {exc}") from None


def _save(home: Path, manifest: Dict[str, Any]) -> None:
    path = home / TRUST_MANIFEST
    if manifest:
        hooks_install._atomic_write(path, (json.dumps(manifest, indent=2) + "\n").encode("utf-8"), mode=0o600)
    else:
        path.unlink(missing_ok=True)


def _strip_block(text: str, block: Optional[str]) -> str:
    """``text`` without the block we appended (exactly as written), if it is still there."""
    if block and block in text:
        head, _, tail = text.rpartition(block)
        return head + tail
    return text


def _same(path: Path, other: str) -> bool:
    try:
        return path.read_bytes() == Path(other).read_bytes()
    except OSError:
        return False


def install(
    *,
    home: Path,
    hooks_path: Optional[Path] = None,
    config_path: Optional[Path] = None,
    window: int = hooks_install.DEFAULT_WINDOW,
    launcher: Optional[str] = None,
) -> Dict[str, Any]:
    """Add our hooks to Codex's hooks.json and trust them in config.toml. Idempotent.

    Returns hooks_install.install's result plus {"config", "trust_changed", "config_backup"}."""
    home = Path(home).expanduser().resolve()
    base = codex_home()
    hooks_json = Path(os.path.realpath(os.path.expanduser(str(hooks_path or base / "hooks.json"))))
    config = Path(os.path.realpath(os.path.expanduser(str(config_path or base / "config.toml"))))
    result = hooks_install.install(home=home, settings_path=hooks_json, window=window, launcher=launcher,
                                   build_entries=codex_entries)
    entries = hooks_install._load_manifest(home)["installs"][str(hooks_json)]["entries"]
    manifest = _load(home)
    record = manifest.get(str(config), {})
    raw = config.read_bytes() if config.exists() else None
    text = raw.decode("utf-8") if raw is not None else ""
    previous_block = record.get("blocks", {}).get(str(hooks_json))
    kept = _strip_block(text, previous_block)
    block = trust_block(hooks_json, trust_entries(hooks_json, entries))
    prefix = "" if not kept or kept.endswith("\n") else "\n"
    block = prefix + block
    new_text = kept + block
    trust_changed = new_text != text
    backup = record.get("backup")
    if trust_changed:
        try:
            _check_toml(new_text, config)
        except HooksInstallError:
            if not record:  # leave Codex as it was: hooks it cannot trust would only be skipped
                hooks_install.rollback(home=home, settings_path=hooks_json)
            raise
        if raw is not None and not record:
            backup_path = config.with_name(f"{config.name}.ai1net-backup")
            n = 1
            while backup_path.exists():
                backup_path = config.with_name(f"{config.name}.ai1net-backup-{n}")
                n += 1
            hooks_install._atomic_write(backup_path, raw, mode=config.stat().st_mode & 0o7777)
            backup = str(backup_path)
        hooks_install._atomic_write(config, new_text.encode("utf-8"))
    record = {
        "created_file": record.get("created_file", raw is None),
        "backup": backup,
        "blocks": {**record.get("blocks", {}), str(hooks_json): block},
    }
    manifest[str(config)] = record
    _save(home, manifest)
    return {**result, "config": str(config), "trust_changed": trust_changed, "config_backup": backup}


def rollback(*, home: Path, hooks_path: Optional[Path] = None) -> List[Dict[str, Any]]:
    """Remove our hooks from hooks.json and their trust from config.toml."""
    home = Path(home).expanduser().resolve()
    hooks_json = Path(os.path.realpath(os.path.expanduser(str(hooks_path or codex_home() / "hooks.json"))))
    done = hooks_install.rollback(home=home, settings_path=hooks_json)
    manifest = _load(home)
    for config_name, record in list(manifest.items()):
        block = record.get("blocks", {}).pop(str(hooks_json), None)
        if block is None:
            continue
        config = Path(config_name)
        if config.exists():
            text = config.read_text(encoding="utf-8")
            kept = _strip_block(text, block)
            if record["created_file"] and not kept.strip() and not record["blocks"]:
                config.unlink()
                action = "removed"
            else:
                hooks_install._atomic_write(config, kept.encode("utf-8"))
                action = "edited" if kept != text else "unchanged"
        else:
            action = "missing"
        if not record["blocks"]:
            if record.get("backup") and action in ("edited", "unchanged") and _same(config, record["backup"]):
                Path(record["backup"]).unlink(missing_ok=True)  # the file is as it was: the backup says no more
            del manifest[config_name]
        done.append({"settings": config_name, "action": action})
    _save(home, manifest)
    return done


def run_cli(args: Any, home: Path) -> int:
    """``hooks install --agent codex [--settings HOOKS_JSON] [--rollback]`` (hooks_cli.py)."""
    import sys

    try:
        if args.rollback:
            done = rollback(home=home, hooks_path=args.settings)
            if not done:
                print("nothing to roll back")
            for item in done:
                print(f"{item['settings']}: {item['action']}")
            return 0
        if args.answer_style != "allow":
            raise HooksInstallError("--answer-style is Claude Code's (AskUserQuestion); Codex has no such tool")
        if getattr(args, "approve", None):
            raise HooksInstallError("--approve is Claude Code's (PreToolUse routing); Codex takes a PreToolUse "
                                    "allow only with updatedInput. Its approvals reach the phone without it")
        result = install(home=home, hooks_path=args.settings, window=args.window, launcher=args.launcher)
    except HooksInstallError as exc:
        print(f"ai1net-bridge: {exc}", file=sys.stderr)
        return 1
    if result["changed"] or result["trust_changed"]:
        print(f"Codex hooks installed in {result['settings']}, trusted in {result['config']}")
        for backup in (result["backup"], result["config_backup"]):
            if backup:
                print(f"backup of the previous file: {backup}")
    else:
        print(f"Codex hooks already installed in {result['settings']}; nothing changed")
    print(f"hook command: {result['command']}")
    return 0
