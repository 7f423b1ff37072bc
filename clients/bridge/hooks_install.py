"""`ai1net-bridge hooks install [--rollback]`: add (or remove) the bridge's hook entries in the agent
host's `settings.json` (Claude Code's layout: hooks -> event -> [{matcher, hooks: [handler]}]).

Install is idempotent: a second run with the same options changes nothing. It keeps a byte-for-byte
backup of the file as it was before the first install (`<file>.ai1net-backup-<timestamp>`) and records
exactly what it added in `<home>/hooks-installed.json`. Rollback removes exactly those entries and the
empty containers install created; when nothing else changed in between, the file comes back
byte-for-byte as it was (or is removed again if install created it). Writes are atomic and keep the
user's other hooks, keys and key order.
"""

from __future__ import annotations

import copy
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from clients.bridge import hook_cache
from clients.bridge.hook_cache import cache_dir, running_pyz

MANIFEST = "hooks-installed.json"
ASK_TOOL = "AskUserQuestion"
DEFAULT_WINDOW = 120
STATUS_ASK = "Question sent to your phone (ai1net)…"
STATUS_STOP = "Waiting for a message from your phone (ai1net)…"
STATUS_APPROVE = "Approval request sent to your phone (ai1net)…"
APPROVE_ASKED = "asked"  # --approve asked: only the tool calls Claude Code itself would ask about


class HooksInstallError(Exception):
    pass


def default_settings_path() -> Path:
    return Path(os.path.expanduser("~/.claude/settings.json"))


def default_launcher(home: Path) -> str:
    """How to start this bridge from a hook: the .pyz we run from (``pyz_launcher``, with ``home``'s copy of
    its modules, ``hook_cache``), or ``clients/bridge/run_hook.py`` of a checkout (it accepts every command
    the hook gets, ``--home H hook …``).

    The hook needs nothing but the standard library, so the interpreter starts without ``site`` (``-S``:
    no site-packages scan, no .pth files; about a third of a bare start-up) and isolated (``-I``: no
    user site, no PYTHON* variables, neither the current nor the script's directory on the path).
    """
    python = sys.executable or "python3"
    pyz = running_pyz()
    if pyz is not None:
        return pyz_launcher(pyz, python, cache_dir(home))
    script = Path(__file__).resolve().with_name("run_hook.py")  # the checkout: no runpy, no PYTHONPATH (run_hook.py)
    return f"{shlex.quote(python)} -I -S {shlex.quote(str(script))}"


# The hook's entry in a .pyz, run with ``-c`` (argv[1] the archive, argv[2] the folder of its copies):
# - Not the archive as the script: Python runs that through runpy, whose imports (importlib.util, contextlib,
#   collections, functools) took 6 of the 20 ms a hook call cost on the bench machine.
# - The hook from the archive's copy (``hook_cache``), first on the path when it is there for the archive as it
#   is on disk now (the key is ``hook_cache.key``'s): an import from the archive first reads its directory of
#   some 140 entries, 0.5 ms of every hook call. The archive goes last, after the standard library, whose
#   imports would otherwise look in it first and read that directory all the same.
# - The stat is the C half of ``os`` (``posix`` or ``nt``, as ``os.name`` says), loaded at every start: the hook
#   imports no ``os`` (1 ms).
# - It ends without the interpreter's finalization (``hook.exit_now``: 1.1 ms).
# Commands installed before this entry carry their own (the archive first on the path) and keep working.
PYZ_HOOK_ENTRY = (
    f"import sys, {os.name}; a = sys.argv; s = {os.name}.stat(a[1]); "
    "sys.path.insert(0, '%s/%x-%x-%x' % (a[2], s.st_ino, s.st_mtime_ns, s.st_size)); "
    "sys.path.append(a[1]); from clients.bridge.hook import exit_now, main; exit_now(main(a[3:]))")


def pyz_launcher(pyz: str, python: str, cache: Path) -> str:
    """The hook's command for the bridge in ``pyz``, ready for ``--home H hook …`` after it, importing the
    hook from its copy in ``cache`` (``hook_cache.cache_dir(home)``) while that copy is current."""
    return (f"{shlex.quote(python)} -I -S -c {shlex.quote(PYZ_HOOK_ENTRY)} {shlex.quote(os.path.abspath(pyz))} "
            f"{shlex.quote(str(cache))}")


