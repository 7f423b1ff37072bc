"""Slowloris clients: connections that send a request head a byte at a time, and note when the server drops them."""

from __future__ import annotations

import select
import socket
import threading
import time


class Slowloris:
    """``count`` connections to ``port``, each sending ``head`` one byte per ``interval`` from a thread."""

    def __init__(self, port: int, head: bytes, count: int, interval: float = 1.0) -> None:
        self.head, self.interval = head, interval
        self.started = time.monotonic()
        self.sockets = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(count)]
        self.dropped_after: dict[int, float] = {}  # socket index -> seconds from the start
        self.sent = [0] * count
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._trickle, name="slowloris", daemon=True)
        self._thread.start()

    def _trickle(self) -> None:
        while not self._stop.is_set() and len(self.dropped_after) < len(self.sockets):
            for index, sock in enumerate(self.sockets):
                if index in self.dropped_after:
                    continue
                try:
                    readable, _, _ = select.select([sock], [], [], 0)
                    if readable and not sock.recv(65536):
                        raise ConnectionResetError("closed by the server")
                    sock.send(self.head[self.sent[index] % len(self.head):][:1])
                    self.sent[index] += 1
                except OSError:
                    self.dropped_after[index] = time.monotonic() - self.started
            self._stop.wait(self.interval)

    def wait_all_dropped(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and len(self.dropped_after) < len(self.sockets):
            time.sleep(0.1)
        return len(self.dropped_after) == len(self.sockets)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for sock in self.sockets:
            sock.close()


def rss_kib(pid: int) -> int:
    """Resident memory of process ``pid`` (VmRSS in /proc/<pid>/status), KiB."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")
