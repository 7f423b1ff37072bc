"""Slowloris and oversized input against the bridge's loopback server (in-process) and daphne (e2e): slow
connections are dropped within a bound, memory stays bounded, and a normal client is served meanwhile."""

from __future__ import annotations

import json
import socket
import time

import pytest

from clients.bridge import local_api
from tests.fuzz.slow_clients import Slowloris
from tests.fuzz.test_bridge_api_fuzz import Daemon

SLOW_HEAD = b"POST /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 4000


@pytest.mark.slow
def test_bridge_drops_slowloris_and_serves_the_hook_meanwhile(tmp_path, monkeypatch):
    # The same mechanism as the real 5 s, shorter so the test stays short.
    monkeypatch.setattr(local_api, "REQUEST_READ_SEC", 1.5)
    monkeypatch.setattr(local_api._Handler, "timeout", 1.5)
    daemon = Daemon(tmp_path)
    slow = Slowloris(daemon.port, SLOW_HEAD, count=20, interval=0.25)
    try:
        time.sleep(0.5)
        started = time.monotonic()
        assert daemon.healthy()  # while 20 slow connections are open
        assert time.monotonic() - started < 2.0
        assert slow.wait_all_dropped(timeout=10), f"still open: {20 - len(slow.dropped_after)} of 20"
        assert max(slow.dropped_after.values()) < 1.5 + 3.0, slow.dropped_after
        assert min(slow.sent) >= 3  # they were trickling, not refused at once
        assert daemon.healthy()
    finally:
        slow.close()
        daemon.stop()


@pytest.mark.slow
def test_bridge_drops_a_client_that_stops_in_the_middle_of_its_body(tmp_path, monkeypatch):
    monkeypatch.setattr(local_api, "REQUEST_READ_SEC", 1.5)
    monkeypatch.setattr(local_api._Handler, "timeout", 1.5)
    daemon = Daemon(tmp_path)
    head = (f"POST /v1/health HTTP/1.1\r\nHost: 127.0.0.1:{daemon.port}\r\n{local_api.SECRET_HEADER}: "
            f"{daemon.api.secret}\r\nContent-Length: 100000\r\n\r\n").encode() + b" " * 100_000
    sock = socket.create_connection(("127.0.0.1", daemon.port), timeout=10)
    try:
        sock.sendall(head[:len(head) - 100_000 + 10])  # the head and 10 bytes of the body, then nothing
        started = time.monotonic()
        assert sock.recv(65536) == b""  # closed, not answered
        assert time.monotonic() - started < 1.5 + 3.0
        assert json.loads(daemon.request("GET", "/v1/health", b"", daemon.good_headers(b""))[1])["ok"]
    finally:
        sock.close()
        daemon.stop()
