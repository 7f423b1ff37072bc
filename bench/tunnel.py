#!/usr/bin/env python
"""Benchmark of the device tunnel, each figure beside a bare Channels echo consumer in the same run.

    .venv/bin/python bench/tunnel.py                          # embedded: SQLite + in-memory layer
    .venv/bin/python bench/tunnel.py --tunnels 1000,5000,15000
    DATABASE_URL=postgres://... REDIS_URL=redis://... .venv/bin/python bench/tunnel.py --layers default,pubsub

Measures, per channel layer:
- round trip p50/p99: echo (direct), echo through a layer group_send, and the tunnel's
  enqueue -> deliver (device request ``bench.enqueue`` -> outbox row -> doorbell -> deliver frame),
  plus a device -> platform request (``devices.ping``);
- throughput to one device: outbox items/s (one transaction of --burst items, acked as they come)
  against echo messages/s on one connection with the same window;
- idle sockets held by one fresh daphne: RSS per tunnel (after hello) against per echo socket.
It starts its own daphne processes on free loopback ports against a fresh database.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
VENV_BIN = Path(sys.executable).parent

import websockets  # noqa: E402

from clients import protocol  # noqa: E402

PAYLOAD = json.dumps({"kind": "echo", "pad": "x" * 160})  # ~200 bytes
BACKLOG = 4096  # /proc/sys/net/core/somaxconn caps it


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


class Server:
    def __init__(self, env: dict[str, str], workdir: Path, name: str) -> None:
        self.port = free_port()
        self.url = f"ws://127.0.0.1:{self.port}"
        self.log = open(workdir / f"{name}-{self.port}.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            # An explicit endpoint for the listen backlog: daphne's -b/-p gives Twisted's default of 50,
            # and a burst of handshakes beyond it is dropped (SYN retries after 1, 3, 7 s... or failures).
            [str(VENV_BIN / "daphne"), "-e", f"tcp:port={self.port}:interface=127.0.0.1:backlog={BACKLOG}",
             "--access-log", os.devnull, "bench.bench_asgi:application"],
            cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT, preexec_fn=_raise_nofile,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2):
                    return
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"daphne exited; see {self.log.name}") from None
                time.sleep(0.2)
        raise RuntimeError("daphne did not start")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.log.close()


def _raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


# --- clients ----------------------------------------------------------------------------------

async def tunnel_open(url: str, token: str) -> websockets.ClientConnection:
    ws = await websockets.connect(f"{url}{protocol.TUNNEL_PATH}", additional_headers={"Authorization": f"Bearer {token}"},
                                  max_size=protocol.MAX_FRAME_BYTES, open_timeout=60, ping_interval=None)
    await ws.send(protocol.request(protocol.HELLO, {"protocolVersion": 1, "kind": "bridge", "version": "bench",
                                                    "capabilities": [], "ports": [], "roots": [], "ackedSeq": 0}, "hello"))
    while True:
        message = json.loads(await ws.recv())
        if message.get("id") == "hello":
            return ws


async def drain_and_ack(ws, seconds: float) -> None:
    """Ack whatever the platform delivered on connect (other apps may enqueue on connect)."""
    try:
        while True:
            message = json.loads(await asyncio.wait_for(ws.recv(), seconds))
            if message.get("method") == protocol.DELIVER:
                await ws.send(protocol.notification(protocol.ACK, {"seq": message["params"]["seq"]}))
    except TimeoutError:
        pass


async def echo_rtt(url: str, path: str, samples: int) -> list[float]:
    async with websockets.connect(f"{url}{path}", ping_interval=None) as ws:
        for _ in range(20):
            await ws.send(PAYLOAD)
            await ws.recv()
        times = []
        for _ in range(samples):
            start = time.perf_counter()
            await ws.send(PAYLOAD)
            await ws.recv()
            times.append((time.perf_counter() - start) * 1000)
        return times


async def tunnel_rtt(url: str, token: str, samples: int) -> tuple[list[float], list[float]]:
    ws = await tunnel_open(url, token)
    try:
        await drain_and_ack(ws, 0.5)
        deliver_times, request_times = [], []
        # Request ids unique per run: the platform answers a repeated id from its record (idempotent
        # retries) without running it again, so ids reused by a later layer's phase enqueued nothing.
        run = uuid.uuid4().hex
        for k in range(samples + 10):
            start = time.perf_counter()
            await ws.send(protocol.request("bench.enqueue", {"n": 1}, f"e{k}-{run}"))
            got_deliver = got_result = False
            while not (got_deliver and got_result):
                message = json.loads(await asyncio.wait_for(ws.recv(), 30))
                if message.get("method") == protocol.DELIVER:
                    if k >= 10:
                        deliver_times.append((time.perf_counter() - start) * 1000)
                    got_deliver = True
                    await ws.send(protocol.notification(protocol.ACK, {"seq": message["params"]["seq"]}))
                elif message.get("id") == f"e{k}-{run}":
                    got_result = True
        for k in range(samples):
            start = time.perf_counter()
            await ws.send(protocol.request("devices.ping", {}, f"p{k}-{uuid.uuid4().hex}"))
            while "result" not in json.loads(await asyncio.wait_for(ws.recv(), 30)):
                pass
            request_times.append((time.perf_counter() - start) * 1000)
        return deliver_times, request_times
    finally:
        await ws.close()


async def echo_throughput(url: str, count: int, window: int) -> float:
    async with websockets.connect(f"{url}/ws/echo", ping_interval=None) as ws:
        start = time.perf_counter()
        sent = received = 0
        while received < count:
            while sent < count and sent - received < window:
                await ws.send(PAYLOAD)
                sent += 1
            await ws.recv()
            received += 1
        return count / (time.perf_counter() - start)


async def tunnel_throughput(url: str, token: str, count: int) -> float:
    ws = await tunnel_open(url, token)
    try:
        await drain_and_ack(ws, 0.5)
        start = time.perf_counter()
        await ws.send(protocol.request("bench.enqueue", {"n": count}, f"burst-{uuid.uuid4().hex}"))
        received = 0
        while received < count:
            message = json.loads(await asyncio.wait_for(ws.recv(), 60))
            if message.get("method") == protocol.DELIVER and message["params"]["kind"] == "bench.item":
                received += 1
                await ws.send(protocol.notification(protocol.ACK, {"seq": message["params"]["seq"]}))
        return count / (time.perf_counter() - start)
    finally:
        await ws.close()


async def hold_idle(server: Server, n: int, opener, heartbeat: float, rate: float,
                    attempts: int = 5) -> tuple[float, int]:
    """Open n sockets with `opener`, keep them alive; returns (KiB per socket, sockets still open).

    Like a fleet coming back, not a flood: at most `rate` new connections a second, 100 handshakes
    in flight; a failed one is retried (up to `attempts` times, with a growing pause) and counted."""
    base = rss_kib(server.proc.pid)
    sockets: list = []
    gate = asyncio.Semaphore(100)
    retries = 0
    loop = asyncio.get_running_loop()
    t0 = loop.time()

    async def one(i: int):
        nonlocal retries
        await asyncio.sleep(max(0.0, t0 + i / rate - loop.time()))
        for attempt in range(attempts):
            try:
                async with gate:
                    sockets.append(await opener(i))
                return
            except (OSError, TimeoutError, websockets.WebSocketException):
                if attempt == attempts - 1:
                    raise
                retries += 1
                await asyncio.sleep(0.5 * 2 ** attempt)

    stop = asyncio.Event()

    async def beat():
        while not stop.is_set():
            for ws in list(sockets):
                try:
                    await ws.send(protocol.notification(protocol.HEARTBEAT))
                except websockets.ConnectionClosed:
                    pass
            try:
                await asyncio.wait_for(stop.wait(), heartbeat / 2)
            except TimeoutError:
                pass

    beater = asyncio.create_task(beat())  # from the start: opening thousands takes longer than 3 beats
    start = time.perf_counter()
    results = await asyncio.gather(*[one(i) for i in range(n)], return_exceptions=True)
    failures = [r for r in results if isinstance(r, BaseException)]
    setup = time.perf_counter() - start
    await asyncio.sleep(3)
    used = rss_kib(server.proc.pid) - base
    alive = sum(1 for ws in sockets if ws.state == websockets.protocol.State.OPEN)
    stop.set()
    await beater
    await asyncio.gather(*[ws.close() for ws in sockets], return_exceptions=True)
    if failures:
        print(f"    ({len(failures)} connections failed after {attempts} attempts, e.g. {failures[0]!r})")
    print(f"    opened {len(sockets)} in {setup:.1f}s ({len(sockets) / setup:.0f}/s; offered at most {rate:.0f}/s; "
          f"{retries} retries)")
    return used / max(1, len(sockets)), alive


# --- setup ------------------------------------------------------------------------------------

def prepare_database(env: dict[str, str], devices: int) -> list[str]:
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True)
    script = f"""
