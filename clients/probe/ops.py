"""The probe's operations: plain functions over a ``Confinement``, dispatched by ``Probe.call(op, params)``.

The platform sends them as JSON-RPC requests ``probe.<op>`` with ``params`` = the op's arguments.
Every op returns a JSON-able dict of a stable shape, or raises ``ProbeError(code, detail)``.
Unknown argument names are refused (``invalid_argument``), so a typo never passes silently.
Paths in results are real paths (symlinks resolved); relative paths are taken from the first root.

ping {}                                 -> {pong: true, time}
info {}                                 -> {hostname, os, python, version, roots, modes: {write, exec},
                                            ops, ripgrep}
read {path, offset=1, limit=2000, max_bytes=262144, base64=false}
    text:   -> {path, encoding: "utf-8", offset, limit, lines: [[n, text], ...], total_lines, size,
                truncated, next_offset}
            offset is the 1-based line to start at; next_offset is the next page's offset or null;
            a binary file (NUL in its first 8 KiB) fails is_binary unless base64=true.
    base64: -> {path, encoding: "base64", offset, size, data, truncated, next_offset}
            offset/limit count bytes here.
read_tree {path, depth=3, max_entries=1000, gitignore=true}
    -> {path, depth, entries: [{path, type: file|dir|symlink|other, size?, target?, broken?, loop?,
        outside?}], count, truncated}   (entry paths relative to `path`; links shown, never followed)
grep {pattern, path=<first root>, glob?, ignore_case=false, max_results=200, engine=auto|rg|python}
    -> {path, pattern, engine, matches: [{path, line, text}], files, truncated}
       hidden files, .gitignore'd files (from `path` down), binary files (a NUL byte), links and
       files over 10 MiB are skipped; `glob` is a gitignore-style pattern on the path below `path`
       ("*.py", "src/**", "!*.md"). Hits are sorted by path, then line; both engines agree.
stat {path} -> {path, type, size, mode, mtime, is_symlink, target?, broken?, outside?}
git_diff {path=<first root>, rev?, staged=false, max_bytes} -> {path, diff, truncated}
git_log {path=<first root>, rev?, limit=20, offset=0} -> {path, commits: [{hash, author, email, date,
        subject}], truncated}
ast_parse {path} -> {path, language, outline: "ast"|"regex", functions: [{name, qualname, line,
        end_line, kind: function|method, async}], classes: [{name, qualname, line, end_line, bases}],
        imports: [{module, names, line}]}
write {path, content | diff}                -> {path, bytes, created, sha256}      (needs --write)
run {argv, cwd=<first root>, timeout=60, max_bytes=262144}
    -> {argv, cwd, exit_code, stdout, stderr, timed_out, truncated, duration_ms}  (needs --exec)
run_background {argv, cwd}                  -> {handle, pid, argv, cwd}            (needs --exec)
run_output {handle, offset=0, max_bytes}    -> {handle, running, exit_code, output, offset,
                                                next_offset, dropped}
stop {handle}                               -> {handle, exit_code, running: false}  (needs --exec)
"""

from __future__ import annotations

import ast
import base64 as b64
import errno
import hashlib
import json
import os
import platform
import re
import secrets
import shutil
import signal
import socket
import stat as st_mod
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from . import ignore, udiff
from .confine import DIR_FLAGS, FILE_FLAGS, O_CLOEXEC, O_NOFOLLOW, Confinement
from .errors import ProbeError

__all__ = ["OPS", "Probe", "ProbeError"]

VERSION = "0.1.0"
READ_OPS = ("ping", "info", "read", "read_tree", "grep", "stat", "git_diff", "git_log", "ast_parse")
OPS = READ_OPS + ("write", "run", "run_background", "run_output", "stop")
MODE_OF = {"write": "write", "run": "exec", "run_background": "exec", "run_output": "exec", "stop": "exec"}

MAX_PAGE_BYTES = 3 * 1024 * 1024  # a result travels in one 4 MiB tunnel frame
DEFAULT_PAGE_BYTES = 256 * 1024
MAX_LINE_CHARS = 500  # grep hit lines are cut here
GREP_MAX_FILESIZE = 10 * 1024 * 1024
AST_MAX_BYTES = 5 * 1024 * 1024
WRITE_MAX_BYTES = 16 * 1024 * 1024
RING_BYTES = 1024 * 1024
MAX_BACKGROUND = 16
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
_UNSET: Any = object()


class Params:
    """Typed access to an op's arguments; refuses unknown names and wrong types."""

    def __init__(self, op: str, params: Dict[str, Any], allowed: Tuple[str, ...]) -> None:
        unknown = sorted(set(params) - set(allowed))
        if unknown:
            names = ", ".join(allowed) or "none"
            raise ProbeError("invalid_argument", f"{op}: unknown argument {unknown[0]!r}; it takes {names}")
        self.op = op
        self.params = params

    def _get(self, name: str, default: Any, kinds: Tuple[type, ...], what: str) -> Any:
        value = self.params.get(name, default)
        if value is _UNSET:
            raise ProbeError("invalid_argument", f"{self.op}: {name} is required")
        if value is default and name not in self.params:
            return value
        if value is None and default is None:
            return None
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise ProbeError("invalid_argument", f"{self.op}: {name} must be {what}")
        return value

    def str(self, name: str, default: Any = _UNSET) -> Any:
        return self._get(name, default, (str,), "a string")

    def bool(self, name: str, default: bool = False) -> bool:
        return self._get(name, default, (bool,), "true or false")

    def int(self, name: str, default: int, low: int, high: int) -> int:
        value = self._get(name, default, (int,), "an integer")
        if not low <= value <= high:
            raise ProbeError("invalid_argument", f"{self.op}: {name} must be between {low} and {high}")
        return value

    def number(self, name: str, default: float, low: float, high: float) -> float:
        value = self._get(name, default, (int, float), "a number")
        if not low <= value <= high:
            raise ProbeError("invalid_argument", f"{self.op}: {name} must be between {low} and {high}")
        return float(value)

    def argv(self) -> List[str]:
        value = self.params.get("argv")
        if not isinstance(value, list) or not value or not all(isinstance(a, str) and "\0" not in a for a in value):
            raise ProbeError("invalid_argument", f"{self.op}: argv must be a non-empty list of strings")
        return list(value)


