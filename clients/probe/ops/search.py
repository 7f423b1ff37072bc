"""grep, with ripgrep when it is installed and a pure-Python engine otherwise; both answer alike.

Confinement: the Python engine reads only through the descriptor walk (links are skipped, never
followed). ripgrep walks by path, so it is boxed in three ways: it never gets ``--follow``; it starts
in the directory (or reads the file) the probe opened and checked, through that descriptor; and every
hit it reports is read again through the confinement before it is shown; a hit that cannot be
confirmed there (a file swapped for a link while rg ran, say) is dropped.
"""

from __future__ import annotations

import base64 as b64
import json
import os
import re
import shutil
import stat as st_mod
import subprocess
import threading
import time
from typing import Dict, List, Optional, Tuple

from .. import ignore
from ..confine import FILE_FLAGS, PROC_FD, Confinement, outside
from ..errors import ProbeError
from .base import Params, base_env, strip_eol
from .files import walk

MAX_LINE_CHARS = 500  # grep hit lines are cut here
GREP_MAX_FILESIZE = 10 * 1024 * 1024
Hit = Tuple[str, int, str]


def ripgrep() -> Optional[str]:
    return shutil.which("rg")


def op_grep(conf: Confinement, p: Params) -> Dict[str, object]:
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
    real, info = conf.existing(path)
    is_dir = st_mod.S_ISDIR(info.st_mode)
    deadline = time.monotonic() + timeout
    if rg is not None:
        hits, truncated = _grep_rg(conf, rg, path, is_dir, pattern, glob, ignore_case, max_results, deadline)
        used = "rg"
    else:
        hits, truncated = _grep_python(conf, path, is_dir, pattern, glob, ignore_case, max_results, deadline)
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


# --- ripgrep ------------------------------------------------------------------------------------
def _grep_rg(
    conf: Confinement,
    rg: str,
    path: str,
    is_dir: bool,
    pattern: str,
    glob: Optional[str],
    ignore_case: bool,
    cap: int,
    deadline: float,
) -> Tuple[List[Hit], bool]:
    argv = [
        rg, "--json", "--no-config", "--sort", "path", "--no-ignore-dot", "--no-ignore-exclude",
        "--no-ignore-global", "--no-ignore-parent", "--no-require-git", "--max-filesize", "10M",
        "--glob", "!.git", "--encoding", "none",
    ]  # fmt: skip
    if ignore_case:
        argv.append("--ignore-case")
    # rg's own --glob would overrule .gitignore; the glob is applied to its hits instead, exactly as
    # the Python engine applies it, so both engines answer alike.
    matcher = ignore.Glob(glob) if glob is not None and is_dir else None
    directory = path if is_dir else os.path.dirname(conf.resolve(path))
    with conf.child_cwd(directory) as (cwd_real, cwd, pass_fds):
        file_fd = None
        if is_dir:
            target, shown_as = ".", cwd_real
        else:
            file_fd, file_real, _ = conf.open_file(path)
            pinned = os.path.isdir(PROC_FD)
            target = f"{PROC_FD}/{file_fd}" if pinned else os.path.basename(file_real)
            pass_fds = pass_fds + (file_fd,) if pinned else pass_fds
            shown_as = file_real
        try:
            proc = subprocess.Popen(
                argv + ["--regexp", pattern, "--", target], cwd=cwd, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=base_env(cwd_real), pass_fds=pass_fds,
            )  # fmt: skip
        finally:
            if file_fd is not None:
                os.close(file_fd)
        hits, truncated, code, message = _read_rg(proc, conf, cwd_real, shown_as, is_dir, matcher, cap, deadline)
        if is_dir:
            _same_place(conf, directory, cwd)
    if time.monotonic() > deadline and not truncated:
        raise ProbeError("timeout", "grep took too long; narrow the path or the pattern")
    if code == 2 and not hits and "regex" in message.lower():
        raise ProbeError("invalid_argument", f"grep: bad pattern: {message.strip()[:500]}")
    return hits, truncated


