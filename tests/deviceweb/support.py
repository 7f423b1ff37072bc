"""Helpers for device-web tests: a local upstream service, a bridge with exposed ports, a logged-in
browser session, memory readings of real processes."""

from __future__ import annotations

import contextlib
import os
import random
import socket
import sys
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import httpx

from clients.common.credentials import Credential, save_credential
from devices import services
from devices.models import Device
from tests.e2e_support import Daphne, Process, wait_until

HERE = Path(__file__).resolve().parent


def web_port(avoid: Collection[int] = ()) -> int:
    """A free loopback port in the range device web may expose (20000-20999), none of ``avoid``."""
    for _ in range(200):
        port = random.randint(20000, 20999)  # noqa: S311 - picking a test port
        if port in avoid:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-20999")


def client_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "DATABASE_URL", "REDIS_URL"))}
    env.update({"PYTHONUNBUFFERED": "1", "AI1NET_BACKOFF_CAP": "1"})
    return env


class Upstream(Process):
    """tests/deviceweb/upstream.py on 127.0.0.1: HTTP on ``port``, a WebSocket echo on ``ws_port``."""

    def __init__(self, logs: Path, name: str = "upstream") -> None:
        # A port found free can be taken before the service binds it (other workers pick in the same
        # range): then it starts again on other ports.
        for attempt in range(5):
            self.port = web_port()
            self.ws_port = web_port(avoid={self.port})
            super().__init__([sys.executable, str(HERE / "upstream.py"), str(self.port), str(self.ws_port)],
                             logs / f"{name}-{attempt}.log", env=client_env())
            # Its own "ready" line: "ready" alone is also in the "address already in use" of a failed start.
            wait_until(lambda: "ready" in self.log().splitlines() or not self.alive, timeout=20,
                       message="the upstream service")
            if self.alive or "address already in use" not in self.log():
                break
            self.stop()
        assert self.alive, self.log()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def hits(self) -> int:
        return httpx.get(f"{self.url}/hits", timeout=5).json()["hits"]


class Bridge(Process):
    """A paired bridge (device created directly, credential on disk) running with ``--expose``."""

    def __init__(self, server: Daphne, owner: Any, home: Path, ports: list[int], name: str = "desk",
                 **env: str) -> None:
        self.device, token = services.device_create(owner=owner, name=name, kind=Device.Kind.BRIDGE)
        self.home = home
        save_credential(home, Credential(url=server.url, device_id=str(self.device.pk), token=token, kind="bridge",
                                         name=name))
        argv = [sys.executable, "-m", "clients.bridge", "--home", str(home), "run"]
        for port in ports:
            argv += ["--expose", str(port)]
        super().__init__(argv, home.parent / f"bridge-{name}.log", env=dict(client_env(), **env))
        wait_until(self.online, timeout=30, message=f"bridge {name} online (log: {self.log_path})")

    def online(self) -> bool:
        if not self.alive:
            raise AssertionError(f"the bridge exited: {self.log()}")
        return Device.objects.get(pk=self.device.pk).is_online

    def offline(self) -> bool:
        return not Device.objects.get(pk=self.device.pk).is_online

    @property
    def prefix(self) -> str:
        return f"/d/{self.device.pk}"


def enable_device_web(user: Any) -> Any:
    user.device_web_enabled = True
    user.save(update_fields=["device_web_enabled"])
    return user


@contextlib.contextmanager
def browser(server: Daphne, username: str, password: str, **kwargs: Any) -> Iterator[httpx.Client]:
    """An httpx session of a logged-in user on the real server (no OTP enrolled)."""
    with httpx.Client(base_url=server.url, timeout=kwargs.pop("timeout", 30), **kwargs) as client:
        client.get("/accounts/login/").raise_for_status()
        response = client.post("/accounts/login/", data={
            "username": username, "password": password, "csrfmiddlewaretoken": client.cookies["csrftoken"]})
        assert response.status_code == 302, response.text[:500]
        yield client


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")
