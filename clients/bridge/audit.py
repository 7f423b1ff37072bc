"""The bridge's own audit log: one JSON line per take, give-up, answer and refusal.

Each line is written and fsync'd BEFORE the action it records, so a crash can only leave an entry for
an action that did not happen, never an action without its entry. Lines that record what arrived or
went out rather than a decision (``durable=False``: a question asked, an answer received) are written
without their own fsync; the next decision's fsync (a take, a give-up) makes them durable with it, in
order, since it is one append-only file.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Dict, List


class AuditLog:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()

    def write(self, event: str, *, durable: bool = True, **fields: Any) -> None:
        entry: Dict[str, Any] = {"t": round(time.time(), 3), "event": event}
        entry.update(fields)
        line = (json.dumps(entry, ensure_ascii=False, separators=(",", ":"), default=str) + "\n").encode("utf-8")
        with self._lock:
            fd = os.open(str(self.path), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line)
                if durable:
                    os.fsync(fd)
            finally:
                os.close(fd)

    def entries(self) -> List[Dict[str, Any]]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in text.splitlines() if line.strip()]