# --- read ---------------------------------------------------------------------------------------
def op_read(conf: Confinement, p: Params) -> Dict[str, Any]:
    path = p.str("path")
    as_base64 = p.bool("base64")
    max_bytes = p.int("max_bytes", DEFAULT_PAGE_BYTES, 1, MAX_PAGE_BYTES)
    fd, real, info = conf.open_file(path)
    with os.fdopen(fd, "rb") as f:
        if as_base64:
            offset = p.int("offset", 0, 0, 1 << 62)
            limit = p.int("limit", max_bytes, 1, max_bytes)
            f.seek(offset)
            data = f.read(limit)
            end = offset + len(data)
            more = end < info.st_size
            return {
                "path": real,
                "encoding": "base64",
                "offset": offset,
                "size": info.st_size,
                "data": b64.b64encode(data).decode("ascii"),
                "truncated": more,
                "next_offset": end if more else None,
            }
        if b"\0" in f.read(8192):
            raise ProbeError("is_binary", f"{path} looks binary; ask with base64=true")
        f.seek(0)
        offset = max(p.int("offset", 1, 0, 1 << 62), 1)
        limit = p.int("limit", 2000, 1, 100000)
        reached = _skip_lines(f, offset - 1)
        lines: List[List[Any]] = []
        used = 0
        number = offset
        stopped_early = False
        while reached and len(lines) < limit:
            start = f.tell()
            raw = f.readline(max_bytes + 1)
            if not raw:
                break
            if len(raw) > max_bytes and not raw.endswith(b"\n"):
                if lines:  # an over-long line starts the next page
                    f.seek(start)
                    stopped_early = True
                    break
                f.readline()  # the rest of the over-long line is dropped, and said so
                text = raw[:max_bytes].decode("utf-8", "replace") + " [line cut]"
                lines.append([number, text])
                number += 1
                used = max_bytes  # the page is full
                continue
            if lines and used + len(raw) > max_bytes:
                f.seek(start)
                stopped_early = True
                break
            used += len(raw)
            lines.append([number, _strip_eol(raw).decode("utf-8", "replace")])
            number += 1
        rest_lines, more = _count_rest(f)
        total = (number - 1 + rest_lines) if reached else _count_all(f)
    return {
        "path": real,
        "encoding": "utf-8",
        "offset": offset,
        "limit": limit,
        "lines": lines,
        "total_lines": total,
        "size": info.st_size,
        "truncated": bool(more or stopped_early),
        "next_offset": number if more else None,
    }


def _strip_eol(raw: bytes) -> bytes:
    if raw.endswith(b"\n"):
        raw = raw[:-1]
    return raw[:-1] if raw.endswith(b"\r") else raw


def _skip_lines(f: Any, count: int) -> bool:
    """Move past `count` lines; False when the file has fewer lines than that."""
    remaining = count
    while remaining:
        chunk = f.read(1 << 20)
        if not chunk:
            return False
        found = chunk.count(b"\n")
        if found < remaining:
            remaining -= found
            continue
        at = -1
        for _ in range(remaining):
            at = chunk.index(b"\n", at + 1)
        f.seek(at + 1 - len(chunk), os.SEEK_CUR)
        return f.peek(1) != b"" if hasattr(f, "peek") else True
    return True


def _count_rest(f: Any) -> Tuple[int, bool]:
    """(lines from the current position to the end, whether anything is left)."""
    count = 0
    last = b""
    anything = False
    while True:
        chunk = f.read(1 << 20)
        if not chunk:
            break
        anything = True
        count += chunk.count(b"\n")
        last = chunk[-1:]
    if anything and last != b"\n":
        count += 1
    return count, anything


def _count_all(f: Any) -> int:
    f.seek(0)
    return _count_rest(f)[0]


# --- walking ------------------------------------------------------------------------------------
class Entry:
    __slots__ = ("rel", "name", "kind", "dir_fd", "size")

    def __init__(self, rel: str, name: str, kind: str, dir_fd: int, size: Optional[int]) -> None:
        self.rel, self.name, self.kind, self.dir_fd, self.size = rel, name, kind, dir_fd, size


def walk(
    top_fd: int,
    *,
    depth: int,
    gitignore: bool,
    hidden: bool,
    on_enter: Optional[Callable[[str], None]] = None,
) -> Iterator[Entry]:
    """Entries below an open directory, depth-first, sorted by name, links never followed.

    Each child directory is opened relative to its parent with O_NOFOLLOW, so a directory swapped
    for a link during the walk is not entered. ``.git`` is never listed.
    """
    seen = set()

    def visit(fd: int, rel: str, level: int, rules: ignore.IgnoreStack) -> Iterator[Entry]:
        info = os.fstat(fd)
        if (info.st_dev, info.st_ino) in seen:  # a bind-mount loop
            return
        seen.add((info.st_dev, info.st_ino))
        if on_enter is not None:
            on_enter(rel)
        if gitignore:
            rules = rules.push(rel, ignore.parse(_read_small(fd, ".gitignore")))
        try:
            children = sorted(os.scandir(fd), key=lambda e: e.name)
        except OSError:
            return
        for child in children:
            name = child.name
            if name == ".git" or (not hidden and name.startswith(".")):
                continue
            child_rel = f"{rel}/{name}" if rel else name
            try:
                if child.is_symlink():
                    kind, size = "symlink", None
                elif child.is_dir(follow_symlinks=False):
                    kind, size = "dir", None
                elif child.is_file(follow_symlinks=False):
                    kind, size = "file", child.stat(follow_symlinks=False).st_size
                else:
                    kind, size = "other", None
            except OSError:
                continue
            if gitignore and rules.ignored(child_rel, kind == "dir"):
                continue
            yield Entry(child_rel, name, kind, fd, size)
            if kind == "dir" and level < depth:
                try:
                    sub = os.open(name, DIR_FLAGS, dir_fd=fd)
                except OSError:
                    continue  # swapped for a link, removed, or unreadable
                try:
                    yield from visit(sub, child_rel, level + 1, rules)
                finally:
                    os.close(sub)

    yield from visit(top_fd, "", 1, ignore.IgnoreStack())


