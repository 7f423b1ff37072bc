"""What the fault tests share: a failover front for several daphne processes, a bridge daemon with a
credential written straight from the ledger (no pairing ceremony: it costs seconds and is tested
elsewhere), the hook run in threads as the agent host runs it, and the one-line count summary.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.conf import settings

from clients.bridge import hook
from clients.bridge.audit import AuditLog
from clients.common.credentials import Credential, save_credential
from devices.models import Device
from devices.services import device_create
from tests.e2e_support import Daphne, Process, csrf, free_port, logged_in, wait_until

FAST = {"AI1NET_HEARTBEAT_SEC": "2"}
HOOK_WINDOW_SEC = 120.0

needs_redis = pytest.mark.skipif(not settings.REDIS_URL,
                                 reason="two daphne processes need the Redis channel layer (REDIS_URL)")


def client_env() -> dict[str, str]:
    """A device's environment: none of the platform's settings, a short reconnect backoff."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "DATABASE_URL", "REDIS_URL"))}
    env.update({"PYTHONUNBUFFERED": "1", "AI1NET_BACKOFF_CAP": "1"})
    return env


class Front:
    """A TCP balancer in front of daphne processes, as a health-checked L4 load balancer behaves: each new
    connection goes to the first backend that accepts it (a killed process refuses), and a connection
    whose backend dies is closed. ``cut_after`` bytes sent downstream, the connection is cut (RST), for
    the first ``cuts`` connections: a network that drops the tunnel mid-frame."""

    def __init__(self, ports: list[int], *, cut_after: int = 0, cuts: int = 0) -> None:
        self.ports = list(ports)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.connects: Counter[int] = Counter()
        self.connected_at: list[tuple[int, float]] = []  # (backend port, time.monotonic()) of each connection
        self.cut_after, self.cuts_left, self.cut = cut_after, cuts, 0
        self._open: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(started,), daemon=True)
        self._thread.start()
        started.wait(10)

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", self.port))
        started.set()
        self._loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for port in self.ports:
            try:
                up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                continue
            self.connects[port] += 1
            self.connected_at.append((port, time.monotonic()))
            break
        else:
            writer.transport.abort()
            return
        budget = 0
        if self.cuts_left > 0 and self.cut_after:
            self.cuts_left -= 1
            budget = self.cut_after
        self._open.update((writer, up_writer))
        await asyncio.gather(self._pipe(reader, up_writer, 0), self._pipe(up_reader, writer, budget, up_writer))
        self._open.difference_update((writer, up_writer))

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, budget: int,
                    other: asyncio.StreamWriter | None = None) -> None:
        sent = 0
        try:
            while data := await src.read(65536):
                if budget and sent + len(data) >= budget:
                    dst.write(data[: budget - sent])
                    self.cut += 1
                    dst.transport.abort()
                    if other is not None:
                        other.transport.abort()
                    return
                dst.write(data)
                sent += len(data)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            dst.close()

    def close(self) -> None:
        def shut() -> None:
            self._server.close()
            for writer in list(self._open):
                writer.transport.abort()
            self._loop.stop()

        self._loop.call_soon_threadsafe(shut)
        self._thread.join(10)


class Desk:
    """A bridge daemon (a real process) on a device made straight in the ledger, and its hooks."""

    def __init__(self, tmp_path: Path, owner: Any, url: str) -> None:
        self.home = tmp_path / "home"
        self.logs = tmp_path
        self.starts = 0
        self.process: Process | None = None
        device, token = device_create(owner=owner, name="desk", kind="bridge", hostname="desk")
        self.device_id = str(device.pk)
        save_credential(self.home, Credential(url=url, device_id=self.device_id, token=token, kind="bridge",
                                              name="desk"))
        self.pool = ThreadPoolExecutor(256)

    def start(self) -> None:
        self.starts += 1
        (self.home / "local.json").unlink(missing_ok=True)
        self.process = Process([sys.executable, "-m", "clients.bridge", "-v", "--home", str(self.home), "run"],
                               self.logs / f"bridge-{self.starts}.log", env=client_env())
        wait_until(lambda: (self.home / "local.json").exists(), timeout=30, message="the daemon's local API")
        wait_until(self.online, timeout=30, message="the tunnel")

    def online(self) -> bool:
        return Device.objects.get(pk=self.device_id).is_online

    def kill(self) -> None:
        """kill -9, as a crash would."""
        assert self.process is not None
        self.process.kill()
        self.process.stop()

    def stop(self) -> None:
        if self.process:
            self.process.stop()
        self.pool.shutdown(wait=False, cancel_futures=True)

    def hook(self, event: dict) -> dict | None:
        """One hook call: the hook's own program (clients.bridge.hook.run), as the host runs it."""
        out = io.StringIO()
        hook.run(str(self.home), window=HOOK_WINDOW_SEC, stdin=io.BytesIO(json.dumps(event).encode()), stdout=out)
        return json.loads(out.getvalue()) if out.getvalue().strip() else None

    def hook_async(self, event: dict) -> Future:
        return self.pool.submit(self.hook, event)

    def wait_hooks_waiting(self, hooks: dict[int, Future]) -> None:
        """Until every hook is past its ask and long-polling the daemon (a hook that gave up fails here)."""
        def all_waiting() -> bool:
            gave_up = [n for n, future in hooks.items() if future.done()]
            assert not gave_up, f"hooks returned before an answer: {gave_up[:10]}"
            return len(self.health().get("waiting", [])) == len(hooks)

        wait_until(all_waiting, timeout=90, interval=0.2, message="every hook waiting on its question")

    def health(self) -> dict:
        try:
            return hook.Daemon(str(self.home)).post("health", {}, timeout=2)
        except Exception:
            return {}

    def audit(self) -> list[dict]:
        return AuditLog(self.home / "audit.jsonl").entries()

    def audit_count(self, event: str) -> int:
        return sum(1 for entry in self.audit() if entry["event"] == event)


