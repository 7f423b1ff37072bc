"""Fuzzing the bridge daemon's loopback API (clients.bridge.local_api) in-process, with the real mobile-reply
backend behind it and a fake tunnel: hostile routes, bodies, sizes, Host, Origin and secret headers.

Every answer is 200 or a 4xx whose JSON names the problem; never a 500, never an ERROR logged, and the
daemon answers its health check after each example.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clients.bridge import mobile
from clients.bridge.local_api import MAX_BODY_BYTES, SECRET_HEADER, LocalApi
from clients.bridge.mobile import MobileBridge
from tests.bridge.fakes import FakeTunnel
from tests.fuzz import strategies as hs
from tests.fuzz.conftest import SHARED_FIXTURE

pytestmark = [pytest.mark.slow]

ROUTES = ["health", "session-start", "pre-tool-use", "questions/wait", "questions/give-up", "post-tool-use",
          "user-prompt-submit", "stop", "sessions/wait-message", "session-end"]
BODY_KEYS = ["session_id", "tool_use_id", "cwd", "source", "title", "question_id", "reason", "tool_input",
             "tool_response", "window_sec", "timeout", "prompt", "stop_hook_active", "last_assistant_message",
             "hook_event_name", "answers", "questions"]


class Daemon:
    """The loopback API on a free port, its backend in an event loop on a thread of its own (as in the daemon)."""

    def __init__(self, home) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="fuzzed-daemon", daemon=True)
        self.thread.start()
        self.bridge = MobileBridge(home, FakeTunnel(), sweep_interval=3600)
        asyncio.run_coroutine_threadsafe(self.bridge.start(), self.loop).result(10)
        self.api = LocalApi(home, self.bridge.dispatch, self.loop, call_timeout=10)
        self.port = self.api.start()

    def request(self, method: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, Any]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=20)
        try:
            connection.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            for name, value in headers.items():
                connection.putheader(name, value)
            connection.endheaders(body)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def good_headers(self, body: bytes) -> dict[str, str]:
        return {"Host": f"127.0.0.1:{self.port}", SECRET_HEADER: self.api.secret,
                "Content-Type": "application/json", "Content-Length": str(len(body))}

    def healthy(self) -> bool:
        status, data = self.request("GET", "/v1/health", b"", self.good_headers(b""))
        return status == 200 and json.loads(data)["ok"] is True

    def stop(self) -> None:
        self.api.stop()
        asyncio.run_coroutine_threadsafe(self.bridge.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def daemon(tmp_path, monkeypatch) -> Iterator[Daemon]:
    # The wait routes hold a request up to a minute: the fuzzer looks at parsing, not at waiting.
    monkeypatch.setattr(mobile, "MAX_WAIT_SEC", 0.2)
    running = Daemon(tmp_path)
    yield running
    running.stop()


def check(status: int, data: bytes, sent: Any) -> None:
    assert status < 500, (status, sent, data[:300])
    answer = json.loads(data)
    assert isinstance(answer, dict), answer
    if status >= 400:
        assert isinstance(answer.get("error"), str) and answer["error"], (status, answer)


plausible_body = st.builds(
    lambda session, overrides: {"session_id": session, "tool_use_id": "toolu_1", "cwd": "/tmp", "timeout": 0,
                                "tool_input": {"questions": [{"question": "Which?", "options": [
                                    {"label": "A"}, {"label": "B"}]}]}, **overrides},
    st.uuids().map(str),
    st.dictionaries(st.sampled_from(BODY_KEYS), hs.hostile_field, min_size=1, max_size=3))
bodies = (st.builds(lambda body: hs.dumps(body).encode("utf-8", "surrogatepass"), plausible_body | hs.json_values)
          | st.binary(max_size=200) | st.builds(lambda text: text.encode("utf-8", "surrogatepass"), hs.garbage_text))
paths = (st.sampled_from(ROUTES).map(lambda route: f"/v1/{route}")
         | st.sampled_from(ROUTES).map(lambda route: f"/v1/{route}?x=1")
         | st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7e), max_size=40).map(lambda p: "/" + p))


@SHARED_FIXTURE
@given(method=st.sampled_from(["POST", "POST", "GET", "PUT", "DELETE", "OPTIONS", "HEAD"]), path=paths, body=bodies)
def test_hostile_requests_get_a_named_4xx_and_the_daemon_lives(daemon, error_log, method, path, body):
    mark = len(error_log.records)
    status, data = daemon.request(method, path, body, daemon.good_headers(body))
    if method not in ("OPTIONS", "HEAD"):  # the stdlib answers those itself (501, no body)
        check(status, data, (method, path, body[:300]))
    else:
        assert status < 500 or status == 501, status
    assert daemon.healthy()
    assert not error_log.since(mark), (path, body[:300], error_log.since(mark))


@SHARED_FIXTURE
@given(host=st.none() | st.sampled_from(["evil.example", "127.0.0.1", "localhost:1", "127.0.0.1.nip.io:{port}",
                                         "LOCALHOST:{port}", " 127.0.0.1:{port} ", "[::1]:{port}"]) | hs.nasty_text,
       origin=st.none() | st.sampled_from(["null", "http://127.0.0.1:{port}", "https://evil.example", ""]),
       secret=st.none() | st.sampled_from(["", "x" * 10_000, "{secret}x", "{secret_upper}"]) | hs.nasty_text)
def test_bad_host_origin_or_secret_is_refused(daemon, error_log, host, origin, secret):
    mark = len(error_log.records)
    fill = {"port": daemon.port, "secret": daemon.api.secret, "secret_upper": daemon.api.secret.upper()}
    headers = {"Content-Type": "application/json", "Content-Length": "2"}
    for name, value in (("Host", host), ("Origin", origin), (SECRET_HEADER, secret)):
        if value is not None:
            value = value.format(**fill) if "{" in value and name != SECRET_HEADER or value.startswith("{secret") \
                else value
            # http.client refuses control characters in a header value; the fuzzer sends what it can.
            headers[name] = value.encode("utf-8", "surrogatepass").decode("latin-1").replace("\r", "").replace(
                "\n", "").replace("\x00", "")
    good_host = headers.get("Host", "").strip().lower() in (f"127.0.0.1:{daemon.port}", f"localhost:{daemon.port}")
    allowed = good_host and origin is None and headers.get(SECRET_HEADER) == daemon.api.secret
    status, data = daemon.request("POST", "/v1/health", b"{}", headers)
    if allowed:
        assert status == 200, (headers, data)
    else:
        assert status in (401, 403), (headers, status, data)
        assert json.loads(data)["error"] in ("origin_refused", "host_refused", "bad_secret")
    assert daemon.healthy()
    assert not error_log.since(mark), error_log.since(mark)


@pytest.mark.parametrize("declared", [MAX_BODY_BYTES + 1, 10**12, -1, "abc", "1e3"])
def test_a_body_over_the_limit_or_a_bad_length_is_refused_unread(daemon, declared):
    headers = daemon.good_headers(b"")
    headers["Content-Length"] = str(declared)
    status, data = daemon.request("POST", "/v1/health", b"", headers)
    assert status in (400, 413)
    assert json.loads(data)["error"] == "bad_length"
    assert daemon.healthy()


def test_an_exception_escaping_a_request_thread_is_logged_not_printed(daemon, error_log, monkeypatch):
    """What the fuzzers look for ("no uncaught exception in the logs") must reach the log to be seen."""
    from clients.bridge.local_api import _Handler

    def broken(self, *, read_body):
        raise RuntimeError("a bug in a request thread")

    monkeypatch.setattr(_Handler, "_serve", broken)
    with pytest.raises((http.client.RemoteDisconnected, ConnectionResetError)):
        daemon.request("POST", "/v1/health", b"{}", daemon.good_headers(b"{}"))
    assert any("request from" in line and "a bug in a request thread" in line for line in error_log.since(0))