def _read_small(dir_fd: int, name: str, cap: int = 1 << 20) -> str:
    try:
        fd = os.open(name, FILE_FLAGS, dir_fd=dir_fd)
    except OSError:
        return ""
    with os.fdopen(fd, "rb") as f:
        if not st_mod.S_ISREG(os.fstat(f.fileno()).st_mode):
            return ""
        return f.read(cap).decode("utf-8", "replace")


def _link_info(conf: Confinement, dir_fd: int, name: str, dir_real: str) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    try:
        out["target"] = os.readlink(name, dir_fd=dir_fd)
    except OSError:
        return out
    try:
        target_stat = os.stat(name, dir_fd=dir_fd)
        out["target_type"] = "dir" if st_mod.S_ISDIR(target_stat.st_mode) else "file"
    except FileNotFoundError:
        out["broken"] = True
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            out["loop"] = True
        else:
            out["broken"] = True
    if "target_type" in out:
        out["outside"] = not conf.is_inside(os.path.realpath(os.path.join(dir_real, name)))
    return out


def op_read_tree(conf: Confinement, p: Params) -> Dict[str, Any]:
    path = p.str("path", ".")
    depth = p.int("depth", 3, 1, 50)
    max_entries = p.int("max_entries", 1000, 1, 20000)
    use_gitignore = p.bool("gitignore", True)
    fd, real = conf.open_dir(path)
    entries: List[Dict[str, Any]] = []
    truncated = False
    try:
        for entry in walk(fd, depth=depth, gitignore=use_gitignore, hidden=True):
            if len(entries) >= max_entries:
                truncated = True
                break
            item: Dict[str, Any] = {"path": entry.rel, "type": entry.kind}
            if entry.size is not None:
                item["size"] = entry.size
            if entry.kind == "symlink":
                parent_rel = entry.rel.rsplit("/", 1)[0] if "/" in entry.rel else ""
                item.update(_link_info(conf, entry.dir_fd, entry.name, os.path.join(real, parent_rel)))
            entries.append(item)
    finally:
        os.close(fd)
    return {"path": real, "depth": depth, "entries": entries, "count": len(entries), "truncated": truncated}


# --- grep ---------------------------------------------------------------------------------------
def ripgrep() -> Optional[str]:
    return shutil.which("rg")


def op_grep(conf: Confinement, p: Params) -> Dict[str, Any]:
    pattern = p.str("pattern")
    path = p.str("path", ".")
    glob = p.str("glob", None)
    ignore_case = p.bool("ignore_case", False)
    if "case_sensitive" in p.params:
        ignore_case = not p.bool("case_sensitive", True)
    max_results = p.int("max_results", 200, 1, 5000)
    engine = p.str("engine", "auto")
    timeout = p.number("timeout", 60, 1, 600)
    if engine not in ("auto", "rg", "python"):
        raise ProbeError("invalid_argument", "grep: engine must be auto, rg or python")
    if not pattern or "\0" in pattern:
        raise ProbeError("invalid_argument", "grep: pattern must be a non-empty string without NUL")
    if glob is not None and (not glob or "\0" in glob):
        raise ProbeError("invalid_argument", "grep: glob must be a non-empty string")
    rg = ripgrep() if engine in ("auto", "rg") else None
    if engine == "rg" and rg is None:
        raise ProbeError("unsupported", "ripgrep is not installed on this machine")
    real = conf.resolve(path)
    deadline = time.monotonic() + timeout
    if rg is not None:
        hits, truncated = _grep_rg(conf, rg, real, pattern, glob, ignore_case, max_results, deadline)
        used = "rg"
    else:
        hits, truncated = _grep_python(conf, real, pattern, glob, ignore_case, max_results, deadline)
        used = "python"
    matches = [{"path": hit_path, "line": line, "text": _cut(text)} for hit_path, line, text in hits]
    return {
        "path": real,
        "pattern": pattern,
        "engine": used,
        "matches": matches,
        "files": len({m["path"] for m in matches}),
        "truncated": truncated,
    }


def _cut(text: str) -> str:
    return text if len(text) <= MAX_LINE_CHARS else text[:MAX_LINE_CHARS] + " [line cut]"


