"""Helpers for tunnel consumer tests (WebsocketCommunicator against the real ASGI application)."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

from channels.testing import WebsocketCommunicator

from ai1net.asgi import application
from clients import protocol


class Device:
    """A scripted device on one WebSocket connection."""

    def __init__(self, token: str | None) -> None:
        headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
        self.comm = WebsocketCommunicator(application, protocol.TUNNEL_PATH, headers=headers)
        self.backlog: list[dict[str, Any]] = []

    async def open(self) -> None:
        connected, _ = await self.comm.connect(timeout=5)
        assert connected

    async def send(self, frame: str | dict) -> None:
        await self.comm.send_to(text_data=frame if isinstance(frame, str) else json.dumps(frame))

    async def frame(self, timeout: float = 3.0) -> dict[str, Any]:
        """The next frame from the platform (heartbeats skipped); fails on a close."""
        if self.backlog:
            return self.backlog.pop(0)
        while True:
            output = await self.comm.receive_output(timeout)
            assert output["type"] == "websocket.send", f"expected a frame, got {output}"
            message = json.loads(output["text"])
            if message.get("method") != protocol.HEARTBEAT:
                return message

    async def wait_for(self, predicate, timeout: float = 5.0) -> dict[str, Any]:
        deadline = asyncio.get_running_loop().time() + timeout
        skipped = []
        try:
            while True:
                left = deadline - asyncio.get_running_loop().time()
                assert left > 0, "timed out waiting for a frame"
                message = await self.frame(left)
                if predicate(message):
                    return message
                skipped.append(message)
        finally:
            self.backlog[:0] = skipped

    async def closed(self, timeout: float = 5.0) -> int:
        """Wait for the platform to close; returns the close code (frames before it are dropped)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            left = deadline - asyncio.get_running_loop().time()
            assert left > 0, "timed out waiting for a close"
            output = await self.comm.receive_output(left)
            if output["type"] == "websocket.close":
                return output.get("code")

    async def hello(self, acked_seq: int = 0, **extra: Any) -> dict[str, Any]:
        params = {"protocolVersion": protocol.PROTOCOL_VERSION, "kind": extra.pop("kind", "bridge"), "version": "test",
                  "capabilities": ["mobile"], "ports": [], "roots": [], "ackedSeq": acked_seq, **extra}
        request_id = str(uuid.uuid4())
        await self.send(protocol.request(protocol.HELLO, params, request_id))
        reply = await self.wait_for(lambda m: m.get("id") == request_id)
        assert "result" in reply, reply
        return reply["result"]

    async def call(self, method: str, params: dict, request_id: str | None = None) -> dict[str, Any]:
        request_id = request_id or str(uuid.uuid4())
        await self.send(protocol.request(method, params, request_id))
        return await self.wait_for(lambda m: m.get("id") == request_id and "method" not in m)

    async def ack(self, seq: int) -> None:
        await self.send(protocol.notification(protocol.ACK, {"seq": seq}))

    async def delivers(self, count: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        got = []
        for _ in range(count):
            message = await self.wait_for(lambda m: m.get("method") == protocol.DELIVER, timeout)
            got.append(message["params"])
        return got

    async def nothing(self, timeout: float = 0.3) -> bool:
        if self.backlog:
            return False
        return await self.comm.receive_nothing(timeout)

    async def close(self) -> None:
        await self.comm.disconnect()
