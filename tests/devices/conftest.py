from __future__ import annotations

import pytest
from django.test import Client

from devices import signals


@pytest.fixture
def device_client() -> Client:
    """A client as a device would be: no session, no CSRF cookie."""
    return Client(enforce_csrf_checks=True, REMOTE_ADDR="203.0.113.7")


@pytest.fixture
def start_pairing(device_client):
    def start(**overrides):
        body = {"name": "laptop", "kind": "bridge", "hostname": "host1", "os": "Linux", "version": "0.1", **overrides}
        response = device_client.post("/api/devices/pairings", body, content_type="application/json")
        assert response.status_code == 201, response.content
        return response.json()

    return start


@pytest.fixture
def isolated_device_signals():
    """Silence the other apps' receivers of device_connected/disconnected for the test."""
    saved = {signal: list(signal.receivers) for signal in (signals.device_connected, signals.device_disconnected)}
    for signal in saved:
        signal.receivers = []
    yield
    for signal, receivers in saved.items():
        signal.receivers = receivers