import json, secrets
from ai1net.accounts.models import User
from ai1net.accounts.services import hash_secret
from devices.models import Device
user, _ = User.objects.get_or_create(username="bench")
tokens = ["ai1d_" + secrets.token_urlsafe(32) for _ in range({devices})]
Device.objects.bulk_create([Device(owner=user, name=f"bench{{i}}", kind="bridge", token_hash=hash_secret(t))
                            for i, t in enumerate(tokens)], batch_size=1000)
print(json.dumps(tokens))
"""
    out = subprocess.run([sys.executable, "manage.py", "shell", "-c", script], cwd=ROOT, env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


async def run_layer(label: str, env: dict[str, str], tokens: list[str], args, workdir: Path) -> None:
    print(f"\n== layer: {label} ==")
    server = Server(env, workdir, f"rtt-{label}")
    try:
        echo = await echo_rtt(server.url, "/ws/echo", args.samples)
        echo_layer = await echo_rtt(server.url, "/ws/echo-layer", args.samples)
        deliver, request = await tunnel_rtt(server.url, tokens[0], args.samples)
        print("  round trip, ms           p50     p99    ratio p50 vs echo")
        for name, values in [("echo (direct)", echo), ("echo via layer group", echo_layer),
                             ("tunnel enqueue->deliver", deliver), ("tunnel request (ping)", request)]:
            print(f"  {name:24s} {pct(values, .5):6.2f}  {pct(values, .99):6.2f}   "
                  f"{pct(values, .5) / pct(echo, .5):5.1f}x")
        echo_rate = await echo_throughput(server.url, args.burst, 256)
        items_rate = await tunnel_throughput(server.url, tokens[1], args.burst)
        print(f"  throughput to one connection: echo {echo_rate:,.0f} msg/s, outbox {items_rate:,.0f} items/s "
              f"(ratio {items_rate / echo_rate:.2f})")
    finally:
        server.stop()
    for n in args.tunnels:
        if n + 2 > len(tokens):
            continue
        print(f"  idle x{n}:")
        echo_server = Server(env, workdir, f"idle-echo-{label}")
        try:
            echo_kib, echo_alive = await hold_idle(
                echo_server, n, lambda i, s=echo_server: websockets.connect(f"{s.url}/ws/echo", ping_interval=None,
                                                             open_timeout=60), args.heartbeat, args.connect_rate)
        finally:
            echo_server.stop()
        tunnel_server = Server(env, workdir, f"idle-tunnel-{label}")
        try:
            tunnel_kib, tunnel_alive = await hold_idle(
                tunnel_server, n, lambda i, s=tunnel_server: tunnel_open(s.url, tokens[i + 2]), args.heartbeat,
                args.connect_rate)
        finally:
            tunnel_server.stop()
        print(f"    RSS per socket: echo {echo_kib:.1f} KiB ({echo_alive} open), tunnel {tunnel_kib:.1f} KiB "
              f"({tunnel_alive} open), ratio {tunnel_kib / max(echo_kib, 0.1):.2f}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tunnels", default="1000,5000", help="idle tunnel counts, e.g. 1000,5000,15000")
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--burst", type=int, default=5000)
    parser.add_argument("--heartbeat", type=float, default=20.0)
    parser.add_argument("--connect-rate", type=float, default=1000.0,
                        help="new idle connections offered per second (echo and tunnel alike)")
    parser.add_argument("--layers", default="default", help="with REDIS_URL: default,pubsub")
    args = parser.parse_args()
    args.tunnels = [int(n) for n in args.tunnels.split(",") if n]
    _raise_nofile()
    workdir = Path(tempfile.mkdtemp(prefix="ai1net-bench-"))
    env = dict(os.environ)
    env.setdefault("DATABASE_URL", f"sqlite:///{workdir / 'bench.sqlite3'}")
    env.update({"DJANGO_SETTINGS_MODULE": "bench.settings_bench", "AI1NET_DEBUG": "1", "PYTHONPATH": str(ROOT),
                "AI1NET_HEARTBEAT_SEC": str(args.heartbeat), "AI1NET_REDIS_PREFIX": f"bench{os.getpid()}"})
    tokens = prepare_database(env, max(args.tunnels, default=0) + 2)
    print(f"database {env['DATABASE_URL'].split('@')[-1]}, REDIS_URL {'set' if env.get('REDIS_URL') else 'unset'}, "
          f"logs in {workdir}")
    layers = args.layers.split(",") if env.get("REDIS_URL") else ["in-memory"]
    for layer in layers:
        await run_layer(layer, {**env, "BENCH_LAYER": layer}, tokens, args, workdir)


if __name__ == "__main__":
    asyncio.run(main())
