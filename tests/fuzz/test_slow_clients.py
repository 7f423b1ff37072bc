"""Slowloris and oversized input against the bridge's loopback server (in-process) and daphne (e2e): slow
connections are dropped within a bound, memory stays bounded, and a normal client is served meanwhile."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from clients.bridge import local_api
from tests.e2e_support import Daphne
from tests.fuzz.slow_clients import Slowloris, rss_kib
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


# --- daphne (e2e): one real process, the documented command line ---------------------------------------


@pytest.fixture
def daphne(tmp_path):
    # A 2 s head deadline instead of the default 10 s: the same mechanism, a shorter test.
    server = Daphne(tmp_path, AI1NET_HTTP_HEAD_TIMEOUT_SEC="2")
    yield server
    server.stop()
    assert "Traceback" not in server.log(), server.log()[-3000:]


def served_quickly(server: Daphne, bound: float = 3.0) -> float:
    """A normal client's request, answered within ``bound`` seconds (a loaded 2-core machine included)."""
    started = time.monotonic()
    response = httpx.get(f"{server.url}/healthz", timeout=bound)
    assert response.status_code == 200
    took = time.monotonic() - started
    assert took < bound, took
    return took


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_daphne_drops_slowloris_and_serves_others_meanwhile(daphne):
    rss_before = rss_kib(daphne.popen.pid)
    slow = Slowloris(daphne.port, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 8000,
                     count=50, interval=0.5)
    try:
        time.sleep(1.0)
        served_quickly(daphne)  # while 50 slow heads are open
        assert slow.wait_all_dropped(timeout=2 + 8), f"still open: {50 - len(slow.dropped_after)} of 50"
        assert max(slow.dropped_after.values()) < 2 + 4, slow.dropped_after  # the 2 s deadline, a loaded machine
        assert min(slow.sent) >= 3  # they were trickling, not refused at once
        served_quickly(daphne)
        assert rss_kib(daphne.popen.pid) - rss_before < 20 * 1024
    finally:
        slow.close()


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_a_kept_alive_connection_outlives_the_head_deadline_of_its_answered_request(daphne):
    """The deadline of a request that arrived whole is cancelled: a connection kept alive and idle past it is
    not closed with a 408, and its next request is answered."""
    with socket.create_connection(("127.0.0.1", daphne.port), timeout=10) as sock:
        reader = sock.makefile("rb")
        for _ in range(2):
            sock.sendall(f"POST /api/devices/bridge/push HTTP/1.1\r\nHost: 127.0.0.1:{daphne.port}\r\n"
                         f"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{{}}".encode())
            status = reader.readline()
            assert status.startswith(b"HTTP/1.1 401"), status  # the app's answer (no device token), not a 408
            length = 0
            while (line := reader.readline()) != b"\r\n":
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            reader.read(length)
            time.sleep(2 + 1.5)  # past the 2 s deadline and its body's allowance


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_twisted_writes_no_access_line_of_its_own(tmp_path):
    """daphne writes the access log; Twisted's HTTP factory formatted a second line per request into Twisted's
    log (which daphne discards, or at -v 2 hands to Python's logging)."""
    server = Daphne(tmp_path, app="tests.twisted_log_asgi:application")
    try:
        assert httpx.get(f"{server.url}/healthz", headers={"User-Agent": "access-line-probe"}, timeout=10).is_success
        events = httpx.get(f"{server.url}/test/twisted-log", timeout=10).json()
        assert not [event for event in events if "access-line-probe" in event or "/healthz" in event], events
    finally:
        server.stop()


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_daphne_refuses_a_body_over_every_limit_unread(daphne):
    """Before, daphne read the whole body (to memory or a temporary file) and only then let the app refuse it."""
    rss_before = rss_kib(daphne.popen.pid)
    with socket.create_connection(("127.0.0.1", daphne.port), timeout=10) as sock:
        sock.sendall(b"POST /api/devices/bridge/push HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 10000000000\r\n\r\n" + b"[" * 65536)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413"), answer[:300]
    assert json.loads(body)["error"] == "too_large"
    served_quickly(daphne)
    assert rss_kib(daphne.popen.pid) - rss_before < 20 * 1024


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_daphne_hands_a_form_body_to_the_app_unparsed(daphne):
    """Twisted parsed form bodies for daphne, which never used the result (a multipart one whole): a body
    it could not parse was its own bare 400 before the app saw it. Now Django answers (CSRF: 403)."""
    response = httpx.post(f"{daphne.url}/accounts/login/", content=b"not a multipart body",
                          headers={"Content-Type": "multipart/form-data; boundary=x"}, timeout=10)
    assert response.status_code == 403, response.text[:300]
    assert "CSRF" in response.text
    served_quickly(daphne)


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_daphne_drops_a_tunnel_frame_over_the_limit_and_other_devices_carry_on(daphne, user):
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    from clients import protocol
    from devices import services

    _, token = services.device_create(owner=user, name="big", kind="bridge")
    _, other_token = services.device_create(owner=user, name="other", kind="bridge")
    url = f"ws://127.0.0.1:{daphne.port}{protocol.TUNNEL_PATH}"

    def hello(ws) -> None:
        ws.send(protocol.request(protocol.HELLO, {"protocolVersion": 1, "kind": "bridge", "version": "t"}, "h"))
        assert "result" in json.loads(ws.recv(timeout=10))

    rss_before = rss_kib(daphne.popen.pid)
    with connect(url, additional_headers={"Authorization": f"Bearer {other_token}"}, max_size=None) as other:
        hello(other)
        with connect(url, additional_headers={"Authorization": f"Bearer {token}"}, max_size=None) as big:
            hello(big)
            with pytest.raises(ConnectionClosed) as closed:
                big.send("x" * (3 * protocol.MAX_FRAME_BYTES))
                while True:
                    big.recv(timeout=10)
            # autobahn fails the connection (1009), or drops it while the frame is still coming (no close frame)
            assert closed.value.rcvd is None or closed.value.rcvd.code in (1009, protocol.CLOSE_PROTOCOL_ABUSE)
        other.send(protocol.request("devices.ping", {}, "p1"))
        reply = json.loads(other.recv(timeout=10))
        while reply.get("id") != "p1":
            reply = json.loads(other.recv(timeout=10))
        assert reply["result"]["pong"] is True
    served_quickly(daphne)
    assert rss_kib(daphne.popen.pid) - rss_before < 48 * 1024
