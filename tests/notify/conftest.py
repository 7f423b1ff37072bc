"""Notification fixtures: a fake push service / ntfy server on 127.0.0.1, a browser's key pair."""

from __future__ import annotations

import base64
import os
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from notify import vapid


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class FakePushService:
    """Records every request; answers each path with the status set in ``statuses`` (default 201)."""

    url: str = ""
    received: list[Received] = field(default_factory=list)
    statuses: dict[str, int] = field(default_factory=dict)
    redirects: dict[str, str] = field(default_factory=dict)

    def for_path(self, path: str) -> list[Received]:
        return [r for r in self.received if r.path == path]


@pytest.fixture
def push_service():
    fake = FakePushService()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - the stdlib's name
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            fake.received.append(Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
            if self.path in fake.redirects:
                self.send_response(307)
                self.send_header("Location", fake.redirects[self.path])
            else:
                self.send_response(fake.statuses.get(self.path, 201))
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield fake
    server.shutdown()
    server.server_close()


@dataclass
class BrowserKeys:
    """What a browser's PushManager holds: its P-256 key pair and the auth secret."""

    private_key: ec.EllipticCurvePrivateKey
    auth_secret: bytes

    @property
    def p256dh(self) -> str:
        return b64url(self.private_key.public_key().public_bytes(serialization.Encoding.X962,
                                                                 serialization.PublicFormat.UncompressedPoint))

    @property
    def auth(self) -> str:
        return b64url(self.auth_secret)

    def subscription(self, endpoint: str) -> dict:
        return {"endpoint": endpoint, "expirationTime": None, "keys": {"p256dh": self.p256dh, "auth": self.auth}}


@pytest.fixture
def browser_keys() -> BrowserKeys:
    return BrowserKeys(ec.generate_private_key(ec.SECP256R1()), os.urandom(16))


@pytest.fixture(autouse=True)
def _notify_settings(settings, tmp_path):
    """Keys made in a temporary file, local targets allowed, a short window (for the test's own dispatcher,
    tests/conftest.py)."""
    settings.VAPID_PRIVATE_KEY = ""
    settings.VAPID_PUBLIC_KEY = ""
    settings.VAPID_KEY_FILE = tmp_path / "vapid.json"
    settings.VAPID_SUBJECT = "mailto:ops@ai1net.example"
    settings.NOTIFY_ALLOW_PRIVATE_TARGETS = True
    settings.NOTIFY_COALESCE_SEC = 0.3
    settings.NOTIFY_TIMEOUT_SEC = 5
    vapid._cache.clear()
    yield
    vapid._cache.clear()