HOOK_MODULES = ("clients/__init__.py", "clients/bridge/__init__.py", "clients/bridge/__main__.py",
                "clients/bridge/hook.py", "clients/bridge/permission_hook.py")  # what a hook call imports


def precompile_hook() -> List[str]:
    """Write the bytecode of the modules the hook loads (from a checkout), so that each hook run reads
    it instead of compiling them again: with PYTHONDONTWRITEBYTECODE set (some shells and hosts set
    it) Python would never write it and every hook call paid the compile. Returns what was written; a
    read-only checkout or a .pyz (zipimport compiles in memory) is left as it is."""
    import py_compile

    if running_pyz() is not None:
        return []
    root = Path(__file__).resolve().parents[2]
    written = []
    for name in HOOK_MODULES:
        try:
            written.append(py_compile.compile(str(root / name), doraise=True))
        except (OSError, py_compile.PyCompileError):
            continue
    return written


def prepare_hook(home: Path) -> None:
    """What makes the hook's command start fast (it works without): the bytecode of a checkout's hook
    modules, or a .pyz's modules copied into ``home`` (``hook_cache``)."""
    pyz = running_pyz()
    if pyz is None:
        precompile_hook()
    else:
        hook_cache.extract(Path(pyz), cache_dir(home))


def hook_command(
    *, home: Path, launcher: Optional[str] = None, window: int = DEFAULT_WINDOW, style: str = "allow"
) -> str:
    base = launcher or default_launcher(home)
    home_arg = shlex.quote(str(Path(home).expanduser().resolve()))
    return f"{base} --home {home_arg} hook --window {int(window)} --answer-style {style}"


def parse_approve(value: Optional[str]) -> Optional[List[str]]:
    """``--approve Bash,Write,Edit`` -> the tools routed through PreToolUse; ``asked`` -> none of them
    (only PermissionRequest); None -> no tool approval from the phone at all."""
    if value is None:
        return None
    tools = [name.strip() for name in value.split(",") if name.strip()]
    if tools == [APPROVE_ASKED]:
        return []
    for name in tools:
        if not name.replace("_", "").replace("-", "").isalnum() or not name.isascii() or name == ASK_TOOL:
            raise HooksInstallError(f"--approve takes tool names such as Bash,Write,Edit (or {APPROVE_ASKED}), "
                                    f"not {name!r}")
    if not tools:
        raise HooksInstallError(f"--approve takes tool names such as Bash,Write,Edit (or {APPROVE_ASKED})")
    return list(dict.fromkeys(tools))


def command_handler(command: str, timeout: int, status: Optional[str] = None) -> Dict[str, Any]:
    """One ``{"type": "command"}`` hook handler, in the shape Claude Code and Codex CLI both read."""
    entry: Dict[str, Any] = {"type": "command", "command": command, "timeout": timeout}
    if status:
        entry["statusMessage"] = status
    return entry


def desired_entries(*, command: str, window: int, approve: Optional[List[str]] = None) -> List[Dict[str, Any]]:
    """Claude Code's entries. ``approve`` (see parse_approve): PreToolUse for those tools, and
    PermissionRequest for every other tool that asks (not AskUserQuestion, whose dialog is the desk's
    answer, nor a routed tool, whose desktop prompt after a phone timeout must stay at the desk)."""

    def handler(timeout: int, status: Optional[str] = None) -> Dict[str, Any]:
        return command_handler(command, timeout, status)

    return [
        {"event": "SessionStart", "group": {"hooks": [handler(10)]}},
        {"event": "PreToolUse", "group": {"matcher": ASK_TOOL, "hooks": [handler(window + 30, STATUS_ASK)]}},
        {"event": "PostToolUse", "group": {"matcher": ASK_TOOL, "hooks": [handler(10)]}},
        {"event": "UserPromptSubmit", "group": {"hooks": [handler(10)]}},
        {"event": "Stop", "group": {"hooks": [handler(window + 30, STATUS_STOP)]}},
        {"event": "SessionEnd", "group": {"hooks": [handler(2)]}},
    ] + _approval_entries(approve, handler(window + 30, STATUS_APPROVE))


