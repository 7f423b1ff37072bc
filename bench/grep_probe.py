"""Times the probe's grep over a generated tree: the Python engine, the probe's rg engine and bare rg.

    .venv/bin/python bench/grep_probe.py [--files 20000] [--runs 3]

Prints the median of each; all three must find the same hits.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clients.probe.ops import Probe  # noqa: E402


def make_tree(root: Path, count: int) -> None:
    for i in range(count):
        folder = root / f"d{i // 200:03d}"
        if i % 200 == 0:
            folder.mkdir(parents=True)
        body = "".join(f"def function_{i}_{n}(value):\n    return value * {n}\n" for n in range(10))
        if i % 1000 == 7:
            body += f"# NEEDLE {i}\n"
        (folder / f"f{i:05d}.py").write_text(body)


def timed(fn, runs: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(runs):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--pattern", default="NEEDLE")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make_tree(root, args.files)
        size = sum(p.stat().st_size for p in root.rglob("*.py"))
        probe = Probe([str(root)])
        print(f"tree: {args.files} files, {size / 2**20:.1f} MiB; pattern {args.pattern!r}; median of {args.runs}")
        py_time, py = timed(lambda: probe.call("grep", {"pattern": args.pattern, "engine": "python"}), args.runs)
        print(f"probe grep, Python engine : {py_time:.3f} s  ({len(py['matches'])} hits)")
        rg = shutil.which("rg")
        if rg is None:
            print("ripgrep is not installed: no comparison")
            return
        rg_time, via = timed(lambda: probe.call("grep", {"pattern": args.pattern, "engine": "rg"}), args.runs)
        print(f"probe grep, rg engine     : {rg_time:.3f} s  ({len(via['matches'])} hits)")
        bare_time, bare = timed(
            lambda: subprocess.run([rg, "--no-config", "-n", args.pattern, str(root)], capture_output=True), args.runs
        )
        print(f"bare rg (threads, unsorted): {bare_time:.3f} s  ({len(bare.stdout.splitlines())} hits)")
        print(f"ratio Python / probe rg: {py_time / rg_time:.2f}; Python / bare rg: {py_time / bare_time:.2f}")
        assert py["matches"] == via["matches"], "the engines disagree"


if __name__ == "__main__":
    main()
