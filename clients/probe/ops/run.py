"""run and run_background: a command (after the user's approval) in a checked directory.

Confinement covers where a command starts, not what it does: its cwd is opened and checked like any
other path and handed to it by descriptor (``Confinement.child_cwd``); the command itself, once the
user approved it, can read whatever its user can.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from typing import Any, Dict, List, Tuple

from ..confine import Confinement
from ..errors import ProbeError
from .base import DEFAULT_PAGE_BYTES, MAX_PAGE_BYTES, Params, base_env

RING_BYTES = 1024 * 1024
MAX_BACKGROUND = 16


def _kill_group(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def run_capped(
    argv: List[str], cwd: str, env: Dict[str, str], timeout: float, cap: int, pass_fds: Tuple[int, ...] = ()
) -> Dict[str, Any]:
    """Run to the end or the timeout (then kill its whole process group); keep at most ``cap`` bytes
    of stdout and of stderr."""
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True, close_fds=True, pass_fds=pass_fds,
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


def op_run(conf: Confinement, p: Params) -> Dict[str, Any]:
    argv = p.argv()
    timeout = p.number("timeout", 60, 0.1, 3600)
    cap = p.int("max_bytes", DEFAULT_PAGE_BYTES, 1, MAX_PAGE_BYTES // 2)
    with conf.child_cwd(p.str("cwd", ".")) as (real, cwd, pass_fds):
        result = run_capped(argv, cwd, base_env(real), timeout, cap, pass_fds)
    result["stdout"] = result["stdout"].decode("utf-8", "replace")
    result["stderr"] = result["stderr"].decode("utf-8", "replace")
    return {"argv": argv, "cwd": real, **result}


class Background:
    """A command started by run_background: its output lands in a ring buffer of RING_BYTES."""

    def __init__(self, argv: List[str], conf: Confinement, cwd: str) -> None:
        self.argv = argv
        self.lock = threading.Lock()
        self.ring = bytearray()
        self.total = 0  # bytes ever produced; the ring holds the last len(ring) of them
        try:
            with conf.child_cwd(cwd) as (self.cwd, child_cwd, pass_fds):
                self.proc = subprocess.Popen(
                    argv, cwd=child_cwd, env=base_env(self.cwd), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT, start_new_session=True, close_fds=True, pass_fds=pass_fds,
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
