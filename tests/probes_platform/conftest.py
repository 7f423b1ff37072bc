"""Fixtures for the platform side of probes. The probe itself is faked at `probes.services.device_call`
(the seam the gateway calls the devices app through); end-to-end tests with a real probe live elsewhere."""

from __future__ import annotations

import secrets
import threading
from typing import Any

import pytest

from ai1net.accounts.services import api_token_create
from devices.models import Device
from probes.services import background_join


class FakeProbe:
    """Stands in for `devices.services.device_call`: records every call; answers per method."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict]] = []
        self.answers: dict[str, Any] = {}
        self._lock = threading.Lock()
        self.gate = threading.Event()  # answers that block wait on it; set at teardown at the latest

    def __call__(self, *, device: Device, method: str, params: dict, timeout: float) -> dict:
        with self._lock:
            self.calls.append((str(device.pk), method, params))
        answer = self.answers.get(method, {"ok": True})
        if isinstance(answer, BaseException):
            raise answer
        if callable(answer):
            return answer(params)
        return answer

    def release_all(self) -> None:
        self.gate.set()

    def methods(self) -> list[str]:
        with self._lock:
            return [method for _, method, _ in self.calls]


@pytest.fixture
def fake_probe(monkeypatch):
    fake = FakeProbe()
    monkeypatch.setattr("probes.services.device_call", fake)
    yield fake
    # Background calls (and their room posts) must end before the database is flushed.
    fake.release_all()
    assert background_join(10), "a probe command thread is still running"


def make_probe(owner: Any, name: str = "laptop", *, online: bool = True, modes: tuple[str, ...] = (),
               roots: tuple[str, ...] = ("/home/alice/proj",), status: str = Device.Status.ACTIVE) -> Device:
    return Device.objects.create(
        owner=owner, name=name, kind=Device.Kind.PROBE, status=status, hostname=f"{name}.local",
        token_hash=secrets.token_hex(32), ephemeral=True,
        channel_name=f"specific.fake!{secrets.token_hex(4)}" if online else "",
        capabilities=["read", "read_tree", "grep", *modes], roots=list(roots),
    )


@pytest.fixture
def probe(user) -> Device:
    return make_probe(user)


@pytest.fixture
def writable_probe(user) -> Device:
    return make_probe(user, "server", modes=("write", "exec"))


@pytest.fixture
def token(user) -> str:
    return api_token_create(user=user, name="agent")[1]