def _grep_rg(
    conf: Confinement,
    rg: str,
    real: str,
    pattern: str,
    glob: Optional[str],
    ignore_case: bool,
    cap: int,
    deadline: float,
) -> Tuple[List[Tuple[str, int, str]], bool]:
    argv = [
        rg, "--json", "--no-config", "--sort", "path", "--no-ignore-dot", "--no-ignore-exclude",
        "--no-ignore-global", "--no-ignore-parent", "--no-require-git", "--max-filesize", "10M",
        "--glob", "!.git",
    ]  # fmt: skip
    if ignore_case:
        argv.append("--ignore-case")
    # rg's own --glob would overrule .gitignore; the glob is applied to its hits instead, exactly as
    # the Python engine applies it, so both engines answer alike.
    matcher = ignore.Glob(glob) if glob is not None else None
    cwd, target = (real, ".") if os.path.isdir(real) else os.path.split(real)
    before = _place(conf, cwd)
    argv += ["--regexp", pattern, "--", target]
    proc = subprocess.Popen(
        argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=_base_env(cwd)
    )
    errors: List[bytes] = []
    drain = threading.Thread(target=lambda: errors.append(proc.stderr.read(65536)), daemon=True)
    drain.start()
    hits: List[Tuple[str, int, str]] = []
    truncated = False
    timer = threading.Timer(max(deadline - time.monotonic(), 0.1), proc.kill)
    timer.start()
    try:
        for raw in proc.stdout:
            event = json.loads(raw)
            if event.get("type") != "match":
                continue
            data = event["data"]
            shown = _rg_text(data["path"])
            hit_path = os.path.normpath(os.path.join(cwd, shown))
            if not conf.is_inside(hit_path):  # rg never follows links; belt and braces
                continue
            if matcher is not None and target == "." and not matcher.admits(os.path.relpath(hit_path, cwd)):
                continue
            if len(hits) >= cap:
                truncated = True
                proc.kill()
                break
            hits.append(
                (hit_path, data["line_number"], _strip_eol(_rg_bytes(data["lines"])).decode("utf-8", "replace"))
            )
    finally:
        timer.cancel()
        proc.stdout.close()
        code = proc.wait()
        drain.join(5)
    _same_place(conf, cwd, before)
    if time.monotonic() > deadline and not truncated:
        raise ProbeError("timeout", "grep took too long; narrow the path or the pattern")
    if code == 2 and not hits:
        message = b"".join(errors).decode("utf-8", "replace")
        if "regex" in message.lower():
            raise ProbeError("invalid_argument", f"grep: bad pattern: {message.strip()[:500]}")
    return hits, truncated


def _place(conf: Confinement, directory: str) -> Tuple[int, int]:
    fd, _ = conf.open_dir(directory)
    try:
        info = os.fstat(fd)
    finally:
        os.close(fd)
    return info.st_dev, info.st_ino


def _same_place(conf: Confinement, directory: str, before: Tuple[int, int]) -> None:
    """rg walks by path: if the directory was swapped for a link meanwhile, its hits are not shown."""
    try:
        now = os.lstat(directory)
    except OSError:
        now = None
    if now is None or (now.st_dev, now.st_ino) != before or not st_mod.S_ISDIR(now.st_mode):
        raise ProbeError("outside_allowed_roots", "the path is outside the allowed directories (it changed)")


def _rg_text(value: Dict[str, str]) -> str:
    return _rg_bytes(value).decode("utf-8", "surrogateescape")


def _rg_bytes(value: Dict[str, str]) -> bytes:
    if "text" in value:
        return value["text"].encode("utf-8", "surrogateescape")
    return b64.b64decode(value.get("bytes", ""))


def _grep_python(
    conf: Confinement, real: str, pattern: str, glob: Optional[str], ignore_case: bool, cap: int, deadline: float
) -> Tuple[List[Tuple[str, int, str]], bool]:
    try:
        regex = re.compile(pattern, re.IGNORECASE if ignore_case else 0)
    except re.error as exc:
        raise ProbeError("invalid_argument", f"grep: bad pattern: {exc}") from None
    # A cheap whole-file test first; only files that may match are split into lines.
    prefilter = (
        None
        if ("\\A" in pattern or "\\Z" in pattern or "(?<" in pattern)
        else re.compile(pattern, (re.IGNORECASE if ignore_case else 0) | re.MULTILINE)
    )
    matcher = ignore.Glob(glob) if glob is not None else None
    hits: List[Tuple[str, int, str]] = []

    def search(fd: int, shown: str) -> bool:
        """Add the hits of one open file; True when the cap is passed."""
        with os.fdopen(fd, "rb") as f:
            info = os.fstat(f.fileno())
            if not st_mod.S_ISREG(info.st_mode) or info.st_size > GREP_MAX_FILESIZE:
                return False
            data = f.read()
        if b"\0" in data:
            return False
        text = data.decode("utf-8", "replace")
        if prefilter is not None and prefilter.search(text) is None:
            return False
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        for number, line in enumerate(lines, 1):
            line = line[:-1] if line.endswith("\r") else line
            if regex.search(line):
                if len(hits) >= cap:
                    return True
                hits.append((shown, number, line))
        return False

    if os.path.isfile(real):
        fd, opened, _ = conf.open_file(real)
        return hits, search(fd, opened)
    top, top_real = conf.open_dir(real)
    try:
        for entry in walk(top, depth=10000, gitignore=True, hidden=False):
            if time.monotonic() > deadline:
                raise ProbeError("timeout", "grep took too long; narrow the path or the pattern")
            if entry.kind != "file" or (entry.size or 0) > GREP_MAX_FILESIZE:
                continue
            if matcher is not None and not matcher.admits(entry.rel):
                continue
            try:
                fd = os.open(entry.name, FILE_FLAGS, dir_fd=entry.dir_fd)
            except OSError:
                continue
            if search(fd, os.path.join(top_real, entry.rel)):
                return hits, True
    finally:
        os.close(top)
    return hits, False


# --- stat ---------------------------------------------------------------------------------------
def op_stat(conf: Confinement, p: Params) -> Dict[str, Any]:
    path = p.str("path")
    try:
        parent, name = conf.resolve_parent(path)
        target = os.path.join(parent, name)
        info = os.lstat(target)
    except ProbeError as exc:
        if exc.code != "outside_allowed_roots":
            raise
        target = conf.resolve(path)  # a symlinked root itself: its parent lies outside, it does not
        info = os.lstat(target)
    except FileNotFoundError:
        raise ProbeError("not_found", f"no such file or directory: {path}") from None
    mode = info.st_mode
    kind = (
        "symlink"
        if st_mod.S_ISLNK(mode)
        else "dir"
        if st_mod.S_ISDIR(mode)
        else "file"
        if st_mod.S_ISREG(mode)
        else "other"
    )
    out: Dict[str, Any] = {
        "path": target,
        "type": kind,
        "size": info.st_size,
        "mode": oct(st_mod.S_IMODE(mode)),
        "mtime": info.st_mtime,
        "is_symlink": kind == "symlink",
    }
    if kind == "symlink":
        dir_fd = os.open(os.path.dirname(target), DIR_FLAGS)
        try:
            out.update(_link_info(conf, dir_fd, os.path.basename(target), os.path.dirname(target)))
        finally:
            os.close(dir_fd)
    return out