def _read_rg(
    proc: subprocess.Popen,
    conf: Confinement,
    cwd_real: str,
    shown_as: str,
    is_dir: bool,
    matcher: Optional[ignore.Glob],
    cap: int,
    deadline: float,
) -> Tuple[List[Hit], bool, int, str]:
    errors: List[bytes] = []
    drain = threading.Thread(target=lambda: errors.append(proc.stderr.read(65536)), daemon=True)
    drain.start()
    hits: List[Hit] = []
    truncated = False
    confirm = _Confirm(conf)
    timer = threading.Timer(max(deadline - time.monotonic(), 0.1), proc.kill)
    timer.start()
    try:
        for raw in proc.stdout:
            event = json.loads(raw)
            if event.get("type") != "match":
                continue
            data = event["data"]
            hit_path = os.path.normpath(os.path.join(cwd_real, _rg_text(data["path"]))) if is_dir else shown_as
            if not conf.is_inside(hit_path):
                continue
            if matcher is not None and not matcher.admits(os.path.relpath(hit_path, cwd_real)):
                continue
            line = strip_eol(_rg_bytes(data["lines"]))
            if not confirm.line(hit_path, data["line_number"], line):
                continue  # rg saw something the confinement does not show: never pass it on
            if len(hits) >= cap:
                truncated = True
                proc.kill()
                break
            hits.append((hit_path, data["line_number"], line.decode("utf-8", "replace")))
    finally:
        timer.cancel()
        proc.stdout.close()
        code = proc.wait()
        drain.join(5)
    return hits, truncated, code, b"".join(errors).decode("utf-8", "replace")


class _Confirm:
    """Reads a hit's file again through the confinement and says whether the hit's line is there."""

    def __init__(self, conf: Confinement) -> None:
        self.conf = conf
        self.path: Optional[str] = None
        self.lines: List[bytes] = []

    def line(self, path: str, number: int, text: bytes) -> bool:
        if path != self.path:
            self.path, self.lines = path, self._lines(path)
        return 0 < number <= len(self.lines) and strip_eol(self.lines[number - 1]) == text

    def _lines(self, path: str) -> List[bytes]:
        try:
            fd, _, info = self.conf.open_file(path)
        except ProbeError:
            return []
        with os.fdopen(fd, "rb") as f:
            if info.st_size > GREP_MAX_FILESIZE:
                return []
            data = f.read(GREP_MAX_FILESIZE + 1)
        return [] if b"\0" in data else data.split(b"\n")


def _same_place(conf: Confinement, directory: str, cwd: str) -> None:
    """The directory searched must still be the one its path names: if it was swapped meanwhile
    (rg reports paths, and they would now name something else), nothing is shown."""
    try:
        fd, _ = conf.open_dir(directory)
    except ProbeError:
        raise outside() from None
    try:
        now = os.fstat(fd)
    finally:
        os.close(fd)
    searched = os.stat(cwd)
    if (now.st_dev, now.st_ino) != (searched.st_dev, searched.st_ino):
        raise outside()


def _rg_text(value: Dict[str, str]) -> str:
    return _rg_bytes(value).decode("utf-8", "surrogateescape")


def _rg_bytes(value: Dict[str, str]) -> bytes:
    if "text" in value:
        return value["text"].encode("utf-8", "surrogateescape")
    return b64.b64decode(value.get("bytes", ""))


# --- pure Python --------------------------------------------------------------------------------
def _grep_python(
    conf: Confinement,
    path: str,
    is_dir: bool,
    pattern: str,
    glob: Optional[str],
    ignore_case: bool,
    cap: int,
    deadline: float,
) -> Tuple[List[Hit], bool]:
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
    hits: List[Hit] = []

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

    if not is_dir:
        fd, opened, _ = conf.open_file(path)
        return hits, search(fd, opened)
    top, top_real = conf.open_dir(path)
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
