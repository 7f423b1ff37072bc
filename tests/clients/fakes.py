"""Small stand-ins for the platform, for testing the clients without Django: a tunnel endpoint
(websockets server) and the pairing HTTP endpoints."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from websockets.asyncio.server import serve
from websockets.exceptions import ConnectionClosed

from clients import protocol


class FakeTunnelServer:
    """Speaks the platform side of the tunnel: hello, deliver/ack, heartbeats, requests both ways.

    Hooks let a test misbehave: ``close_on_connect`` (close code), ``silent`` (never send after
    hello), ``on_request(ws, message) -> frame | None`` (None: answer nothing).
    """

    def __init__(self, *, token: str = "good-token", heartbeat_sec: float = 20) -> None:
        self.token = token
        self.heartbeat_sec = heartbeat_sec
        self.items: list[tuple[int, str, dict]] = []
        self.acked = 0
        self.hellos: list[dict] = []
        self.handshakes: list[dict[str, Any]] = []
        self.requests: list[dict] = []  # device -> platform requests, in arrival order
        self.responses: list[dict] = []  # device's answers to our requests
        self.heartbeats = 0
        self.close_codes: list[int | None] = []
        self.close_on_connect: int | None = None
        self.silent = False
        self.on_request = None
        self.current = None
        self.connected = asyncio.Event()
        self._server = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> FakeTunnelServer:
        self._server = await serve(self._handle, "127.0.0.1", 0, max_size=protocol.MAX_FRAME_BYTES, ping_interval=None)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        await self._server.wait_closed()

    def add_items(self, count: int, kind: str = "test.item") -> None:
        start = len(self.items) + 1
        self.items.extend((seq, kind, {"n": seq}) for seq in range(start, start + count))

    async def deliver_new(self) -> None:
        """Send every item after the acked seq on the live connection (a doorbell)."""
        if self.current is not None:
            for seq, kind, payload in self.items:
                if seq > self.acked:
                    await self.current.send(protocol.notification(protocol.DELIVER, {"seq": seq, "kind": kind, "payload": payload}))

    async def request(self, method: str, params: dict, request_id: str) -> None:
        await self.current.send(protocol.request(method, params, request_id))

    async def _handle(self, ws) -> None:
        self.handshakes.append({"path": ws.request.path, "authorization": ws.request.headers.get("Authorization")})
        try:
            if ws.request.headers.get("Authorization") != f"Bearer {self.token}":
                await ws.close(protocol.CLOSE_UNAUTHORIZED, "bad token")
                return
            if self.close_on_connect:
                await ws.close(self.close_on_connect, protocol.CLOSE_REASONS.get(self.close_on_connect, ""))
                return
            hello = protocol.parse(await ws.recv())
            assert hello["method"] == protocol.HELLO
            self.hellos.append(hello["params"])
            self.acked = max(self.acked, hello["params"]["ackedSeq"])
            await ws.send(protocol.result(hello["id"], {
                "deviceId": "dev-1", "heartbeatSec": self.heartbeat_sec, "protocolVersion": protocol.PROTOCOL_VERSION,
                "resendFrom": self.acked + 1,
            }))
            self.current = ws
            self.connected.set()
            if not self.silent:
                await self.deliver_new()
            async for text in ws:
                message = protocol.parse(text)
                if protocol.is_response(message):
                    self.responses.append(message)
                elif message.get("method") == protocol.ACK:
                    self.acked = max(self.acked, message["params"]["seq"])
                elif message.get("method") == protocol.HEARTBEAT:
                    self.heartbeats += 1
                elif protocol.is_request(message):
                    self.requests.append(message)
                    frame = (self.on_request or _echo)(ws, message)
                    if asyncio.iscoroutine(frame):
                        frame = await frame
                    if frame is not None:
                        await ws.send(frame)
        except ConnectionClosed:
            pass
        finally:
            if self.current is ws:
                self.current = None
                self.connected.clear()
            self.close_codes.append(ws.close_code)


def _echo(ws, message: dict) -> str:
    return protocol.result(message["id"], {"echo": message["params"], "method": message["method"]})


class FakePairingServer:
    """The two pairing endpoints, answering the token poll from a script of responses."""

    def __init__(self, *, token_answers: list[tuple[int, dict]], interval: int = 5, expires_in: int = 600,
                 grant_status: int = 201) -> None:
        self.token_answers = list(token_answers)
        self.interval = interval
        self.expires_in = expires_in
        self.grant_status = grant_status
        self.grant_requests: list[dict] = []
        self.token_requests: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/api/devices/pairings":
                    outer.grant_requests.append(body)
                    status, answer = outer.grant_status, {
                        "device_code": "d" * 43, "user_code": "BCDF-GHJK",
                        "verification_uri": f"{outer.url}/pair/",
                        "verification_uri_complete": f"{outer.url}/pair/BCDF-GHJK",
                        "expires_in": outer.expires_in, "interval": outer.interval,
                    }
                elif self.path == "/api/devices/pairings/token":
                    outer.token_requests.append(body)
                    status, answer = outer.token_answers.pop(0) if outer.token_answers else (400, {"error": "authorization_pending"})
                else:
                    status, answer = 404, {"error": "not_found"}
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> FakePairingServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def pending() -> tuple[int, dict]:
    return 400, {"error": "authorization_pending"}


def approved(device_id: str = "8d5c0d1e-0000-4000-8000-000000000001", token: str = "t" * 43) -> tuple[int, dict]:
    return 200, {"device_id": device_id, "device_token": token}