# --- git ----------------------------------------------------------------------------------------
GIT_CONFIG = [
    "-c", "core.hooksPath=/dev/null", "-c", "core.pager=cat", "-c", "core.fsmonitor=false",
    "-c", "core.untrackedCache=false", "-c", "diff.external=", "-c", "protocol.allow=never",
    "--no-pager",
]  # fmt: skip
REV = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./~^@{}:+-]*(\.\.\.?[A-Za-z0-9_][A-Za-z0-9_./~^@{}:+-]*)?")


def _base_env(cwd: str) -> Dict[str, str]:
    env = {
        "PATH": os.environ.get("PATH") or DEFAULT_PATH,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": cwd,
        "TERM": "dumb",
    }
    for name in ("USER", "LOGNAME", "TZ", "SYSTEMROOT"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env


def _git_env() -> Dict[str, str]:
    env = _base_env("/nonexistent")
    env.update(
        {
            "XDG_CONFIG_HOME": "/nonexistent",
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_ATTR_NOSYSTEM": "1",
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_OPTIONAL_LOCKS": "0",
            "GIT_PAGER": "cat",
            "PAGER": "cat",
        }
    )
    return env


def _git(real: str, args: List[str], max_bytes: int, timeout: float = 60) -> Tuple[bytes, bool]:
    git = shutil.which("git")
    if git is None:
        raise ProbeError("unsupported", "git is not installed on this machine")
    cwd = real if os.path.isdir(real) else os.path.dirname(real)
    result = _run_capped([git] + GIT_CONFIG + args, cwd, _git_env(), timeout, max_bytes)
    if result["timed_out"]:
        raise ProbeError("timeout", "git took too long")
    if result["exit_code"] != 0:
        message = result["stderr"].decode("utf-8", "replace").strip()
        raise ProbeError("git_failed", message[:2000] or f"git exited with {result['exit_code']}")
    return result["stdout"], result["truncated"]


def _rev(p: Params) -> Optional[str]:
    rev = p.str("rev", None)
    if rev is not None and (len(rev) > 200 or not REV.fullmatch(rev)):
        raise ProbeError("invalid_argument", f"{p.op}: rev must be a revision such as HEAD~2 or main..topic")
    return rev


def op_git_diff(conf: Confinement, p: Params) -> Dict[str, Any]:
    real = conf.resolve(p.str("path", "."))
    rev = _rev(p)
    staged = p.bool("staged")
    max_bytes = p.int("max_bytes", DEFAULT_PAGE_BYTES, 1, MAX_PAGE_BYTES)
    args = ["diff", "--no-ext-diff", "--no-textconv", "--no-color"]
    if staged:
        args.append("--cached")
    if rev:
        args.append(rev)
    out, truncated = _git(real, args + ["--", real], max_bytes)
    return {"path": real, "diff": out.decode("utf-8", "replace"), "truncated": truncated}


def op_git_log(conf: Confinement, p: Params) -> Dict[str, Any]:
    real = conf.resolve(p.str("path", "."))
    rev = _rev(p)
    limit = p.int("limit", 20, 1, 1000)
    offset = p.int("offset", 0, 0, 1 << 30)
    args = ["log", "--no-color", "--no-show-signature", f"--max-count={limit + 1}", f"--skip={offset}"]
    args.append("--format=%H%x1f%an%x1f%ae%x1f%aI%x1f%s%x1e")
    if rev:
        args.append(rev)
    out, _ = _git(real, args + ["--", real], MAX_PAGE_BYTES)
    commits = []
    for record in out.decode("utf-8", "replace").split("\x1e"):
        fields = record.strip("\n").split("\x1f")
        if len(fields) == 5:
            commits.append(dict(zip(("hash", "author", "email", "date", "subject"), fields)))  # noqa: B905 - 3.9
    return {"path": real, "commits": commits[:limit], "truncated": len(commits) > limit}


# --- ast_parse ----------------------------------------------------------------------------------
_JS_FUNC = (
    r"^\s*(?:export\s+)?(?:default\s+)?(?:async\s+)?function\s*\*?\s*([A-Za-z_$][\w$]*)"
    r"|^\s*(?:export\s+)?(?:const|let|var)\s+([A-Za-z_$][\w$]*)\s*=\s*(?:async\s+)?(?:\([^)]*\)|[A-Za-z_$][\w$]*)\s*=>"
)
_JAVA_MODIFIERS = r"(?:public|private|protected|static|final|abstract|synchronized|override|suspend|fun)"
OUTLINES = {
    # language: (extensions, function regex, class regex, import regex); best effort, line by line
    "javascript": (
        (".js", ".jsx", ".mjs", ".cjs", ".ts", ".tsx"),
        _JS_FUNC,
        r"^\s*(?:export\s+)?(?:default\s+)?(?:abstract\s+)?(?:class|interface)\s+([A-Za-z_$][\w$]*)",
        r"^\s*import\s.*?from\s+['\"]([^'\"]+)['\"]|^\s*import\s+['\"]([^'\"]+)['\"]"
        r"|require\(\s*['\"]([^'\"]+)['\"]\s*\)",
    ),
    "go": (
        (".go",),
        r"^func\s+(?:\([^)]*\)\s*)?([A-Za-z_]\w*)",
        r"^type\s+([A-Za-z_]\w*)\s+(?:struct|interface)",
        r'^\s*(?:import\s+)?(?:[A-Za-z_.]\w*\s+)?"([^"]+)"\s*$',
    ),
    "rust": (
        (".rs",),
        r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:async\s+)?(?:unsafe\s+)?fn\s+([A-Za-z_]\w*)",
        r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:struct|enum|trait)\s+([A-Za-z_]\w*)",
        r"^\s*(?:pub\s+)?use\s+([^;]+);",
    ),
    "java": (
        (".java", ".kt", ".cs"),
        r"^\s*(?:" + _JAVA_MODIFIERS + r"\s+)+[\w<>\[\], ?]*?\b([A-Za-z_]\w*)\s*\(",
        r"^\s*(?:(?:public|private|protected|static|final|abstract|sealed|data|open)\s+)*"
        r"(?:class|interface|enum|record|object)\s+([A-Za-z_]\w*)",
        r"^\s*(?:import|using)\s+([\w.*]+)",
    ),
}


