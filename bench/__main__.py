"""Run the hot-path benchmarks of issue 10 and print one table, each row beside its bare baseline.

    .venv/bin/python -m bench all            # every benchmark, both configurations (make bench)
    .venv/bin/python -m bench all --quick    # fewer samples: under 3 minutes on 2 cores (make bench-quick)
    .venv/bin/python -m bench roundtrip      # one of them: roundtrip, tunnel, deviceweb

Each benchmark is its own script (bench/<name>.py) that starts its own processes and databases: the
embedded default (SQLite, in-memory layer, one daphne) and the scaled-out one (PostgreSQL + Redis,
two daphne processes). They run one after another, so no two compete for the two cores; their own
output goes to the terminal as they run, and the table comes last (Markdown, as README quotes it).
Each daphne runs on a core of its own, as deployed (``AI1NET_CPU``, ai1net.cpu_affinity; ``BENCH_PIN=0``
leaves them unpinned, ``bench.daphne_env``); the heading says which.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import pinned, stop_cleanly_on_sigterm
from bench.report import load, table

ROOT = Path(__file__).resolve().parent.parent
SCALED = {"DATABASE_URL": "postgres://postgres@127.0.0.1:5432/test", "REDIS_URL": "redis://127.0.0.1:6379/0"}
# name -> its runs: (arguments, environment) each; every script starts its own daphne processes and
# makes its own database (a fresh one beside DATABASE_URL's on PostgreSQL, dropped at the end)
BENCHES: dict[str, list[tuple[list[str], dict[str, str]]]] = {
    "roundtrip": [(["--config", "both"], {})],
    "tunnel": [([], {}), ([], SCALED)],
    "deviceweb": [(["--config", "both"], {})],
}


# Run as module-level code (names in a dict, as `python -c` runs it, which is how bench/NOTES.md has timed it
# by hand): inside a function the same loop takes about a third of the time.
_ADDITIONS = compile("total = 0\nfor i in range(3_000_000):\n    total += i\n", "<additions>", "exec")


def additions_ms(rounds: int = 3) -> float:
    """The machine's speed on the day, printed beside the table: a loop of 3 million additions, the best of
    ``rounds``, in ms. README quotes 217-250 ms on usual days and 500-720 on the slowest; the rows
    measured in milliseconds (the hook's legs, server time) move with it, the ratios less."""
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        exec(_ADDITIONS, {})  # noqa: S102 - a constant loop, compiled above
        best = min(best, time.perf_counter() - started)
    return best * 1000


def run_bench(argv: list[str], env: dict[str, str]) -> int:
    """One benchmark's exit code. Ended by SIGTERM (``stop_cleanly_on_sigterm``), the runner passes it on and
    waits while the benchmark stops what it started (subprocess.run would kill it outright: nothing stopped);
    Ctrl-C reaches the benchmark by itself (the terminal's process group)."""
    proc = subprocess.Popen(argv, cwd=ROOT, env=env)
    try:
        return proc.wait()
    except SystemExit:
        proc.terminate()
        raise
    finally:
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("which", choices=["all", *BENCHES], help="all, or one benchmark")
    parser.add_argument("--quick", action="store_true", help="fewer samples (the whole run under 3 minutes)")
    parser.add_argument("--json", help="also keep the rows in this file (JSON)")
    args = parser.parse_args(argv)
    stop_cleanly_on_sigterm()

    names = list(BENCHES) if args.which == "all" else [args.which]
    speed_before = additions_ms()
    with tempfile.TemporaryDirectory(prefix="ai1net-bench-") as tmp:
        rows_file = Path(args.json or Path(tmp) / "rows.json")
        rows_file.write_text("[]")
        started, failed = time.monotonic(), []
        base_env = {k: v for k, v in os.environ.items() if k not in SCALED}
        for name in names:
            for bench_args, bench_env in BENCHES[name]:
                argv_bench = [sys.executable, str(ROOT / "bench" / f"{name}.py"), *bench_args, "--json", str(rows_file)]
                if args.quick:
                    argv_bench.append("--quick")
                shown = " ".join([*(f"{k}={v}" for k, v in bench_env.items()), *argv_bench[1:]])
                print(f"\n##### {name}: {shown}", flush=True)
                begun = time.monotonic()
                if run_bench(argv_bench, {**base_env, **bench_env}) != 0:
                    failed.append(name)
                print(f"##### {name}: {time.monotonic() - begun:.0f} s", flush=True)
        rows = load(rows_file)
        took = time.monotonic() - started
        cores = "each daphne on a core of its own (AI1NET_CPU)" if pinned() else "unpinned"
        print(f"\n## Hot paths ({'quick' if args.quick else 'full'} run, {took:.0f} s, {cores}; a loop of 3 million "
              f"additions in Python took {speed_before:.0f} ms before and {additions_ms():.0f} ms after)\n")
        print(table(rows))
        if failed:
            print(f"\nfailed: {', '.join(failed)} (see their output above)")
    return 1 if failed or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
