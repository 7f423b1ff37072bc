"""Fault: 1,000 outbox items delivered across 5 forced reconnects. A front between the bridge and daphne
cuts the tunnel (RST, mid-frame) after a few kilobytes, five times, while items are still being
written; the bridge's inbox must hold each item once, in seq order, and the platform must have every
one acked. One daphne process: this runs on both configurations (on the embedded one, items written by
this test process are found by the consumer's sweep and on each reconnect, not by a doorbell).
"""

from __future__ import annotations

import json
import sqlite3
import time

import pytest

from devices.models import Device, OutboxItem
from devices.services import outbox_enqueue_many
from tests.e2e_support import Daphne, wait_until
from tests.faults.support import FAST, Desk, Front, summary

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SENT = 1000
CUTS = 5
CUT_AFTER_BYTES = 12_000  # about 120 deliver frames per connection


def inbox_items(desk: Desk) -> list[tuple[int, int]]:
    """(seq, n) of the items the bridge recorded as applied, in the order it recorded them."""
    path = desk.home / "bridge.sqlite3"
    if not path.exists():
        return []
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
    try:
        rows = db.execute("SELECT seq, kind, payload FROM inbox ORDER BY rowid").fetchall()
    finally:
        db.close()
    return [(seq, json.loads(payload)["n"]) for seq, kind, payload in rows if kind == "faults.item"]


def test_1000_outbox_items_across_5_forced_reconnects_are_applied_once_in_order(tmp_path, user):
    server = Daphne(tmp_path, **FAST)
    front = Front([server.port], cut_after=CUT_AFTER_BYTES, cuts=CUTS)
    desk = Desk(tmp_path, user, front.url)
    device = Device.objects.get(pk=desk.device_id)
    try:
        outbox_enqueue_many(device=device, items=[("faults.item", {"n": n}) for n in range(SENT // 2)])
        started = time.monotonic()
        desk.start()
        wait_until(lambda: front.cut >= 1, timeout=30, message="the first cut")
        for first in range(SENT // 2, SENT, 100):  # the rest while the tunnel keeps being cut
            outbox_enqueue_many(device=device, items=[("faults.item", {"n": n}) for n in range(first, first + 100)])
            time.sleep(0.2)
        wait_until(lambda: len(inbox_items(desk)) >= SENT, timeout=90, interval=0.2, message="every item on the desk")
        wait_until(lambda: not OutboxItem.objects.filter(device=device, acked_at__isnull=True).exists(), timeout=30,
                   message="every item acked on the platform")
        elapsed = time.monotonic() - started
        items = inbox_items(desk)
        numbers = [n for _, n in items]
        counts = {"sent": SENT, "delivered": len(set(numbers)), "duplicated": len(numbers) - len(set(numbers)),
                  "lost": SENT - len(set(numbers)), "reconnects": sum(front.connects.values()) - 1,
                  "cuts": front.cut, "seconds": round(elapsed, 1)}
        summary("outbox across reconnects", counts)
        assert {key: counts[key] for key in ("sent", "delivered", "duplicated", "lost")} == {
            "sent": SENT, "delivered": SENT, "duplicated": 0, "lost": 0}
        assert numbers == list(range(SENT)), "applied out of order"
        assert [seq for seq, _ in items] == sorted(seq for seq, _ in items)
        assert front.cut == CUTS and counts["reconnects"] >= CUTS
    finally:
        desk.stop()
        front.close()
        server.stop()
