"""Fault: Redis (the channel layer and the cache of two daphne processes) killed and restarted while
phone answers are in flight. A private redis-server on a free port (never the machine's shared one),
no persistence: the restarted Redis is empty, its groups and cached counters gone. No answer may be
lost or doubled (the phone retries a refused POST, as the page does), presence must recover and the
bridge's tunnel must be reachable again within 10 s.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest
from django.utils import timezone

from devices.models import LONGPOLL_PREFIX, Device
from tests.e2e_support import Daphne, Process, free_port, wait_until
from tests.faults.support import (
    FAST,
    Desk,
    Front,
    ask,
    needs_redis,
    pending_questions,
    phone,
    post_answer,
    start_session,
    summary,
    tally,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.redis, needs_redis,
              pytest.mark.django_db(transaction=True)]

SENT = 100
DOWN_SEC = 1.0


class PrivateRedis:
    """A redis-server of this test's own, on a free loopback port, without persistence."""

    def __init__(self, tmp_path: Path) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.log_dir = tmp_path
        self.starts = 0
        self.start()

    def start(self) -> None:
        self.starts += 1
        self.process = Process([shutil.which("redis-server") or "redis-server", "--bind", "127.0.0.1", "--port",
                                str(self.port), "--save", "", "--appendonly", "no"],
                               self.log_dir / f"redis-{self.starts}.log")
        wait_until(self.ping, timeout=10, message="the private redis-server")

    def ping(self) -> bool:
        return subprocess.run(["redis-cli", "-p", str(self.port), "ping"], capture_output=True, text=True,
                              timeout=5).stdout.strip() == "PONG"

    def kill(self) -> None:
        self.process.kill()
        self.process.stop()


def tunnel_back(desk: Desk, since: datetime) -> bool:
    """The bridge is online on a WebSocket whose hello was taken after `since` (not on the long-poll
    fallback): with Redis gone a hello cannot complete, so this one needed the restarted Redis."""
    device = Device.objects.get(pk=desk.device_id)
    return (device.is_online and not device.channel_name.startswith(LONGPOLL_PREFIX)
            and device.connected_at is not None and device.connected_at > since)


def test_redis_restarted_mid_flight_loses_no_answer(tmp_path, user, password):
    user.mobile_reply_enabled = True
    user.save(update_fields=["mobile_reply_enabled"])
    redis = PrivateRedis(tmp_path)
    layer = {"REDIS_URL": redis.url, "AI1NET_REDIS_PREFIX": "faults", **FAST}
    a = Daphne(tmp_path, name="daphne-a", **layer)
    b = Daphne(tmp_path, name="daphne-b", **layer)
    front = Front([a.port, b.port])
    desk = Desk(tmp_path, user, front.url)
    try:
        desk.start()
        start_session(desk)
        hooks = {n: desk.hook_async(ask(n)) for n in range(SENT)}
        pending = pending_questions(SENT)
        desk.wait_hooks_waiting(hooks)
        refused: list[int] = []
        with phone(b, user.username, password) as session:
            def answer_all() -> None:  # the phone retries a refused answer until it is taken (200) or known (409)
                for n in range(SENT):
                    deadline = time.monotonic() + 60
                    while (status := post_answer(session, pending[n], n)) not in (200, 409):
                        refused.append(status)
                        assert time.monotonic() < deadline, f"answer {n}: {status}"
                        time.sleep(0.2)

            answering = threading.Thread(target=answer_all)
            answering.start()
            wait_until(lambda: desk.audit_count("answer.apply") >= SENT // 4, timeout=60,
                       message="answers arriving on the desk")
            redis.kill()
            killed_at = timezone.now()
            applied_at_kill = desk.audit_count("answer.apply")
            time.sleep(DOWN_SEC)
            redis.start()
            back_at = time.monotonic()
            wait_until(lambda: tunnel_back(desk, killed_at), timeout=10, interval=0.1,
                       message="the tunnel back on a WebSocket")
            tunnel_back_s = time.monotonic() - back_at
            answering.join(120)
        outputs = {n: future.result(90) for n, future in hooks.items()}
        wait_until(lambda: Device.objects.get(pk=desk.device_id).is_online, timeout=10, message="presence")
        counts = tally(desk, outputs, SENT)
        summary("redis restart", {**counts, "applied_at_kill": applied_at_kill, "refused_posts": len(refused),
                                  "tunnel_connects": sum(front.connects.values()),
                                  "tunnel_back_s": round(tunnel_back_s, 2)})
        assert {key: counts[key] for key in ("sent", "delivered", "duplicated", "lost")} == {
            "sent": SENT, "delivered": SENT, "duplicated": 0, "lost": 0}
        assert 0 < applied_at_kill < SENT
        assert "falling back to HTTP long polling" not in desk.process.log()
    finally:
        desk.stop()
        front.close()
        a.stop()
        b.stop()
        redis.kill()