def _approval_entries(approve: Optional[List[str]], handler: Dict[str, Any]) -> List[Dict[str, Any]]:
    if approve is None:
        return []
    not_asked = "|".join([ASK_TOOL, *approve])  # names only (parse_approve): no regex metacharacters
    entries = [{"event": "PermissionRequest", "group": {"matcher": f"^(?!({not_asked})$)", "hooks": [handler]}}]
    if approve:
        # Letters, digits and "|" only: an exact list of names (reference/agent-hooks.md, "Matcher").
        entries.append({"event": "PreToolUse", "group": {"matcher": "|".join(approve), "hooks": [handler]}})
    return entries


# --- files -----------------------------------------------------------------------------------
def _load_manifest(home: Path) -> Dict[str, Any]:
    try:
        data = json.loads((home / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {"version": 1, "installs": {}}
    except ValueError as exc:
        raise HooksInstallError(f"{home / MANIFEST} is not valid JSON: {exc}") from None
    data.setdefault("installs", {})
    return data


def _save_manifest(home: Path, manifest: Dict[str, Any]) -> None:
    path = home / MANIFEST
    if not manifest.get("installs"):
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        return
    _atomic_write(path, (json.dumps(manifest, indent=2, ensure_ascii=False) + "\n").encode("utf-8"), mode=0o600)


def _atomic_write(path: Path, data: bytes, mode: Optional[int] = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if mode is None:
        try:
            mode = path.stat().st_mode & 0o7777
        except FileNotFoundError:
            mode = 0o600
    tmp = path.with_name(f".{path.name}.ai1net-{os.getpid()}.tmp")
    fd = os.open(str(tmp), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except FileNotFoundError:
            pass
        raise


def _parse_settings(raw: Optional[bytes], path: Path) -> Dict[str, Any]:
    if raw is None or not raw.strip():
        return {}
    try:
        data = json.loads(raw.decode("utf-8"))
    except ValueError as exc:
        raise HooksInstallError(f"{path} is not valid JSON ({exc}); fix it first, nothing was changed") from None
    if not isinstance(data, dict):
        raise HooksInstallError(f"{path} must hold a JSON object; nothing was changed")
    return data


def _serialize(data: Dict[str, Any], like: Optional[bytes]) -> bytes:
    indent: Any = 2
    if like:
        text = like.decode("utf-8", "replace")
        lines = text.splitlines()
        for line in lines[1:]:
            stripped = line.lstrip(" \t")
            if stripped:
                lead = line[: len(line) - len(stripped)]
                indent = "\t" if lead.startswith("\t") else (len(lead) or 2)
                break
    return (json.dumps(data, indent=indent, ensure_ascii=False) + "\n").encode("utf-8")


def _remove_entries(data: Dict[str, Any], entries: List[Dict[str, Any]]) -> None:
    hooks = data.get("hooks")
    if not isinstance(hooks, dict):
        return
    for entry in entries:
        groups = hooks.get(entry["event"])
        if isinstance(groups, list) and entry["group"] in groups:
            groups.remove(entry["group"])


# --- install / rollback ----------------------------------------------------------------------
def install(
    *,
    home: Path,
    settings_path: Optional[Path] = None,
    window: int = DEFAULT_WINDOW,
    style: str = "allow",
    launcher: Optional[str] = None,
    build_entries: Optional[Callable[..., List[Dict[str, Any]]]] = None,
    approve: Optional[List[str]] = None,
) -> Dict[str, Any]:
    """Add the hook entries (``build_entries(command=, window=)``, default Claude Code's; codex.py passes
    Codex CLI's). Returns {"settings", "changed", "backup", "command"}."""
    if style not in ("allow", "deny"):
        raise HooksInstallError("answer style must be allow or deny")
    if not 5 <= int(window) <= 3600:
        raise HooksInstallError("the window must be between 5 and 3600 seconds")
    home = Path(home).expanduser().resolve()
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = Path(os.path.realpath(os.path.expanduser(str(settings_path or default_settings_path()))))
    raw = path.read_bytes() if path.exists() else None
    data = _parse_settings(raw, path)
    manifest = _load_manifest(home)
    record = manifest["installs"].get(str(path))
    command = hook_command(home=home, launcher=launcher, window=int(window), style=style)
    if build_entries is not None:
        entries = build_entries(command=command, window=int(window))
    else:
        entries = desired_entries(command=command, window=int(window), approve=approve)
    if launcher is None:
        prepare_hook(home)

    work = copy.deepcopy(data)
    if record:
        _remove_entries(work, record["entries"])
    created = list(record["created_containers"]) if record else []
    if "hooks" not in work:
        work["hooks"] = {}
        created.append("hooks")
    hooks = work["hooks"]
    if not isinstance(hooks, dict):
        raise HooksInstallError(f'"hooks" in {path} is not an object; nothing was changed')
    for entry in entries:
        groups = hooks.get(entry["event"])
        if groups is None:
            groups = hooks[entry["event"]] = []
            created.append(f"hooks.{entry['event']}")
        if not isinstance(groups, list):
            raise HooksInstallError(f'"hooks.{entry["event"]}" in {path} is not a list; nothing was changed')
        if entry["group"] not in groups:
            groups.append(entry["group"])

    changed = work != data or raw is None
    backup = record.get("backup") if record else None
    if changed:
        if raw is not None and not record:
            backup_path = path.with_name(f"{path.name}.ai1net-backup-{time.strftime('%Y%m%dT%H%M%S')}")
            n = 1
            while backup_path.exists():
                backup_path = path.with_name(f"{path.name}.ai1net-backup-{time.strftime('%Y%m%dT%H%M%S')}-{n}")
                n += 1
            _atomic_write(backup_path, raw, mode=path.stat().st_mode & 0o7777)
            backup = str(backup_path)
        _atomic_write(path, _serialize(work, raw))
    manifest["installs"][str(path)] = {
        "created_file": record["created_file"] if record else raw is None,
        "created_containers": created,
        "entries": entries,
        "backup": backup,
        "installed_at": record["installed_at"] if record else time.time(),
        "command": command,
    }
    _save_manifest(home, manifest)
    return {"settings": str(path), "changed": changed, "backup": backup, "command": command}


def rollback(*, home: Path, settings_path: Optional[Path] = None) -> List[Dict[str, Any]]:
    """Remove what install added. Returns one {"settings", "action"} per settings file touched."""
    home = Path(home).expanduser().resolve()
    manifest = _load_manifest(home)
    targets = list(manifest["installs"])
    if settings_path is not None:
        wanted = os.path.realpath(os.path.expanduser(str(settings_path)))
        targets = [t for t in targets if t == wanted]
    done = []
    for target in targets:
        record = manifest["installs"][target]
        path = Path(target)
        if not path.exists():
            done.append({"settings": target, "action": "missing"})
            del manifest["installs"][target]
            continue
        raw = path.read_bytes()
        data = _parse_settings(raw, path)
        work = copy.deepcopy(data)
        _remove_entries(work, record["entries"])
        hooks = work.get("hooks")
        created = set(record["created_containers"])
        if isinstance(hooks, dict):
            for event in list(hooks):
                if f"hooks.{event}" in created and hooks[event] == []:
                    del hooks[event]
            if "hooks" in created and hooks == {}:
                del work["hooks"]
        original = None
        if record.get("backup"):
            try:
                original = Path(record["backup"]).read_bytes()
            except OSError:
                original = None
        if record["created_file"] and work == {}:
            path.unlink()
            action = "removed"
        elif original is not None and _parse_settings(original, path) == work:
            _atomic_write(path, original)  # nothing else changed: the exact bytes from before
            action = "restored"
        else:
            _atomic_write(path, _serialize(work, raw))
            action = "edited"
        if original is not None and action in ("restored", "removed"):
            try:
                Path(record["backup"]).unlink()
            except OSError:
                pass
        del manifest["installs"][target]
        done.append({"settings": target, "action": action})
    _save_manifest(home, manifest)
    if not manifest["installs"]:  # no hook left to start from it: the copy install wrote goes too
        hook_cache.remove(home)
    return done
