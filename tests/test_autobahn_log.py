"""ai1net.autobahn_log: a new WebSocket connection's settings are pretty-printed only if logged."""

from __future__ import annotations

import os
import pprint
import subprocess
import sys

from ai1net import autobahn_log


def test_the_served_app_installs_it():
    script = ("import ai1net.asgi; from autobahn.websocket import protocol; "
              "from ai1net.autobahn_log import LazyPformat; print(protocol.pformat is LazyPformat)")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60,
                         env={**os.environ, "DJANGO_SETTINGS_MODULE": "ai1net.settings"})
    assert out.stdout.strip() == "True"


def test_a_connection_made_formats_nothing_until_the_line_is_written(monkeypatch):
    from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
    from autobahn.websocket import protocol
    from twisted.test import proto_helpers

    assert autobahn_log.install() and autobahn_log.install()  # (twice: still installed once)
    calls = []
    real = pprint.pformat
    monkeypatch.setattr(pprint, "pformat", lambda value, *a, **k: calls.append(1) or real(value, *a, **k))
    captured = []
    factory = WebSocketServerFactory("ws://127.0.0.1:9")
    factory.protocol = WebSocketServerProtocol
    server = factory.buildProtocol(("127.0.0.1", 0))
    monkeypatch.setattr(server.log, "debug", lambda fmt, **kw: captured.append((fmt, kw)))
    server.makeConnection(proto_helpers.StringTransport())
    assert calls == []  # the settings list was not pretty-printed ...
    settings_line = next(kw["attrs"] for fmt, kw in captured if "attrs" in kw)
    text = f"\n{settings_line}"  # ... until the line is written, then exactly as before
    assert calls and "maxFramePayloadSize" in text
    timings = protocol.Timings()
    timings.track("a")
    assert isinstance(str(timings), str) and "'a'" in str(timings)
