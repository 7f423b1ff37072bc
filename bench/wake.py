"""What a hop between processes costs on this machine when the processes have been idle: the floor under the
latency rows (first byte, deliver -> ack), measured with nothing but sockets.

    .venv/bin/python -m bench.wake              # under a minute
    .venv/bin/python -m bench.wake --quick      # about 20 s

Two parts, each with loopback TCP connections as the product's hops are made (Nagle off, standard library only):

- **One round trip between two processes** (a 1-byte ping and its answer), after the sender has slept 0, 1, 10
  or 50 ms, with the two processes on the same core, on different cores, and placed by the kernel. On a
  virtual machine whose idle cores halt, a wake-up on another core is an interrupt between virtual CPUs, and
  its cost grows with the time the core has been idle.
- **A request through a chain of processes**, each of which only passes the bytes on (no parsing, no Python
  work beyond ``recv`` and ``send``), placed by the kernel, after 50 ms of idle: the direct path (client ->
  service, 2 processes) beside the device-web path's four (client -> daphne -> bridge -> service). Its ratio
  is what the hops alone cost, before any work of the platform's: a floor for the "first byte vs direct" rows.
- **The same Python work warm and after idle**: a fixed piece of work (JSON, dicts, calls: about 0.2 ms warm)
  timed back to back and after 50 ms of sleep. A request after idle runs each process's part with cold caches;
  the bench's first byte is such a request (each path idles while the others download).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import time
from collections.abc import Callable

from bench import stop_cleanly_on_sigterm

GAPS_MS = (0.0, 1.0, 10.0, 50.0)


_OPEN: list[socket.socket] = []  # this process's ends; a child closes those it does not use


def _pair() -> tuple[socket.socket, socket.socket]:
    """Two ends of a loopback TCP connection, Nagle off (as daphne's and the bridge's are)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
    for end in (client, accepted):
        end.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    _OPEN.extend((client, accepted))
    return client, accepted


def _close(ends: list[socket.socket]) -> None:
    for end in ends:
        end.close()
        _OPEN.remove(end)


def _child(run: Callable[[], None], cpus: set[int] | None, uses: list[socket.socket]) -> int:
    """Fork a process that runs ``run`` (on ``cpus``, or where the kernel puts it) with the sockets ``uses`` and exits.
    Each process holds only its own ends, so when this one ends (or is stopped) the chain sees it close and ends."""
    pid = os.fork()
    if pid:
        _close(uses)
        return pid
    try:
        _close([end for end in _OPEN if end not in uses])
        if cpus is not None:
            os.sched_setaffinity(0, cpus)
        run()
    finally:
        os._exit(0)


def _relay(inbound: socket.socket, outbound: socket.socket) -> None:
    """Pass each message on and each answer back, until the inbound side closes."""
    while data := inbound.recv(65536):
        outbound.sendall(data)
        inbound.sendall(outbound.recv(65536))


def _echo(end: socket.socket) -> None:
    while data := end.recv(65536):
        end.sendall(data)


def _timed(end: socket.socket, gap_ms: float, samples: int) -> list[float]:
    """Round trips in microseconds, each after ``gap_ms`` of sleep."""
    times = []
    for _ in range(samples):
        if gap_ms:
            time.sleep(gap_ms / 1000)
        started = time.perf_counter()
        end.sendall(b"x")
        end.recv(16)
        times.append((time.perf_counter() - started) * 1e6)
    return times


def round_trip(gap_ms: float, here: set[int] | None, there: set[int] | None, samples: int) -> list[float]:
    """A ping between this process (on ``here``) and an echoing child (on ``there``)."""
    mine, theirs = _pair()
    allowed = os.sched_getaffinity(0)
    pid = _child(lambda: _echo(theirs), there, [theirs])
    try:
        if here is not None:
            os.sched_setaffinity(0, here)
        _timed(mine, 0, 20)
        return _timed(mine, gap_ms, samples)
    finally:
        os.sched_setaffinity(0, allowed)
        _close([mine])
        _end([pid])


