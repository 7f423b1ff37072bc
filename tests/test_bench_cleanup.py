"""A benchmark ended by SIGTERM (``timeout``, a cancelled job) stops every process it started (bench.__init__)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_a_terminated_benchmark_stops_the_world_it_started():
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    bench = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "deviceweb.py"), "--config", "embedded", "--runs", "1", "--small", "4",
         "--ws-samples", "6", "--mb", "1", "--hold"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 180
        for line in bench.stdout:
            if line.startswith("holding ("):  # daphne=..., the local service, the bridge, the bare relay
                pids = [int(pid) for pid in re.findall(r"=(\d+)", line.split(";")[0])]
                break
            assert time.monotonic() < deadline, "the benchmark's world did not come up"
        assert len(pids) >= 4 and all(_alive(pid) for pid in pids), pids
        bench.send_signal(signal.SIGTERM)
        bench.wait(60)
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [pid for pid in pids if _alive(pid)] == []
    finally:
        bench.kill()
        bench.wait()
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