def start_session(desk: Desk, session_id: str = "sess-1") -> None:
    from mobile.models import AgentSession

    assert desk.hook({"session_id": session_id, "transcript_path": "/tmp/t.jsonl", "cwd": "/tmp/project",
                      "hook_event_name": "SessionStart", "source": "startup"}) is None
    wait_until(lambda: AgentSession.objects.filter(session_id=session_id).exists(), timeout=15,
               message="the session on the platform")


def question(n: int) -> dict:
    return {"question": f"Question {n}?", "header": f"Q{n}",
            "options": [{"label": "yes", "description": "go"}, {"label": "no", "description": "stop"}],
            "multiSelect": False}


def ask(n: int, session_id: str = "sess-1") -> dict:
    return {"session_id": session_id, "transcript_path": "/tmp/t.jsonl", "cwd": "/tmp/project",
            "permission_mode": "default", "hook_event_name": "PreToolUse", "tool_name": "AskUserQuestion",
            "tool_input": {"questions": [question(n)]}, "tool_use_id": f"toolu_{n}"}


def expected_answer(n: int) -> dict:
    """What the hook must print for question n once the phone answered it (see `answer_body`)."""
    return {f"Question {n}?": f"yes, reply {n}"}


def answer_body(pending: dict, n: int) -> dict:
    text = f"Question {n}?"
    return {"question_id": pending["question_id"], "nonce": pending["nonce"], "answers": {text: ["yes"]},
            "other": {text: f"reply {n}"}}


def pending_questions(count: int, timeout: float = 60) -> dict[int, dict]:
    """Question number -> {question_id, nonce}, once all `count` are pending on the platform. Read from
    the database: the phone's list shows the first 100 only, and it is not what these tests are about."""
    from mobile.models import Question
    from mobile.services import nonce_for

    def got() -> dict[int, dict] | None:
        questions = list(Question.objects.filter(state=Question.State.PENDING))
        if len(questions) < count:
            return None
        return {int(q.questions[0]["question"].split()[1].rstrip("?")): {"question_id": str(q.pk),
                                                                         "nonce": nonce_for(q)}
                for q in questions}

    return wait_until(got, timeout=timeout, interval=0.2, message=f"{count} questions pending")


def post_answer(session: httpx.Client, pending: dict, n: int) -> int:
    return session.post("/api/mobile/answer", json=answer_body(pending, n), headers=csrf(session)).status_code


def tally(desk: Desk, outputs: dict[int, dict | None], sent: int, *, kills: int = 0) -> dict[str, int]:
    """sent / delivered (the hook printed its own answer) / duplicated (a hook given another question's
    answer, or a question taken more often than the daemon was killed allows) / lost, from the hooks'
    outputs and the bridge's audit log. The take is audited before it is stored, so a daemon killed
    between the two logs a take whose reply never left: at most one extra per kill (`take_audits_extra`).
    retaken: a stored take handed again to a hook whose reply died with the daemon."""
    delivered = wrong = 0
    for n, output in outputs.items():
        answers = (output or {}).get("hookSpecificOutput", {}).get("updatedInput", {}).get("answers")
        if answers == expected_answer(n):
            delivered += 1
        elif answers:
            wrong += 1
    takes = Counter(entry["question_id"] for entry in desk.audit() if entry["event"] == "question.take")
    extra = sum(count - 1 for count in takes.values())
    retaken = sum(1 for entry in desk.audit() if entry["event"] == "question.take_again")
    return {"sent": sent, "delivered": delivered, "duplicated": wrong + max(0, extra - kills),
            "lost": sent - delivered, "retaken": retaken, "take_audits_extra": extra}


def summary(name: str, counts: dict[str, Any]) -> str:
    line = f"{name}: " + " ".join(f"{key}={value}" for key, value in counts.items())
    print(line)
    return line


@contextlib.contextmanager
def phone(server: Daphne, username: str, password: str) -> Iterator[httpx.Client]:
    with logged_in(server.url, username, password) as session:
        yield session
