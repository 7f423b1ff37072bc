"""The daemon's loopback API: 127.0.0.1 only, local secret, no browser Origin, loopback Host only."""

from __future__ import annotations

import asyncio
import http.client
import json
import select
import socket

import pytest

from clients.bridge.local_api import LocalApi, RequestRefused


@pytest.fixture
async def api(tmp_path):
    calls = []

    async def backend(route, body):
        calls.append((route, body))
        if route == "boom":
            raise RuntimeError("bug")
        if route == "refuse":
            raise RequestRefused(404, "not_found")
        return {"route": route, "echo": body}

    server = LocalApi(tmp_path, backend)
    server.start()
    server.calls = calls
    yield server
    server.stop()


def request(api, path="/v1/health", *, body=b"{}", headers=None, host=None, method="POST"):
    def go():
        connection = http.client.HTTPConnection("127.0.0.1", api.port, timeout=5)
        connection.putrequest(method, path, skip_host=True)
        connection.putheader("Host", host or f"127.0.0.1:{api.port}")
        sent = {"X-AI1NET-Secret": api.secret, "Content-Type": "application/json"}
        sent.update(headers or {})
        for key, value in sent.items():
            if value is not None:
                connection.putheader(key, value)
        connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body)
        response = connection.getresponse()
        data = response.read()
        connection.close()
        return response.status, json.loads(data)

    return asyncio.to_thread(go)


async def test_a_good_request_reaches_the_backend(api):
    assert await request(api, "/v1/health", body=b'{"a": 1}') == (200, {"route": "health", "echo": {"a": 1}})
    status, _ = await request(api, host=f"localhost:{api.port}")
    assert status == 200


async def test_local_json_is_private_and_names_the_port_and_secret(api, tmp_path):
    info = json.loads((tmp_path / "local.json").read_text())
    assert info["port"] == api.port and info["secret"] == api.secret and info["pid"]
    assert len(api.secret) >= 32
    assert (tmp_path / "local.json").stat().st_mode & 0o777 == 0o600


async def test_wrong_or_missing_secret_is_refused(api):
    assert await request(api, headers={"X-AI1NET-Secret": "nope"}) == (401, {"error": "bad_secret"})
    assert await request(api, headers={"X-AI1NET-Secret": None}) == (401, {"error": "bad_secret"})
    assert api.calls == []


async def test_a_browser_origin_is_refused_even_with_the_secret(api):
    assert await request(api, headers={"Origin": "http://127.0.0.1:1"}) == (403, {"error": "origin_refused"})
    assert await request(api, headers={"Origin": "null"}) == (403, {"error": "origin_refused"})
    assert api.calls == []


@pytest.mark.parametrize("host", ["evil.example", "evil.example:{port}", "127.0.0.1", "127.0.0.1:1", "0.0.0.0:{port}"])
async def test_a_non_loopback_host_is_refused(api, host):
    status, body = await request(api, host=host.format(port=api.port))
    assert (status, body) == (403, {"error": "host_refused"})
    assert api.calls == []


async def test_bad_bodies_unknown_routes_and_backend_errors(api):
    assert (await request(api, body=b"not json"))[0] == 400
    assert (await request(api, body=b"[1]"))[0] == 400
    assert (await request(api, "/other"))[0] == 404
    assert (await request(api, "/v1/refuse"))[0] == 404
    assert await request(api, "/v1/boom") == (500, {"error": "internal"})


async def test_a_burst_of_connections_is_accepted_at_once(api):
    # All the hooks waiting on a restarted daemon connect together; a full accept queue drops SYNs and
    # the kernel retries them only after a second or more (the bridge kill -9 fault test saw ~25 s).
    sockets = [socket.socket() for _ in range(200)]
    try:
        for sock in sockets:
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", api.port))
        connected = set()
        deadline = asyncio.get_running_loop().time() + 0.8  # under the first SYN retry (1 s)
        while len(connected) < len(sockets) and asyncio.get_running_loop().time() < deadline:
            _, writable, _ = select.select([], [s for s in sockets if s not in connected], [], 0.05)
            connected.update(s for s in writable if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0)
        assert len(connected) == len(sockets)
    finally:
        for sock in sockets:
            sock.close()
    assert (await request(api))[0] == 200


async def test_binds_loopback_only(api):
    assert api._server.server_address[0] == "127.0.0.1"
    addresses = {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)}
    for address in addresses - {"127.0.0.1", "127.0.1.1"}:
        with pytest.raises(OSError):
            socket.create_connection((address, api.port), timeout=1).close()


async def test_a_restart_keeps_the_secret_and_prefers_the_same_port(tmp_path):
    async def backend(route, body):
        return {}

    first = LocalApi(tmp_path, backend)
    first.start()
    port, secret = first.port, first.secret
    first.stop()
    second = LocalApi(tmp_path, backend)
    second.start()
    try:
        assert second.secret == secret
        assert second.port == port
    finally:
        second.stop()
