"""`make deps` (scripts/system-deps.sh): silent when everything is there, installs what is missing with
apt-get when it may, and otherwise stops with one line that names the packages and the command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "system-deps.sh"
COMMANDS = {"chromium": "chromium", "rg": "ripgrep", "git": "git", "tmux": "tmux", "npm": "npm", "ss": "iproute2"}


def stub(folder: Path, name: str, body: str = "exit 0") -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def all_but_ripgrep(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for command in ("chromium", "git", "tmux", "npm", "ss"):
        stub(bin_dir, command)
    return bin_dir


def run(bin_dir: Path, uid: int, **env: str) -> subprocess.CompletedProcess[str]:
    stub(bin_dir, "id", f"echo {uid}")
    return subprocess.run(["/bin/bash", str(SCRIPT)], capture_output=True, text=True, timeout=60,
                          env={"PATH": str(bin_dir), **env})


def test_a_no_op_when_everything_is_there(tmp_path):
    for command in COMMANDS:
        stub(tmp_path, command)
    done = run(tmp_path, uid=1000)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_without_apt_it_stops_with_one_line_naming_the_packages_and_the_command(tmp_path):
    stub(tmp_path, "git")
    done = run(tmp_path, uid=0)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.splitlines() == [
        "make deps: missing system package(s) chromium ripgrep tmux npm iproute2: install them with "
        "'sudo apt-get install -y chromium ripgrep tmux npm iproute2', then run make again"
    ]


def test_not_root_and_no_sudo_it_does_not_try_to_install(tmp_path):
    log = tmp_path / "apt.log"
    stub(tmp_path, "apt-get", f'echo "$@" >> {log}; exit 1')
    done = run(tmp_path, uid=1000)
    assert done.returncode == 1 and "sudo apt-get install -y chromium ripgrep git tmux npm iproute2" in done.stderr
    assert not log.exists()


def test_as_root_it_installs_the_missing_packages_with_apt(tmp_path):
    bin_dir, log = tmp_path / "bin", tmp_path / "apt.log"
    bin_dir.mkdir()
    stub(bin_dir, "tmux")
    stub(bin_dir, "npm")
    stub(bin_dir, "ss")
    # A stand-in apt-get: logs its arguments and "installs" by putting the packages' commands on PATH.
    packages = " ".join(f"{package}) /bin/cp {bin_dir}/tmux {bin_dir}/{command};;"
                        for command, package in COMMANDS.items())
    stub(tmp_path, "fake-apt", f'echo "$@" >> {log}\nfor p in "$@"; do case "$p" in {packages} esac; done')
    done = run(bin_dir, uid=0, AI1NET_APT_GET=str(tmp_path / "fake-apt"))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "make deps: installing chromium ripgrep git (apt-get install -y chromium ripgrep git)\n"
    assert log.read_text().splitlines() == ["update -qq",
                                            "-o DPkg::Lock::Timeout=600 install -y -qq chromium ripgrep git"]
    assert (bin_dir / "rg").exists()


def test_while_another_apt_holds_the_lists_lock_update_is_tried_again(tmp_path):
    """apt-get install waits for dpkg's lock by itself (its timeout option); update fails at once on the lists'
    lock (apt 2.6), so the script tries it again instead of installing from no lists on a fresh machine."""
    bin_dir, log, tries = all_but_ripgrep(tmp_path), tmp_path / "apt.log", tmp_path / "tries"
    stub(bin_dir, "sleep")
    # Busy for the first two updates, as apt-get says it; then the install puts rg on PATH.
    stub(tmp_path, "fake-apt", f'echo "$@" >> {log}\n'
         f'case "$*" in *update*) echo x >> {tries}; [ "$(/usr/bin/wc -l < {tries})" -gt 2 ] && exit 0\n'
         '  echo "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 6655 (apt-get)" >&2\n'
         '  echo "E: Unable to lock directory /var/lib/apt/lists/" >&2; exit 100;;\n'
         f'*install*) /bin/cp {bin_dir}/git {bin_dir}/rg;; esac')
    done = run(bin_dir, uid=0, AI1NET_APT_GET=str(tmp_path / "fake-apt"))
    assert done.returncode == 0, done.stderr
    assert log.read_text().splitlines() == ["update -qq"] * 3 + ["-o DPkg::Lock::Timeout=600 install -y -qq ripgrep"]


def test_an_update_failing_for_another_reason_is_not_retried(tmp_path):
    bin_dir, log = all_but_ripgrep(tmp_path), tmp_path / "apt.log"
    stub(tmp_path, "fake-apt", f'echo "$@" >> {log}\n'
         'case "$*" in *update*) echo "W: Failed to fetch http://deb.example/dists/x/InRelease" >&2; exit 100;; esac')
    done = run(bin_dir, uid=0, AI1NET_APT_GET=str(tmp_path / "fake-apt"))
    assert done.returncode == 1
    assert log.read_text().splitlines() == ["update -qq", "-o DPkg::Lock::Timeout=600 install -y -qq ripgrep"]


def test_an_install_that_leaves_something_missing_fails_naming_it(tmp_path):
    stub(tmp_path, "fake-apt", "exit 100")  # fails, installs nothing
    done = run(all_but_ripgrep(tmp_path), uid=0, AI1NET_APT_GET=str(tmp_path / "fake-apt"))
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1].startswith("make deps: missing system package(s) ripgrep:")


def test_pytest_stops_before_any_test_when_the_browser_is_missing(tmp_path):
    """Run straight with pytest (no make), browser tests selected and no chromium on PATH: one line, exit 4."""
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-m", "browser",
                           "tests/mobile/test_pacing_browser.py"], cwd=SCRIPT.parent.parent, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PATH": str(tmp_path)})
    assert done.returncode == 4, done.stdout + done.stderr
    assert "missing system package(s) chromium for the selected tests: run 'make deps'" in done.stdout + done.stderr
