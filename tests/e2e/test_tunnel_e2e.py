"""The tunnel end to end: a real daphne, a real bridge process, pairing through the real API.

- pair (QR ceremony via the API, approved by the logged-in owner over HTTP), connect, and deliver
  1,000 outbox items while the bridge is killed (-9) and restarted several times: every item is
  applied exactly once, in order;
- revoke mid-session: the bridge stops with the revoke message and exit code 3, and stays refused;
- with REDIS_URL: a device_call from another process reaches the bridge connected to daphne A, a
  revoke through daphne B closes the tunnel on A at once, a tunnel idle for 15 s still gets its next
  item by doorbell, and a burst of 5,000 items arrives complete.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from django.conf import settings
from django.db import connection

from clients.common.credentials import Credential, load_credential
from devices import services
from devices.models import Device
from tests.e2e_support import ROOT, Daphne, Process, csrf, logged_in, server_env, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

FAST = {"AI1NET_HEARTBEAT_SEC": "2", "AI1NET_PAIRING_INTERVAL_SEC": "1"}
needs_redis = pytest.mark.skipif(not settings.REDIS_URL, reason="needs REDIS_URL (the scaled-out configuration)")


def bridge_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "DATABASE_URL", "REDIS_URL"))}
    env.update({"PYTHONUNBUFFERED": "1", "AI1NET_BACKOFF_CAP": "1"})
    return env


class Bridge:
    """``python -m clients.bridge --home H run``, restartable; each start logs to its own file."""

    def __init__(self, home: Path, logs: Path) -> None:
        self.home, self.logs, self.starts = home, logs, 0
        self.process: Process | None = None

    def start(self) -> Bridge:
        self.starts += 1
        self.process = Process([sys.executable, "-m", "clients.bridge", "--home", str(self.home), "run"],
                               self.logs / f"bridge-{self.starts}.log", env=bridge_env())
        return self

    def kill(self) -> None:
        self.process.kill()

    def stop(self) -> int | None:
        return self.process.stop() if self.process else None

    def log(self) -> str:
        return self.process.log() if self.process else ""

    def _query(self, sql: str) -> list[tuple]:
        path = self.home / "bridge.sqlite3"
        if not path.exists():
            return []
        db = sqlite3.connect(str(path), timeout=10)
        try:
            return db.execute(sql).fetchall()
        except sqlite3.OperationalError:  # tables not created yet
            return []
        finally:
            db.close()

    def applied(self) -> int:
        rows = self._query("SELECT seq FROM applied")
        return rows[0][0] if rows else 0

    def inbox(self) -> list[tuple[int, str, dict]]:
        return [(seq, kind, json.loads(payload))
                for seq, kind, payload in self._query("SELECT seq, kind, payload FROM inbox ORDER BY rowid")]

    def count(self, kind: str = "test.item") -> int:
        return self._query(f"SELECT count(*) FROM inbox WHERE kind = '{kind}'")[0][0] if self.applied() else 0

    def check_exactly_once_in_order(self, total: int) -> None:
        """Every seq stored once, in seq order with no gap; our items are 1..total in order. (The platform
        may add items of its own, e.g. mobile.switch on each connect.)"""
        inbox = self.inbox()
        assert [seq for seq, _, _ in inbox] == list(range(1, len(inbox) + 1))
        assert [payload["n"] for _, kind, payload in inbox if kind == "test.item"] == list(range(1, total + 1))


def login(server: Daphne, username: str, password: str) -> contextlib.AbstractContextManager[httpx.Client]:
    """An HTTP session of the owner on the real server (users without OTP log in in one step)."""
    return logged_in(server.url, username, password)


def pair_bridge(server: Daphne, session: httpx.Client, home: Path, logs: Path) -> Credential:
    """The real ceremony: the bridge asks for a code and polls; the owner scans and approves."""
    pairing = Process([sys.executable, "-m", "clients.bridge", "--home", str(home), "pair", server.url,
                       "--name", "e2e desk"], logs / "pair.log", env=bridge_env())
    try:
        match = wait_until(lambda: re.search(r"code: ([A-Z0-9]{4}-[A-Z0-9]{4})", pairing.log()), timeout=30,
                           message="the user code on the bridge's terminal")
        user_code = match.group(1)
        shown = session.get(f"/api/devices/pairings/code/{user_code}")
        assert shown.status_code == 200, shown.text
        assert shown.json()["name"] == "e2e desk" and shown.json()["kind"] == "bridge"
        approved = session.post(f"/api/devices/pairings/code/{user_code}/approve", headers=csrf(session))
        assert approved.status_code == 200, approved.text
        wait_until(lambda: not pairing.alive, timeout=30, message="pair to finish")
        assert pairing.popen.returncode == 0, pairing.log()
    finally:
        pairing.stop()
    assert "paired as device" in pairing.log()
    cred = load_credential(home)
    assert cred is not None and cred.url == server.url
    return cred


def device_of(cred: Credential) -> Device:
    return Device.objects.get(pk=cred.device_id)


def online(cred: Credential) -> bool:
    return device_of(cred).is_online


def enqueue(device: Device, numbers: range, kind: str = "test.item") -> None:
    for n in numbers:
        services.outbox_enqueue(device=device, kind=kind, payload={"n": n})


@pytest.mark.slow
def test_pair_connect_and_1000_items_applied_exactly_once_across_kills(tmp_path, user, password):
    server = Daphne(tmp_path, **FAST)
    bridge = Bridge(tmp_path / "home", tmp_path)
    enqueuer = None
    try:
        with login(server, user.username, password) as session:
            cred = pair_bridge(server, session, bridge.home, tmp_path)
            device = device_of(cred)
            assert device.owner_id == user.pk and device.kind == "bridge" and device.name == "e2e desk"
            bridge.start()
            wait_until(lambda: online(cred), timeout=30, message="the bridge online")
            listed = session.get("/api/devices").json()
            assert [(d["id"], d["online"]) for d in listed] == [(cred.device_id, True)]

            # Enqueue from another thread while this one kills and restarts the bridge mid-stream. The producer
            # runs at most AHEAD items past the next kill's threshold until that kill has happened: a stream that
            # got faster than the kills would otherwise end before them, and the kills would test nothing.
            thresholds, ahead = (100, 300, 500, 700, 900), 150
            killed: list[threading.Event] = [threading.Event() for _ in thresholds]
            errors: list[BaseException] = []

            def produce() -> None:
                try:
                    start = 1
                    for threshold, kill in zip(thresholds, killed, strict=True):
                        stop = min(threshold + ahead, 1000)
                        enqueue(device, range(start, stop + 1))
                        start = stop + 1
                        if not kill.wait(120):
                            raise TimeoutError(f"no kill at {threshold}")
                    enqueue(device, range(start, 1001))
                except BaseException as exc:  # noqa: BLE001 - reported below
                    errors.append(exc)
                finally:
                    connection.close()

            enqueuer = threading.Thread(target=produce)
            enqueuer.start()
            kills_mid_stream = 0
            for threshold, kill in zip(thresholds, killed, strict=True):
                wait_until(lambda t=threshold: bridge.count() >= t, timeout=60,
                           message=f"{threshold} items applied (bridge log: {bridge.log()[-2000:]})")
                bridge.kill()
                kills_mid_stream += bridge.count() < 1000
                kill.set()
                bridge.start()
            enqueuer.join(60)
            assert not errors, errors
            wait_until(lambda: bridge.count() == 1000, timeout=60, message="all 1000 applied")
            wait_until(lambda: device_of(cred).acked_seq == bridge.applied(), timeout=30,
                       message="the platform saw the acks")
            bridge.check_exactly_once_in_order(1000)
            assert kills_mid_stream >= 4 and bridge.starts == 6
            assert bridge.process.alive
            assert device_of(cred).connection_count >= 1
    finally:
        if enqueuer is not None:
            enqueuer.join(60)
        bridge.stop()
        server.stop()


def test_revoke_mid_session_stops_the_bridge_with_exit_code_3(tmp_path, user, password):
    server = Daphne(tmp_path, **FAST)
    bridge = Bridge(tmp_path / "home", tmp_path)
    try:
        with login(server, user.username, password) as session:
            cred = pair_bridge(server, session, bridge.home, tmp_path)
            bridge.start()
            wait_until(lambda: online(cred), timeout=30, message="the bridge online")
            enqueue(device_of(cred), range(1, 4))
            wait_until(lambda: bridge.count() == 3, timeout=30, message="items before the revoke")
            revoked = session.post(f"/api/devices/{cred.device_id}/revoke", headers=csrf(session))
            assert revoked.status_code == 200 and revoked.json()["status"] == "revoked"
            wait_until(lambda: not bridge.process.alive, timeout=10, message="the bridge to stop")
            assert bridge.process.popen.returncode == 3
            assert "this device was revoked by its owner; pair it again" in bridge.log()
            # Every later attempt is refused as final, not retried.
            bridge.start()
            wait_until(lambda: not bridge.process.alive, timeout=20, message="the restarted bridge to stop")
            assert bridge.process.popen.returncode == 3 and "revoked by its owner" in bridge.log()
    finally:
        bridge.stop()
        server.stop()


def test_a_wrong_token_is_final(tmp_path):
    server = Daphne(tmp_path, **FAST)
    home = tmp_path / "home"
    from clients.common.credentials import save_credential

    save_credential(home, Credential(url=server.url, device_id="00000000-0000-4000-8000-000000000000",
                                     token="not-a-real-token", kind="bridge", name="ghost"))
    try:
        result = subprocess.run([sys.executable, "-m", "clients.bridge", "--home", str(home), "run"], cwd=ROOT,
                                env=bridge_env(), capture_output=True, text=True, timeout=30)
        assert result.returncode == 3
        assert "pair this device again" in result.stderr
    finally:
        server.stop()


@needs_redis
@pytest.mark.redis
@pytest.mark.slow
def test_redis_device_call_across_processes_and_revoke_through_another_daphne(tmp_path, user, password):
    a = Daphne(tmp_path, name="daphne-a", **FAST)
    b = Daphne(tmp_path, name="daphne-b", **FAST)
    bridge = Bridge(tmp_path / "home", tmp_path)
    try:
        with login(b, user.username, password) as session:
            cred = pair_bridge(a, session, bridge.home, tmp_path)  # the ceremony spans both processes
            bridge.start()
            wait_until(lambda: online(cred), timeout=30, message="the bridge online on A")
            # This test process is a third process on the same Redis layer.
            assert services.device_call(device=device_of(cred), method="bridge.ping", params={}, timeout=10)["pong"]
            from devices.errors import DeviceCallError

            with pytest.raises(DeviceCallError):
                services.device_call(device=device_of(cred), method="bridge.no_such_method", params={}, timeout=10)
            # And a management shell, with the servers' environment.
            shell = subprocess.run(
                [sys.executable, "manage.py", "shell", "-c",
                 "import json; from devices.models import Device; from devices.services import device_call; "
                 f"print(json.dumps(device_call(device=Device.objects.get(pk='{cred.device_id}'), "
                 "method='bridge.ping', params={}, timeout=10)))"],
                cwd=ROOT, env=server_env(), capture_output=True, text=True, timeout=60)
            assert shell.returncode == 0, shell.stderr
            assert json.loads(shell.stdout.strip().splitlines()[-1])["pong"] is True
            # Revoked through B: the tunnel on A closes at once (well before a heartbeat tick would notice).
            started = time.monotonic()
            assert session.post(f"/api/devices/{cred.device_id}/revoke", headers=csrf(session)).status_code == 200
            wait_until(lambda: not bridge.process.alive, timeout=10, message="the bridge to stop")
            assert bridge.process.popen.returncode == 3 and time.monotonic() - started < 10
    finally:
        bridge.stop()
        a.stop()
        b.stop()


@needs_redis
@pytest.mark.redis
@pytest.mark.slow
def test_redis_idle_tunnel_gets_its_next_item_and_a_5000_burst_arrives(tmp_path, user, password):
    # Default 20 s heartbeat: nothing crosses the idle tunnel, so only the doorbell can bring the item fast.
    server = Daphne(tmp_path, AI1NET_PAIRING_INTERVAL_SEC="1")
    bridge = Bridge(tmp_path / "home", tmp_path)
    try:
        with login(server, user.username, password) as session:
            cred = pair_bridge(server, session, bridge.home, tmp_path)
        bridge.start()
        wait_until(lambda: online(cred), timeout=30, message="the bridge online")
        device = device_of(cred)
        enqueue(device, range(1, 2))
        wait_until(lambda: bridge.count() == 1, timeout=10, message="the first item")
        time.sleep(15)  # the scenario itself: an idle tunnel (redis-py 8 used to drop idle consumers at ~5 s)
        started = time.monotonic()
        enqueue(device, range(2, 3))
        wait_until(lambda: bridge.count() == 2, timeout=10, message="the item after 15 s idle")
        assert time.monotonic() - started < 5  # the doorbell, not the 20 s heartbeat poll
        assert bridge.log().count("tunnel up") == 1  # the same connection all along

        # 5,000 items in 50 commits of 100: 50 doorbells for one receiver, far past what the layer would
        # queue for it; nothing may be lost. (One commit per item costs ~25 ms each from a sync caller.)
        for start in range(3, 5003, 100):
            services.outbox_enqueue_many(device=device, items=[("test.item", {"n": n}) for n in range(start, start + 100)])
        wait_until(lambda: bridge.count() == 5002, timeout=60, message="the burst of 5,000")
        bridge.check_exactly_once_in_order(5002)
        assert bridge.log().count("tunnel up") == 1
    finally:
        bridge.stop()
        server.stop()
