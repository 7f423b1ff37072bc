"""Fault: kill -9 of the daphne process that holds the bridge's tunnel while 200 phone answers are in
flight. Two daphne processes share PostgreSQL + Redis behind a failover front; the phone answers
through the other process. Every answer must reach its hook once and none twice: the bridge reconnects
(through the front) to the surviving process and resumes from its applied seq.
"""

from __future__ import annotations

import time

import pytest

from tests.e2e_support import Daphne, wait_until
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

SENT = 200


def test_daphne_holding_the_tunnel_killed_with_200_answers_in_flight(tmp_path, user, password):
    user.mobile_reply_enabled = True
    user.save(update_fields=["mobile_reply_enabled"])
    a = Daphne(tmp_path, name="daphne-a", **FAST)
    b = Daphne(tmp_path, name="daphne-b", **FAST)
    front = Front([a.port, b.port])
    desk = Desk(tmp_path, user, front.url)
    try:
        desk.start()
        assert front.connects == {a.port: 1}
        start_session(desk)
        hooks = {n: desk.hook_async(ask(n)) for n in range(SENT)}
        with phone(b, user.username, password) as session:
            pending = pending_questions(SENT)
            desk.wait_hooks_waiting(hooks)
            applied_at_kill = posted_at_kill = 0
            killed_at = 0.0
            for n in range(SENT):
                assert post_answer(session, pending[n], n) == 200
                if n == SENT // 3:
                    wait_until(lambda: desk.audit_count("answer.apply") >= SENT // 10, timeout=30,
                               message="answers arriving on the desk")
                    applied_at_kill, posted_at_kill = desk.audit_count("answer.apply"), n + 1
                    a.kill()
                    killed_at = time.monotonic()
            wait_until(lambda: front.connects[b.port] and desk.online(), timeout=30,
                       message="the tunnel back, on the other process")
            back_after = min(at for port, at in front.connected_at if port == b.port) - killed_at
            outputs = {n: future.result(90) for n, future in hooks.items()}
        counts = tally(desk, outputs, SENT)
        summary("daphne kill -9", {**counts, "applied_at_kill": applied_at_kill, "posted_at_kill": posted_at_kill,
                                   "tunnel_back_s": round(back_after, 2)})
        assert {key: counts[key] for key in ("sent", "delivered", "duplicated", "lost")} == {
            "sent": SENT, "delivered": SENT, "duplicated": 0, "lost": 0}
        assert 0 < applied_at_kill < SENT, "the kill must land while answers are still arriving"
        assert desk.audit_count("question.take") == SENT
    finally:
        desk.stop()
        front.close()
        a.stop()
        b.stop()
