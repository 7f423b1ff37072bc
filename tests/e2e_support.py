"""Helpers for end-to-end tests that start real processes (daphne, the bridge, the probe, the hook).

The processes share the test database: use these only from tests that have `transactional_db`
(so rows are committed and visible to the other processes).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent
# Debian's chromium, as root on a closed network (see shared/reference/stack-notes.md); never a downloaded browser.
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VENV_BIN = Path(sys.executable).parent


def relay_bytes_received(address: str) -> int:
    """What this machine's open TCP connections to ``address`` received (``ss``): the dialling daphnes' side of
    their connections to a stream relay (devices.web.relay)."""
    out = subprocess.run(["ss", "-tinH", "state", "established", "dst", address], capture_output=True, text=True,
                         check=True).stdout
    return sum(int(n) for n in re.findall(r"\bbytes_received:(\d+)", out))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(condition: Callable[[], Any], timeout: float = 10.0, interval: float = 0.05, message: str = "") -> Any:
    """Poll `condition` until it returns something truthy; fail with `message` at the deadline."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = condition()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - keep polling; report the last error at the deadline
            last_error = exc
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {message or condition}: last error {last_error!r}")


def test_database_url() -> str:
    """The URL of the database the test run uses (pytest-django's test database)."""
    db = connection.settings_dict
    if "sqlite" in db["ENGINE"]:
        return f"sqlite:///{db['NAME']}"
    user = db.get("USER") or ""
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    host = db.get("HOST") or "127.0.0.1"
    port = db.get("PORT") or 5432
    return f"postgres://{user}{password}@{host}:{port}/{db['NAME']}"


def server_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "ai1net.settings",
            "DATABASE_URL": test_database_url(),
            "AI1NET_DEBUG": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    if settings.REDIS_URL:
        env["REDIS_URL"] = settings.REDIS_URL
        env["AI1NET_REDIS_PREFIX"] = settings.REDIS_PREFIX
    env.update(extra)
    return env


class Process:
    """A child process with its output in a log file, stopped (and reaped) by `stop()`."""

    def __init__(self, argv: list[str], log_path: Path, env: dict[str, str] | None = None, cwd: Path = ROOT,
                 pass_fds: tuple[int, ...] = ()) -> None:
        self.argv = argv
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
            pass_fds=pass_fds,
        )

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.alive:
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait(10)

    def stop(self, timeout: float = 10.0) -> int | None:
        if self.alive:
            try:
                os.killpg(self.popen.pid, signal.SIGTERM)
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(10)
            except ProcessLookupError:
                pass
        self._log.close()
        return self.popen.returncode


class Daphne(Process):
    """A real daphne serving ai1net on a free loopback port, against the test database."""

    def __init__(self, tmp_path: Path, port: int | None = None, name: str = "daphne",
                 app: str = "ai1net.asgi:application", **env: str) -> None:
        self.port, self.app = port or free_port(), app
        self.url = f"http://127.0.0.1:{self.port}"
        super().__init__(
            [str(VENV_BIN / "daphne"), "-b", "127.0.0.1", "-p", str(self.port), "--access-log", os.devnull, app],
            tmp_path / f"{name}-{self.port}.log",
            env=server_env(**env),
        )
        wait_until(self._healthy, timeout=30, message=f"daphne on {self.port} (log: {self.log_path})")

    def _healthy(self) -> bool:
        if not self.alive:
            raise AssertionError(f"daphne exited: {self.log()}")
        with urllib.request.urlopen(f"{self.url}/healthz", timeout=2) as response:  # noqa: S310 - loopback
            return response.status == 200

    def restart(self) -> None:
        self.stop()
        self.__init__(self.log_path.parent, port=self.port, app=self.app)  # type: ignore[misc]


@contextlib.contextmanager
def logged_in(server_url: str, username: str, password: str) -> Iterator[httpx.Client]:
    """An HTTP session of a user on a real server, logged in through the login form (users without OTP)."""
    with httpx.Client(base_url=server_url, timeout=15) as client:
        client.get("/accounts/login/").raise_for_status()
        response = client.post("/accounts/login/", data={
            "username": username, "password": password, "csrfmiddlewaretoken": client.cookies["csrftoken"]})
        assert response.status_code == 302, response.text[:500]
        yield client


def csrf(client: httpx.Client) -> dict[str, str]:
    """The header a browser-session POST needs."""
    return {"X-CSRFToken": client.cookies["csrftoken"]}


def npm_cli(package: str, version: str, binary: str, *, env_var: str, cache_name: str, home_cache: str) -> str:
    """A real agent CLI from npm, pinned: ``$env_var`` if set, else one cached in ``.cache/<cache_name>``
    (or ``~/.cache/<home_cache>``), else installed there once (test workers side by side wait on a lock
    and find it installed). Never committed; skips only when npm itself is missing or the install fails."""
    if os.environ.get(env_var):
        return os.environ[env_var]
    folders = [ROOT / ".cache" / cache_name, Path.home() / ".cache" / home_cache]
    for folder in folders:
        candidate = folder / "node_modules" / ".bin" / binary
        if _cli_version_is(candidate, version):
            return str(candidate)
    if not shutil.which("npm"):
        pytest.skip(f"npm is not installed: cannot install {package}")
    folder = folders[0]
    folder.mkdir(parents=True, exist_ok=True)
    candidate = folder / "node_modules" / ".bin" / binary
    with open(folder.parent / f"{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _cli_version_is(candidate, version):
            return str(candidate)
        done = subprocess.run(["npm", "install", "--prefix", str(folder), "--no-audit", "--no-fund",
                               f"{package}@{version}"], capture_output=True, text=True, timeout=600)
    if done.returncode != 0 or not candidate.exists():
        pytest.skip(f"could not install {package}: {done.stderr[-500:]}")
    return str(candidate)


def _cli_version_is(path: Path, version: str) -> bool:
    if not path.exists():
        return False
    try:
        out = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return version in out.split()  # "2.1.197 (Claude Code)", "codex-cli 0.171.0"
