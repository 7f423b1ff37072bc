"""A daphne process kept on the CPUs it is given (``AI1NET_CPU``), one core per process.

A daphne process runs Python on one core at a time (the GIL), but its threads (the event loop, the
database threads, the request threads) hand the GIL to each other on every database call. When the
kernel spreads them over two cores, each hand-over wakes a thread on the other core and moves the
interpreter's working set between the cores' caches. Measured on the 2-core bench machine
(``python -m bench.tunnel --quick --rows connects``, a reconnect storm): a tunnel connect, whose token read
and hello each go to a database thread, cost daphne 2.56-3.31 ms of CPU spread over both cores and 2.08-2.34
kept on one, while the bare echo consumer (no thread) cost the same either way. Unpinned, its process made
14-18 context switches per connect where the echo made 4-5 (bench/NOTES.md).

So, as servers of one interpreter per core are run, a deployment starts one daphne per core and gives each
its own: ``AI1NET_CPU=0 daphne ...``, ``AI1NET_CPU=1 daphne ...``. Unset (the default), the kernel places
the threads as it likes. The setting takes what ``taskset -c`` takes: ``1``, ``0,2``, ``0-3``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from django.core.exceptions import ImproperlyConfigured

MAX_CPU = 8191  # Linux numbers at most 8,192 CPUs (NR_CPUS); a larger number is a typo, not a machine


def parse_cpus(spec: str) -> frozenset[int]:
    """``"1"``, ``"0,2"``, ``"0-3"`` (and mixes of them) as a set of CPU numbers; ValueError otherwise."""
    cpus: set[int] = set()
    for part in spec.split(","):
        first, dash, last = part.strip().partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise ValueError(f"not a CPU number or range: {part.strip()!r}")
        low, high = int(first), int(last) if dash else int(first)
        if high < low:
            raise ValueError(f"a range runs upwards: {part.strip()!r}")
        if high > MAX_CPU:
            raise ValueError(f"no CPU is numbered above {MAX_CPU}: {part.strip()!r}")
        cpus.update(range(low, high + 1))
    return frozenset(cpus)


def cpus_from_env(environ: Mapping[str, str] = os.environ) -> frozenset[int] | None:
    """The CPUs ``AI1NET_CPU`` gives this process, checked against those it may use; None when unset."""
    spec = environ.get("AI1NET_CPU", "").strip()
    if not spec:
        return None
    if not hasattr(os, "sched_setaffinity"):
        raise ImproperlyConfigured(f"AI1NET_CPU={spec!r}: keeping a process on CPUs needs Linux; unset it here.")
    try:
        cpus = parse_cpus(spec)
    except ValueError as exc:
        raise ImproperlyConfigured(
            f"AI1NET_CPU={spec!r}: {exc}; write CPUs as taskset -c does: 1, 0,2 or 0-3.") from None
    allowed = os.sched_getaffinity(0)
    if not cpus <= allowed:
        raise ImproperlyConfigured(f"AI1NET_CPU={spec!r}: this process may use CPUs {_listed(allowed)} only.")
    return cpus


def pin_process(cpus: frozenset[int]) -> None:
    """Keep every thread of this process, and those it starts later (they inherit their starter's), on
    ``cpus``. Threads that exit meanwhile are skipped."""
    for task in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(task), cpus)
        except ProcessLookupError:
            continue


def _listed(cpus: set[int] | frozenset[int]) -> str:
    return ",".join(str(cpu) for cpu in sorted(cpus))
