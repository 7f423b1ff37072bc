"""The probe's operations: plain functions over a ``Confinement``, dispatched by ``Probe.call(op, params)``.

The platform sends them as JSON-RPC requests ``probe.<op>`` with ``params`` = the op's arguments.
Every op returns a JSON-able dict of a stable shape, or raises ``ProbeError(code, detail)``.
Unknown argument names are refused (``invalid_argument``), so a typo never passes silently.
Paths in results are real paths (symlinks resolved); relative paths are taken from the first root.
Nothing outside the allowed roots is ever looked at (see ``confine`` and README, "Probes for agents"):
a path argument that resolves outside is refused with ``outside_allowed_roots``, one message for all.
The families live in ``files`` (read, read_tree, stat, write), ``search`` (grep), ``git``, ``code``
(ast_parse) and ``run`` (run, run_background and their output).

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
    -> {path, depth, entries: [{path, type: file|dir|symlink|other, size?, target?, target_type?,
        broken?, loop?, outside?}], count, truncated}   (entry paths relative to `path`; links shown,
        never followed; a link that leaves the roots is {path, type: "symlink", outside: true} only)
grep {pattern, path=<first root>, glob?, ignore_case=false, max_results=200, engine=auto|rg|python}
    -> {path, pattern, engine, matches: [{path, line, text}], files, truncated}
       hidden files, .gitignore'd files (from `path` down), binary files (a NUL byte), links and
       files over 10 MiB are skipped; `glob` is a gitignore-style pattern on the path below `path`
       ("*.py", "src/**", "!*.md"). Hits are sorted by path, then line; both engines agree.
stat {path} -> {path, type, size, mode, mtime, is_symlink, target?, target_type?, broken?, loop?,
        outside: false?}   (the path's own lstat; a link that leaves the roots is refused)
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

import platform
import secrets
import socket
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..confine import Confinement
from ..errors import ProbeError
from .base import DEFAULT_PAGE_BYTES, MAX_PAGE_BYTES, Params
from .code import op_ast_parse
from .files import op_read, op_read_tree, op_stat, op_write
from .git import op_git_diff, op_git_log
from .run import MAX_BACKGROUND, RING_BYTES, Background, op_run
from .search import op_grep, ripgrep

__all__ = ["OPS", "RING_BYTES", "Params", "Probe", "ProbeError"]

VERSION = "0.1.0"
READ_OPS = ("ping", "info", "read", "read_tree", "grep", "stat", "git_diff", "git_log", "ast_parse")
OPS = READ_OPS + ("write", "run", "run_background", "run_output", "stop")
MODE_OF = {"write": "write", "run": "exec", "run_background": "exec", "run_output": "exec", "stop": "exec"}


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
        cwd = p.str("cwd", ".")
        with self.lock:
            running = [h for h, job in self.background.items() if job.proc.poll() is None]
            if len(running) >= MAX_BACKGROUND:
                raise ProbeError("too_many_processes", f"at most {MAX_BACKGROUND} background commands at once")
            for handle in [h for h in self.background if h not in running]:
                if len(self.background) < 2 * MAX_BACKGROUND:
                    break
                self.background.pop(handle).stop()  # forget the oldest finished commands
            job = Background(argv, self.confinement, cwd)
            handle = secrets.token_hex(8)
            self.background[handle] = job
        return {"handle": handle, "pid": job.proc.pid, "argv": argv, "cwd": job.cwd}

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
