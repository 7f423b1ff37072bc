"""Times one hop from the event loop to a database thread and back: Channels' ``DatabaseSyncToAsync`` on a
``ThreadPoolExecutor`` (what the tunnel used) beside ``ai1net.db_threads.DatabaseThreads`` (what it uses).

    .venv/bin/python bench/db_hop.py [--hops 20000] [--rounds 3]

The function is trivial, so what is timed is the hop: wall time and this process's CPU per hop, one call
at a time and with 50 in flight (a reconnect storm's handshakes), rounds alternating between the two.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ai1net.settings")

import django  # noqa: E402

django.setup()

from channels.db import DatabaseSyncToAsync  # noqa: E402

from ai1net.db_threads import DatabaseThreads  # noqa: E402

IN_FLIGHT = 50


def work(value: int) -> int:
    return value + 1


async def timed(hop, hops: int, at_once: int) -> tuple[float, float]:
    """(wall µs, CPU µs) per hop."""
    started, cpu = time.perf_counter(), time.process_time()
    for first in range(0, hops, at_once):
        await asyncio.gather(*(hop(i) for i in range(first, min(first + at_once, hops))))
    return (time.perf_counter() - started) / hops * 1e6, (time.process_time() - cpu) / hops * 1e6


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hops", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    channels_hop = DatabaseSyncToAsync(work, thread_sensitive=False, executor=ThreadPoolExecutor(max_workers=1))
    threads = DatabaseThreads(1, "bench-db")
    hops = {"channels DatabaseSyncToAsync": channels_hop, "ai1net DatabaseThreads": lambda i: threads.call(work, i)}
    print(f"{'hop':32} {'in flight':>9} {'wall µs':>9} {'CPU µs':>9}")
    for _ in range(args.rounds):
        for at_once in (1, IN_FLIGHT):
            for name, hop in hops.items():
                wall, cpu = await timed(hop, args.hops, at_once)
                print(f"{name:32} {at_once:9d} {wall:9.1f} {cpu:9.1f}")


if __name__ == "__main__":
    asyncio.run(main())
