"""One loopback TCP connection's bulk rate and CPU, with the system's congestion control and with the one the
platform gives its loopback connections (clients.common.loopback), side by side in one process.

    .venv/bin/python -m bench.loopback_tcp                  # 3 rounds of 2 GiB each way
    .venv/bin/python -m bench.loopback_tcp --gib 1 --rounds 5 --algorithms bbr,reno,cubic

A thread receives into one buffer while the main thread sends 1 MiB at a time; printed per round and
algorithm: MiB/s and the process's CPU (both ends, user + system) per MiB. The algorithm is set on both
sockets before they connect. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import resource
import socket
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clients.common import loopback  # noqa: E402

CHUNK = 1 << 20


def _with(algorithm: str, sock: socket.socket) -> socket.socket:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, algorithm.encode())
    return sock


def transfer(algorithm: str, total: int) -> tuple[float, float]:
    """(MiB/s, ms of CPU per MiB) of ``total`` bytes over one loopback connection using ``algorithm``."""
    with _with(algorithm, socket.socket()) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)

        def receive() -> None:
            conn, _ = server.accept()
            with conn:
                view = memoryview(bytearray(CHUNK))
                while conn.recv_into(view):
                    pass

        receiver = threading.Thread(target=receive)
        receiver.start()
        data = b"x" * CHUNK
        before, started = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        with _with(algorithm, socket.socket()) as sender:
            sender.connect(server.getsockname())
            for _ in range(total // CHUNK):
                sender.sendall(data)
        receiver.join()
        seconds, after = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    mib = total / CHUNK
    return mib / seconds, cpu * 1000 / mib


def main() -> None:
    system = loopback.system_algorithm()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=2.0, help="GiB per transfer")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--algorithms", default=",".join(dict.fromkeys([system, loopback.DEFAULT_ALGORITHM])),
                        help="comma-separated (default: the system's and the platform's for loopback)")
    args = parser.parse_args()
    total = int(args.gib * (1 << 30)) // CHUNK * CHUNK
    print(f"system default: {system}; the platform's loopback connections: {loopback.algorithm() or 'the system default'}")
    for round_ in range(1, args.rounds + 1):
        for algorithm in args.algorithms.split(","):
            rate, cpu = transfer(algorithm, total)
            print(f"round {round_}  {algorithm:6} {rate:8.0f} MiB/s  {cpu:.3f} ms of CPU per MiB")


if __name__ == "__main__":
    main()
