"""A fleet of device tunnels in one process, for the platform-restart fault test.

``python -m tests.faults.fleet URL[,URL...] TOKENS EVENTS``: one ``clients.common.tunnel.Tunnel`` per token in
TOKENS (one a line; device i to the i-th URL round robin, as a proxy in front of several processes spreads them), with the client's own reconnect backoff and jitter; each device applies delivered
items in memory, as the bridge's inbox does on disk. EVENTS gets one JSON line per fact, with the wall
time: ``{"t", "i", "event": "attempt"}`` as device i starts to connect, ``{"t", "i", "event": "up"}`` when device i's tunnel is (re)established, ``{"t", "i", "event":
"applied", "seq", "kind"}`` for each item applied. Runs until killed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from typing import Any, TextIO

from clients.common.tunnel import Tunnel


class FleetDevice:
    def __init__(self, index: int, out: TextIO) -> None:
        self.index, self.out, self.applied = index, out, 0

    def applied_seq(self) -> int:
        return self.applied

    async def on_deliver(self, seq: int, kind: str, payload: dict[str, Any]) -> None:
        self.applied = seq
        self.emit("applied", seq=seq, kind=kind)

    def emit(self, event: str, **fields: Any) -> None:
        self.out.write(json.dumps({"t": time.time(), "i": self.index, "event": event, **fields}) + "\n")


class FleetTunnel(Tunnel):
    """The client's tunnel, saying when it starts each connection attempt (what its backoff spreads)."""

    device: FleetDevice

    async def _connect_once(self) -> tuple[bool, int | None]:
        self.device.emit("attempt")
        return await super()._connect_once()


async def main(urls: list[str], tokens: list[str], out: TextIO) -> None:
    devices = [FleetDevice(i, out) for i in range(len(tokens))]
    tunnels = []
    for device, token in zip(devices, tokens, strict=True):
        tunnel = FleetTunnel(urls[device.index % len(urls)], token, hello={"kind": "bridge", "version": "fleet"},
                             applied_seq=device.applied_seq, on_deliver=device.on_deliver)
        tunnel.device = device
        tunnels.append(tunnel)
    runs = []
    for k, tunnel in enumerate(tunnels):  # the fleet comes online at about 200 a second, as devices boot
        runs.append(asyncio.ensure_future(tunnel.run()))
        if k % 50 == 49:
            await asyncio.sleep(0.25)
    seen = [0] * len(tunnels)
    while True:  # the connection counter of each tunnel says when it came (back) up
        for i, tunnel in enumerate(tunnels):
            if tunnel.connections != seen[i]:
                seen[i] = tunnel.connections
                devices[i].emit("up")
        out.flush()
        failed = [run for run in runs if run.done()]
        if failed:
            raise RuntimeError(f"a tunnel stopped: {failed[0].exception()!r}")
        await asyncio.sleep(0.05)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    url, tokens_path, events_path = sys.argv[1:4]
    with open(tokens_path, encoding="utf-8") as handle:
        tokens = [line.strip() for line in handle if line.strip()]
    with open(events_path, "a", encoding="utf-8") as events:
        asyncio.run(main(url.split(","), tokens, events))
