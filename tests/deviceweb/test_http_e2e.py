"""Device web end to end: a real daphne, a real bridge process exposing ports, a local service."""

from __future__ import annotations

import hashlib
import json
import os
import time

import httpx
import pytest

from tests.deviceweb.support import browser, enable_device_web, web_port
from tests.e2e_support import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

def test_http_through_the_tunnel(stack, user, password):
    server, upstream, bridge, dead_port = stack
    base = f"{bridge.prefix}/{upstream.port}"
    with browser(server, user.username, password) as web:
        web.cookies.set("app", "keep-me")
        response = web.get(f"{base}/echo/a%20b?x=1&y=%2F", headers={
            "X-Forwarded-For": "6.6.6.6", "X-Custom": "kept", "Authorization": "Bearer for-the-device",
            "Accept": "application/json"})
        assert response.status_code == 200, response.text
        echoed = response.json()
        assert echoed["method"] == "GET" and echoed["target"] == "/echo/a%20b?x=1&y=%2F"
        sent = {}
        for name, value in echoed["headers"]:
            sent.setdefault(name.lower(), []).append(value)
        assert sent["host"] == [f"127.0.0.1:{upstream.port}"]
        assert sent["x-custom"] == ["kept"] and sent["authorization"] == ["Bearer for-the-device"]
        assert sent["x-forwarded-for"] == ["127.0.0.1"]  # ours, not the browser's 6.6.6.6
        assert sent["x-forwarded-proto"] == ["http"]
        assert sent["x-forwarded-host"] == [f"127.0.0.1:{server.port}"]
        assert sent["x-forwarded-prefix"] == [base]
        assert sent["cookie"] == ["app=keep-me"]  # the platform's sessionid and csrftoken stay behind
        assert "sessionid" not in json.dumps(echoed) and "keep-alive" not in sent
        # The device may not set the platform's session cookie; its own cookies pass.
        assert "sessionid=evil" not in response.headers.get_list("set-cookie")
        assert any(c.startswith("app=1") for c in response.headers.get_list("set-cookie"))
        assert response.headers["x-upstream"] == "yes"

        # A request body streams to the device (8 MB, chunked by the client).
        body = os.urandom(8 * 1024 * 1024)
        response = web.post(f"{base}/echo", content=iter([body[i:i + 100_000] for i in range(0, len(body), 100_000)]))
        assert response.status_code == 200, response.text
        assert response.json()["body_len"] == len(body)
        assert response.json()["body_sha256"] == hashlib.sha256(body).hexdigest()
        response = web.put(f"{base}/echo", content=b"x" * 1000)
        assert response.json()["method"] == "PUT" and response.json()["body_len"] == 1000

        # Chunked responses, HEAD, the upstream's own 404, the bare prefix redirect.
        response = web.get(f"{base}/bytes?n=300000&chunked=1")
        assert response.status_code == 200 and len(response.content) == 300000
        head = web.head(f"{base}/bytes?n=5000")
        assert head.status_code == 200 and head.headers["content-length"] == "5000" and head.content == b""
        assert web.get(f"{base}/nope").status_code == 404
        redirect = web.get(base)
        assert redirect.status_code == 308 and redirect.headers["location"] == base + "/"

        # A declared port with nothing listening: 502 from the device, with a plain page for browsers.
        response = web.get(f"{bridge.prefix}/{dead_port}/", headers={"Accept": "text/html"})
        assert response.status_code == 502 and "Nothing answers" in response.text
        # A port the device never declared: 502 at the platform's gate. Not the declared dead port, which is
        # free too (a random pick once hit it: the device's 502, upstream_unreachable).
        response = web.get(f"{bridge.prefix}/{web_port(avoid={dead_port})}/echo")
        assert response.status_code == 502 and response.json()["error"] == "port_not_exposed"

        # A local server that never answers: 504 after the first-byte timeout (3 s here), and the tunnel
        # still serves the next request.
        started = time.monotonic()
        response = web.get(f"{base}/hang")
        assert response.status_code == 504 and response.json()["error"] == "device_timeout"
        assert 2.5 < time.monotonic() - started < 10
        assert web.get(f"{base}/small").text == "ok"

        # Device offline: 503 page saying so.
        bridge.stop()
        wait_until(bridge.offline, timeout=15, message="the device offline")
        response = web.get(f"{base}/echo", headers={"Accept": "text/html"})
        assert response.status_code == 503 and "offline" in response.text


def test_server_sent_events_arrive_chunk_by_chunk(stack, user, password):
    server, upstream, bridge, _ = stack
    with browser(server, user.username, password) as web:
        arrivals = []
        with web.stream("GET", f"{bridge.prefix}/{upstream.port}/sse?count=5&gap=0.4") as response:
            assert response.status_code == 200
            assert response.headers["content-type"] == "text/event-stream"
            for line in response.iter_lines():
                if line.startswith("data: "):
                    _, index, sent_at = line.split(" ")
                    arrivals.append((int(index), float(sent_at), time.time()))
    assert [i for i, _, _ in arrivals] == [0, 1, 2, 3, 4]
    # Each event reached the browser well before the next one was written (0.4 s later).
    for _, sent_at, arrived_at in arrivals:
        assert arrived_at - sent_at < 0.3, arrivals
    assert arrivals[-1][2] - arrivals[0][2] > 1.2  # spread out, not delivered in one lump at the end


def test_no_session_and_someone_elses_device(stack, user, other_user, password):
    server, upstream, bridge, _ = stack
    base = f"{bridge.prefix}/{upstream.port}"
    before = upstream.hits()
    with httpx.Client(base_url=server.url, timeout=10) as anonymous:
        response = anonymous.get(f"{base}/echo")
        assert response.status_code == 401 and response.json()["error"] == "not_authenticated"
        page = anonymous.get(f"{base}/echo?a=1", headers={"Accept": "text/html"})
        assert page.status_code == 302 and page.headers["location"].startswith("/accounts/login/?next=/d/")
    enable_device_web(other_user)
    with browser(server, other_user.username, password) as web:
        assert web.get(f"{base}/echo").status_code == 404
    assert upstream.hits() == before  # nothing reached the device's service
