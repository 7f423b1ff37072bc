"""The hot-path benchmarks of issue 10 (``python -m bench``; README, "Performance")."""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any


def stop_cleanly_on_sigterm() -> None:
    """End this benchmark on SIGTERM as on Ctrl-C: ``SystemExit`` runs its ``finally`` blocks, which stop the
    daphne processes, bridges and local services it started. Python's default (die at once) left them running,
    bound to their ports, after ``timeout`` or a cancelled job ended a benchmark (five worlds' processes were
    found here that way). A second SIGTERM while it cleans up is ignored, so the clean-up finishes."""
    signal.signal(signal.SIGTERM, _exit_on_signal)


def _exit_on_signal(signum: int, frame: Any) -> None:
    signal.signal(signum, signal.SIG_IGN)
    sys.exit(128 + signum)


def pinned() -> bool:
    """Whether the benchmarks give each daphne a core of its own (``daphne_env``): unless ``BENCH_PIN=0``."""
    return os.environ.get("BENCH_PIN") != "0"


def daphne_env(env: dict[str, str], index: int) -> dict[str, str]:
    """``env`` for the ``index``-th daphne process of a benchmark, on a core of its own as deployed (``AI1NET_CPU``,
    ai1net.cpu_affinity): 0, 1 ... over the CPUs this process may use; as it is when not ``pinned()``."""
    if not pinned():
        return env
    cpus = sorted(os.sched_getaffinity(0))
    return {**env, "AI1NET_CPU": str(cpus[index % len(cpus)])}


def cpu_times(pids: list[int]) -> tuple[float, float]:
    """CPU seconds of ``pids``: (user + system, system alone: their system calls and socket copies)."""
    user = system = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        user, system = user + int(fields[11]), system + int(fields[12])
    tick = os.sysconf("SC_CLK_TCK")
    return (user + system) / tick, system / tick


def cpu_seconds(pids: list[int]) -> float:
    return cpu_times(pids)[0]


def client_pyz(name: str = "ai1net-bridge") -> str:
    """A client's ``.pyz`` (``ai1net-bridge``, ``ai1net-probe``) built from the checkout for this benchmark run (what
    users run; never a stale ``static/downloads`` file), in a folder of its own removed when the run exits."""
    from clients.build import build

    out = tempfile.mkdtemp(prefix="ai1net-bench-pyz-")
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    (built,) = build(Path(out), names=(name,))
    return str(built)
