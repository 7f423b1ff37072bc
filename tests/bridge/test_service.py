"""`ai1net-bridge service install|uninstall|status`, and a stopped daemon shown offline in time."""

from __future__ import annotations

import os
import plistlib
import shutil
import signal
import subprocess
import sys
import time

import pytest

from devices.models import Device
from tests.bridge import test_mobile_e2e as mobile_e2e
from tests.e2e_support import ROOT, wait_until

world = mobile_e2e.world  # the paired daemon + daphne + phone fixture

BRIDGE = [sys.executable, "-m", "clients.bridge"]


def bridge(*args: str, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([*BRIDGE, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_systemd_unit_install_status_uninstall(tmp_path):
    home, units = tmp_path / "my home", tmp_path / "units"
    units.mkdir()
    (units / "other.service").write_text("[Unit]\n")  # not ours: must survive uninstall
    done = bridge("--home", str(home), "service", "install", "--unit-dir", str(units))
    assert done.returncode == 0, done.stderr
    [unit] = [p for p in units.iterdir() if p.name.startswith("ai1net-bridge-")]
    assert "written only" in done.stdout and str(unit) in done.stdout
    text = unit.read_text()
    assert f'ExecStart="{sys.executable}" "-m" "clients.bridge" "--home" "{home.resolve()}" "run"' in text
    assert f"WorkingDirectory={ROOT}" in text
    assert "Restart=on-failure" in text and "WantedBy=default.target" in text
    if shutil.which("systemd-analyze"):
        verify = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
        assert verify.returncode == 0, verify.stdout + verify.stderr
    status = bridge("--home", str(home), "service", "status")
    assert status.returncode == 1
    assert status.stdout.splitlines() == [f"service: installed {unit}", "bridge: not running"]
    # The same home gets the same unit; another home another one.
    assert bridge("--home", str(home), "service", "install", "--unit-dir", str(units)).returncode == 0
    assert bridge("--home", str(tmp_path / "h2"), "service", "install", "--unit-dir", str(units)).returncode == 0
    assert len([p for p in units.iterdir() if p.name.startswith("ai1net-bridge-")]) == 2
    gone = bridge("--home", str(home), "service", "uninstall")
    assert gone.returncode == 0 and f"removed {unit}" in gone.stdout
    assert not unit.exists() and (units / "other.service").exists()
    assert len(list(units.iterdir())) == 2  # h2's unit and the stranger stay
    assert not (home / "service.json").exists()
    again = bridge("--home", str(home), "service", "uninstall")
    assert again.returncode == 0 and "no login service" in again.stdout


def test_launchd_agent_for_macos(tmp_path):
    home, agents = tmp_path / "home", tmp_path / "LaunchAgents"
    done = bridge("--home", str(home), "service", "install", "--platform", "macos", "--unit-dir", str(agents))
    assert done.returncode == 0, done.stderr
    [path] = agents.iterdir()
    agent = plistlib.loads(path.read_bytes())
    assert path.name == agent["Label"] + ".plist" and agent["Label"].startswith("net.ai1net.bridge.")
    assert agent["ProgramArguments"] == [sys.executable, "-m", "clients.bridge", "--home", str(home.resolve()), "run"]
    assert agent["RunAtLoad"] is True and agent["KeepAlive"] == {"SuccessfulExit": False}
    assert agent["WorkingDirectory"] == str(ROOT)
    assert bridge("--home", str(home), "service", "uninstall").returncode == 0
    assert list(agents.iterdir()) == []


def _bridge_state(session) -> list[tuple[str, bool]]:
    return [(b["name"], b["online"]) for b in session.get("/api/mobile/state").json()["bridges"]]


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_stopped_daemon_is_offline_by_name_within_the_heartbeat_window(world):
    server, desk, session = world
    beat = float(mobile_e2e.FAST["AI1NET_HEARTBEAT_SEC"])
    status = bridge("--home", str(desk.home), "service", "status")
    assert status.returncode == 0 and f"bridge: running (pid {desk.process.popen.pid})" in status.stdout
    assert _bridge_state(session) == [("desk", True)]

    # A frozen daemon (its socket stays open, it says nothing): the heartbeat window decides.
    os.killpg(desk.process.popen.pid, signal.SIGSTOP)
    frozen = time.monotonic()
    try:
        # The platform checks once per beat: offline after at most 3 missed beats plus one check.
        wait_until(lambda: _bridge_state(session) == [("desk", False)], timeout=beat * 4 + 2, message="offline")
        assert time.monotonic() - frozen <= beat * 4 + 2
    finally:
        os.killpg(desk.process.popen.pid, signal.SIGCONT)
    wait_until(lambda: Device.objects.get(pk=desk.device_id).is_online, timeout=30, message="back online")

    # A stopped daemon closes its tunnel: offline at once, and `service status` says so.
    desk.process.stop()
    wait_until(lambda: _bridge_state(session) == [("desk", False)], timeout=beat * 3, message="offline")
    status = bridge("--home", str(desk.home), "service", "status")
    assert status.returncode == 1 and "bridge: not running" in status.stdout