def op_ast_parse(conf: Confinement, p: Params) -> Dict[str, Any]:
    path = p.str("path")
    fd, real, info = conf.open_file(path)
    with os.fdopen(fd, "rb") as f:
        if info.st_size > AST_MAX_BYTES:
            raise ProbeError("too_large", f"{path} is larger than {AST_MAX_BYTES} bytes")
        data = f.read(AST_MAX_BYTES + 1)
    if b"\0" in data:
        raise ProbeError("is_binary", f"{path} is binary")
    extension = os.path.splitext(real)[1].lower()
    if extension in (".py", ".pyi", ".pyw") or data.startswith(b"#!") and b"python" in data.split(b"\n", 1)[0]:
        return _python_outline(real, data)
    for language, (extensions, functions, classes, imports) in OUTLINES.items():
        if extension in extensions:
            return _regex_outline(real, language, data.decode("utf-8", "replace"), functions, classes, imports)
    what = extension or "files without an extension"
    raise ProbeError("unsupported", f"no outline for {what}; Python files are parsed fully")


def _python_outline(real: str, data: bytes) -> Dict[str, Any]:
    try:
        tree = ast.parse(data, filename=real)
    except (SyntaxError, ValueError) as exc:
        line = getattr(exc, "lineno", None)
        message = getattr(exc, "msg", str(exc))
        raise ProbeError("parse_error", f"{os.path.basename(real)}:{line}: {message}") from None
    functions: List[Dict[str, Any]] = []
    classes: List[Dict[str, Any]] = []
    imports: List[Dict[str, Any]] = []

    def visit(node: ast.AST, prefix: str, in_class: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                qualname = prefix + child.name
                functions.append(
                    {
                        "name": child.name,
                        "qualname": qualname,
                        "line": child.lineno,
                        "end_line": getattr(child, "end_lineno", None),
                        "kind": "method" if in_class else "function",
                        "async": isinstance(child, ast.AsyncFunctionDef),
                    }
                )
                visit(child, qualname + ".<locals>.", False)
            elif isinstance(child, ast.ClassDef):
                qualname = prefix + child.name
                classes.append(
                    {
                        "name": child.name,
                        "qualname": qualname,
                        "line": child.lineno,
                        "end_line": getattr(child, "end_lineno", None),
                        "bases": [_unparse(base) for base in child.bases],
                    }
                )
                visit(child, qualname + ".", True)
            elif isinstance(child, ast.Import):
                for alias in child.names:
                    imports.append({"module": alias.name, "names": [], "line": child.lineno})
            elif isinstance(child, ast.ImportFrom):
                module = "." * (child.level or 0) + (child.module or "")
                imports.append({"module": module, "names": [a.name for a in child.names], "line": child.lineno})
            else:
                visit(child, prefix, in_class)

    visit(tree, "", False)
    return {
        "path": real,
        "language": "python",
        "outline": "ast",
        "functions": functions,
        "classes": classes,
        "imports": imports,
    }


def _unparse(node: ast.AST) -> str:
    try:
        return ast.unparse(node)
    except Exception:  # noqa: BLE001 - a best-effort label only
        return type(node).__name__


def _regex_outline(real: str, language: str, text: str, functions: str, classes: str, imports: str) -> Dict[str, Any]:
    found: Dict[str, List[Dict[str, Any]]] = {"functions": [], "classes": [], "imports": []}
    patterns = {"functions": re.compile(functions), "classes": re.compile(classes), "imports": re.compile(imports)}
    for number, line in enumerate(text.split("\n"), 1):
        for key, regex in patterns.items():
            match = regex.search(line)
            if match:
                name = next((g for g in match.groups() if g), None)
                if not name:
                    continue
                if key == "imports":
                    found[key].append({"module": name.strip(), "names": [], "line": number})
                elif key == "functions":
                    kind = {"kind": "function", "async": "async" in line}
                    found[key].append({"name": name, "qualname": name, "line": number, "end_line": None, **kind})
                else:
                    found[key].append({"name": name, "qualname": name, "line": number, "end_line": None, "bases": []})
                break
    return {"path": real, "language": language, "outline": "regex", **found}


# --- write --------------------------------------------------------------------------------------
def op_write(conf: Confinement, p: Params) -> Dict[str, Any]:
    path = p.str("path")
    content = p.str("content", None)
    diff = p.str("diff", None)
    if (content is None) == (diff is None):
        raise ProbeError("invalid_argument", "write: give exactly one of content or diff")
    parent, name = conf.resolve_for_write(path)
    root = conf.root_of(os.path.join(parent, name))
    inside = os.path.relpath(os.path.join(parent, name), root).split(os.sep)
    if ".git" in inside:
        # Git's own config and hooks would run commands later; they are not the agent's to change.
        raise ProbeError("not_permitted", "the probe does not write inside .git directories")
    dir_fd = os.open(parent, DIR_FLAGS)
    try:
        conf.verify(dir_fd, parent)
        try:
            existing = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            existing = None
        if existing is not None:
            if st_mod.S_ISLNK(existing.st_mode):
                raise ProbeError("is_symlink", f"{path} is a symbolic link; write to the file it points to")
            if st_mod.S_ISDIR(existing.st_mode):
                raise ProbeError("is_a_directory", f"{path} is a directory")
            if not st_mod.S_ISREG(existing.st_mode):
                raise ProbeError("invalid_argument", f"{path} is not a regular file")
        if diff is not None:
            original = None
            if existing is not None:
                fd = os.open(name, FILE_FLAGS, dir_fd=dir_fd)
                with os.fdopen(fd, "rb") as f:
                    original = f.read(WRITE_MAX_BYTES + 1).decode("utf-8", "surrogateescape")
            content = udiff.apply(original, diff)
        data = content.encode("utf-8", "surrogateescape")
        if len(data) > WRITE_MAX_BYTES:
            raise ProbeError("too_large", f"write: more than {WRITE_MAX_BYTES} bytes")
        _replace(dir_fd, name, data, None if existing is None else st_mod.S_IMODE(existing.st_mode))
    finally:
        os.close(dir_fd)
    return {
        "path": os.path.join(parent, name),
        "bytes": len(data),
        "created": existing is None,
        "sha256": hashlib.sha256(data).hexdigest(),
    }


def _replace(dir_fd: int, name: str, data: bytes, mode: Optional[int]) -> None:
    """Write a temp file beside the target, fsync it, rename it over the target, fsync the directory."""
    temp = f".{name[:100]}.{secrets.token_hex(6)}.ai1net-tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o666, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(temp, dir_fd=dir_fd)
        except OSError:
            pass
        raise
    try:
        os.fsync(dir_fd)
    except OSError:
        pass  # some filesystems refuse fsync on directories


# --- run ----------------------------------------------------------------------------------------
def _kill_group(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _run_capped(argv: List[str], cwd: str, env: Dict[str, str], timeout: float, cap: int) -> Dict[str, Any]:
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True, close_fds=True,
        )  # fmt: skip
    except FileNotFoundError:
        raise ProbeError("not_found", f"command not found: {argv[0]}") from None
    except PermissionError:
        raise ProbeError("not_permitted", f"not executable: {argv[0]}") from None
    buffers = {"stdout": bytearray(), "stderr": bytearray()}
    cut = {"stdout": False, "stderr": False}

    def pump(stream: Any, key: str) -> None:
        for chunk in iter(lambda: stream.read1(65536), b""):
            room = cap - len(buffers[key])
            if room > 0:
                buffers[key] += chunk[:room]
            if len(chunk) > room:
                cut[key] = True  # keep draining so the child never blocks on a full pipe

    threads = [
        threading.Thread(target=pump, args=(proc.stdout, "stdout"), daemon=True),
        threading.Thread(target=pump, args=(proc.stderr, "stderr"), daemon=True),
    ]
    for thread in threads:
        thread.start()
    timed_out = False
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
    _kill_group(proc)  # children left behind would hold the pipes open
    proc.wait()
    for thread in threads:
        thread.join(5)
    return {
        "exit_code": proc.returncode,
        "stdout": bytes(buffers["stdout"]),
        "stderr": bytes(buffers["stderr"]),
        "timed_out": timed_out,
        "truncated": cut["stdout"] or cut["stderr"],
        "duration_ms": int((time.monotonic() - started) * 1000),
    }


def _cwd(conf: Confinement, p: Params) -> str:
    real = conf.resolve(p.str("cwd", "."))
    if not os.path.isdir(real):
        raise ProbeError("not_a_directory", f"{p.op}: cwd must be a directory")
    return real


def op_run(conf: Confinement, p: Params) -> Dict[str, Any]:
    argv = p.argv()
    cwd = _cwd(conf, p)
    timeout = p.number("timeout", 60, 0.1, 3600)
    cap = p.int("max_bytes", DEFAULT_PAGE_BYTES, 1, MAX_PAGE_BYTES // 2)
    result = _run_capped(argv, cwd, _base_env(cwd), timeout, cap)
    result["stdout"] = result["stdout"].decode("utf-8", "replace")
    result["stderr"] = result["stderr"].decode("utf-8", "replace")
    return {"argv": argv, "cwd": cwd, **result}


class Background:
    """A command started by run_background: its output lands in a ring buffer of RING_BYTES."""

    def __init__(self, argv: List[str], cwd: str) -> None:
        self.argv = argv
        self.cwd = cwd
        self.lock = threading.Lock()
        self.ring = bytearray()
        self.total = 0  # bytes ever produced; the ring holds the last len(ring) of them
        try:
            self.proc = subprocess.Popen(
                argv, cwd=cwd, env=_base_env(cwd), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
            )  # fmt: skip
        except FileNotFoundError:
            raise ProbeError("not_found", f"command not found: {argv[0]}") from None
        except PermissionError:
            raise ProbeError("not_permitted", f"not executable: {argv[0]}") from None
        self.reader = threading.Thread(target=self._pump, daemon=True)
        self.reader.start()

    def _pump(self) -> None:
        for chunk in iter(lambda: self.proc.stdout.read1(65536), b""):
            with self.lock:
                self.ring += chunk
                self.total += len(chunk)
                if len(self.ring) > RING_BYTES:
                    del self.ring[: len(self.ring) - RING_BYTES]

    def output(self, offset: int, cap: int) -> Dict[str, Any]:
        with self.lock:
            first = self.total - len(self.ring)
            start = max(offset, first)
            chunk = bytes(self.ring[start - first : start - first + cap])
            return {
                "output": chunk.decode("utf-8", "replace"),
                "offset": start,
                "next_offset": start + len(chunk),
                "dropped": start - offset if offset < first else 0,
            }

    def stop(self) -> None:
        if self.proc.poll() is None:
            _kill_group(self.proc, signal.SIGTERM)
            try:
                self.proc.wait(3)
            except subprocess.TimeoutExpired:
                pass
        _kill_group(self.proc)
        self.proc.wait()
        self.reader.join(2)


# --- the probe ----------------------------------------------------------------------------------
class Probe:
    """The allow-list, the modes and the background commands of one probe run."""

    def __init__(self, roots: List[str], *, write: bool = False, exec_: bool = False, version: str = VERSION) -> None:
        self.confinement = Confinement(roots)
        self.write = write
        self.exec = exec_
        self.version = version
        self.background: Dict[str, Background] = {}
        self.lock = threading.Lock()

    @property
    def ops(self) -> List[str]:
        """The ops this run serves (what ``hello`` announces as capabilities)."""
        return [op for op in OPS if self._allowed(op)]

    def _allowed(self, op: str) -> bool:
        mode = MODE_OF.get(op)
        return mode is None or (mode == "write" and self.write) or (mode == "exec" and self.exec)

    def call(self, op: str, params: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        if op.startswith("probe."):
            op = op[len("probe.") :]
        if op not in OPS:
            raise ProbeError("unsupported", f"unknown operation {op!r}; this probe knows {', '.join(OPS)}")
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise ProbeError("invalid_argument", "params must be an object")
        if not self._allowed(op):
            flag = "--write" if MODE_OF[op] == "write" else "--exec"
            raise ProbeError("not_permitted", f"{op} needs the probe to be started with {flag}")
        handler, allowed = HANDLERS[op]
        return handler(self, Params(op, params, allowed))

    def close(self) -> None:
        with self.lock:
            jobs = list(self.background.values())
            self.background.clear()
        for job in jobs:
            job.stop()

    # ops that need the probe's state, not just the confinement
    def op_ping(self, p: Params) -> Dict[str, Any]:
        return {"pong": True, "time": time.time()}

    def op_info(self, p: Params) -> Dict[str, Any]:
        return {
            "hostname": socket.gethostname(),
            "os": f"{platform.system()} {platform.release()}".strip(),
            "python": platform.python_version(),
            "version": self.version,
            "roots": list(self.confinement.roots),
            "modes": {"write": self.write, "exec": self.exec},
            "ops": self.ops,
            "ripgrep": ripgrep() is not None,
        }

    def op_run_background(self, p: Params) -> Dict[str, Any]:
        argv = p.argv()
        cwd = _cwd(self.confinement, p)
        with self.lock:
            running = [h for h, job in self.background.items() if job.proc.poll() is None]
            if len(running) >= MAX_BACKGROUND:
                raise ProbeError("too_many_processes", f"at most {MAX_BACKGROUND} background commands at once")
            for handle in [h for h in self.background if h not in running]:
                if len(self.background) < 2 * MAX_BACKGROUND:
                    break
                self.background.pop(handle).stop()  # forget the oldest finished commands
            job = Background(argv, cwd)
            handle = secrets.token_hex(8)
            self.background[handle] = job
        return {"handle": handle, "pid": job.proc.pid, "argv": argv, "cwd": cwd}

    def _job(self, p: Params) -> Tuple[str, Background]:
        handle = p.str("handle")
        with self.lock:
            job = self.background.get(handle)
        if job is None:
            raise ProbeError("unknown_handle", f"no background command {handle!r} in this run")
        return handle, job

    def op_run_output(self, p: Params) -> Dict[str, Any]:
        offset = p.int("offset", 0, 0, 1 << 62)
        cap = p.int("max_bytes", DEFAULT_PAGE_BYTES, 1, MAX_PAGE_BYTES)
        handle, job = self._job(p)
        code = job.proc.poll()
        if code is not None:
            job.reader.join(2)  # everything the command printed is in the ring before we answer
        return {"handle": handle, "running": code is None, "exit_code": code, **job.output(offset, cap)}

    def op_stop(self, p: Params) -> Dict[str, Any]:
        handle, job = self._job(p)
        job.stop()
        return {"handle": handle, "exit_code": job.proc.returncode, "running": False}


def _on_conf(fn: Callable[[Confinement, Params], Dict[str, Any]]) -> Callable[[Probe, Params], Dict[str, Any]]:
    return lambda probe, p: fn(probe.confinement, p)


HANDLERS: Dict[str, Tuple[Callable[[Probe, Params], Dict[str, Any]], Tuple[str, ...]]] = {
    "ping": (Probe.op_ping, ()),
    "info": (Probe.op_info, ()),
    "read": (_on_conf(op_read), ("path", "offset", "limit", "max_bytes", "base64")),
    "read_tree": (_on_conf(op_read_tree), ("path", "depth", "max_entries", "gitignore")),
    "grep": (
        _on_conf(op_grep),
        ("pattern", "path", "glob", "ignore_case", "case_sensitive", "max_results", "engine", "timeout"),
    ),
    "stat": (_on_conf(op_stat), ("path",)),
    "git_diff": (_on_conf(op_git_diff), ("path", "rev", "staged", "max_bytes")),
    "git_log": (_on_conf(op_git_log), ("path", "rev", "limit", "offset")),
    "ast_parse": (_on_conf(op_ast_parse), ("path",)),
    "write": (_on_conf(op_write), ("path", "content", "diff")),
    "run": (_on_conf(op_run), ("argv", "cwd", "timeout", "max_bytes")),
    "run_background": (Probe.op_run_background, ("argv", "cwd")),
    "run_output": (Probe.op_run_output, ("handle", "offset", "max_bytes")),
    "stop": (Probe.op_stop, ("handle",)),
}
assert set(HANDLERS) == set(OPS)
if sys.version_info < (3, 9):  # pragma: no cover - the probe promises 3.9+
    raise RuntimeError("the probe needs Python 3.9 or newer")