def chain(relays: int, gap_ms: float, samples: int) -> list[float]:
    """A request from this process through ``relays`` relaying processes to an echoing one, and back."""
    first, last = _pair()
    pids = []
    inbound = last
    for _ in range(relays):
        out, nxt = _pair()
        pids.append(_child(lambda i=inbound, o=out: _relay(i, o), None, [inbound, out]))
        inbound = nxt
    pids.append(_child(lambda i=inbound: _echo(i), None, [inbound]))
    try:
        _timed(first, 0, 20)
        return _timed(first, gap_ms, samples)
    finally:
        _close([first])
        _end(pids)


def _end(pids: list[int]) -> None:
    """Stop the children now, not when each has seen its neighbour close."""
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def _work() -> None:
    """A fixed piece of interpreter work, of the kinds a request's handling is made of."""
    message = {"method": "web.open", "params": {"stream": "s" * 24, "headers": [["accept", "*/*"]] * 12, "port": 8000}}
    for _ in range(20):
        decoded = json.loads(json.dumps(message))
        sorted(decoded["params"].items(), key=str)
        "".join(f"{name}: {value}\r\n" for name, value in decoded["params"]["headers"])


def cold_work(gap_ms: float, samples: int) -> list[float]:
    """Microseconds of ``_work``, each after ``gap_ms`` of sleep."""
    for _ in range(50):
        _work()
    times = []
    for _ in range(samples):
        if gap_ms:
            time.sleep(gap_ms / 1000)
        started = time.perf_counter()
        _work()
        times.append((time.perf_counter() - started) * 1e6)
    return times


def _p(times: list[float], q: float) -> float:
    return sorted(times)[min(len(times) - 1, int(len(times) * q))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer samples")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the chain measurement (median kept)")
    args = parser.parse_args()
    stop_cleanly_on_sigterm()
    samples = 100 if args.quick else 300
    cpus = sorted(os.sched_getaffinity(0))
    print(f"{os.cpu_count()} cores; idle driver {_read('/sys/devices/system/cpu/cpuidle/current_driver')}; "
          f"halt polling {_read('/sys/module/haltpoll/parameters/guest_halt_poll_ns', 'n/a')} ns "
          f"(/sys/module/haltpoll/parameters/guest_halt_poll_ns)")
    print("\none round trip between two processes, microseconds (p50 / p90)")
    print(f"  {'idle before':>12}  {'same core':>16}  {'other core':>16}  {'kernel places':>16}")
    for gap in GAPS_MS:
        cells = []
        placements = [({cpus[0]}, {cpus[0]}), ({cpus[0]}, {cpus[-1]}), (None, None)]
        if len(cpus) < 2:
            placements[1] = (None, None)
        for here, there in placements:
            times = round_trip(gap, here, there, samples if gap < 10 else samples // 3)
            cells.append(f"{_p(times, 0.5):7.0f} / {_p(times, 0.9):6.0f}")
        print(f"  {gap:9.0f} ms  " + "  ".join(f"{cell:>16}" for cell in cells))
    print("\na request through a chain of processes that only relay it, after 50 ms idle, kernel placement "
          f"(p50 of {samples // 3}, median of {args.rounds} rounds)")
    direct = statistics.median(_p(chain(0, 50, samples // 3), 0.5) for _ in range(args.rounds))
    through = statistics.median(_p(chain(2, 50, samples // 3), 0.5) for _ in range(args.rounds))
    print(f"  direct (client -> service, 2 processes): {direct:7.0f} us")
    print(f"  through two relays (client -> daphne -> bridge -> service, 4 processes): {through:7.0f} us")
    print(f"  ratio {through / direct:.2f}: the hops alone, before any of the platform's work")
    warm = _p(cold_work(0, samples), 0.5)
    cold = _p(cold_work(50, samples // 3), 0.5)
    print(f"\nthe same Python work back to back: p50 {warm:.0f} us; after 50 ms idle: p50 {cold:.0f} us ({cold / warm:.2f}x)")


def _read(path: str, default: str = "unknown") -> str:
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError:
        return default


if __name__ == "__main__":
    main()
