"""Fault: kill -9 of the bridge daemon while phone answers are being delivered, then a restart. The
daemon's on-disk state (the inbox with its applied seq, the answer store) must give each answer to its
hook once: the hooks keep polling while the daemon is down and find the new one by its local.json.
One daphne process: this runs on both configurations.
"""

from __future__ import annotations

import threading
import time

import pytest

from tests.e2e_support import Daphne, wait_until
from tests.faults.support import (
    FAST,
    Desk,
    ask,
    pending_questions,
    phone,
    post_answer,
    start_session,
    summary,
    tally,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SENT = 100


def test_bridge_killed_mid_delivery_and_restarted_gives_each_answer_once(tmp_path, user, password):
    user.mobile_reply_enabled = True
    user.save(update_fields=["mobile_reply_enabled"])
    server = Daphne(tmp_path, **FAST)
    desk = Desk(tmp_path, user, server.url)
    try:
        desk.start()
        start_session(desk)
        hooks = {n: desk.hook_async(ask(n)) for n in range(SENT)}
        pending = pending_questions(SENT)
        desk.wait_hooks_waiting(hooks)
        with phone(server, user.username, password) as session:
            statuses: list[int] = []

            def answer_all() -> None:  # the phone keeps answering while the desk crashes
                statuses.extend(post_answer(session, pending[n], n) for n in range(SENT))

            answering = threading.Thread(target=answer_all)
            answering.start()
            wait_until(lambda: desk.audit_count("answer.apply") >= SENT // 5, timeout=60,
                       message="answers arriving on the desk")
            desk.kill()
            applied_at_kill, posted_at_kill = desk.audit_count("answer.apply"), len(statuses)
            desk.start()
            answering.join(120)
        answered_at = time.monotonic()
        outputs = {n: future.result(90) for n, future in hooks.items()}
        # The hooks find the new daemon at once (a full accept queue once held them back ~25 s).
        last_hook_s = time.monotonic() - answered_at
        counts = tally(desk, outputs, SENT, kills=1)
        summary("bridge kill -9", {**counts, "applied_at_kill": applied_at_kill, "posted_at_kill": posted_at_kill,
                                  "last_hook_after_last_answer_s": round(last_hook_s, 2)})
        assert statuses == [200] * SENT
        assert {key: counts[key] for key in ("sent", "delivered", "duplicated", "lost")} == {
            "sent": SENT, "delivered": SENT, "duplicated": 0, "lost": 0}
        assert 0 < applied_at_kill < SENT, "the kill must land while answers are still arriving"
        assert last_hook_s < 12
    finally:
        desk.stop()
        server.stop()
