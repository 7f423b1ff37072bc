"""Device web throughput: the same requests through the tunnel and straight to the local service.

    .venv/bin/python bench/deviceweb.py                      # both configurations
    .venv/bin/python bench/deviceweb.py --quick --json rows.json
    .venv/bin/python bench/deviceweb.py --config embedded --runs 5 --small 1000

Each configuration starts its own world in a temporary folder: daphne (bench.settings_bench: DEBUG off),
the local service of tests/deviceweb/upstream.py and a bridge that exposes it, run as users run it: from
its ``.pyz`` (built from the checkout for the run) on a bare interpreter (``-I -S``), where websockets' C
masking comes from the archive (clients/masking.py); ``--bridge-checkout`` runs ``python -m clients.bridge``.

- ``embedded``: a SQLite file and the in-memory channel layer, one daphne.
- ``pg+redis, 2 daphne``: a fresh PostgreSQL database on 127.0.0.1:5432 and the Redis channel layer,
  two daphne processes. The bridge's tunnel lands on daphne A; a request to A is routed in-process
  (the stream's frames never touch the channel layer), a request to B crosses to A over A's stream relay
  (one kept TCP connection between the two processes, devices.web.relay), not through Redis. The Redis
  layer's own rate (one process sending 1 MiB and small messages to itself) is printed beside it: the
  ceiling of the route through the layer, which streams take when the relay cannot be reached.

Measured beside the same request straight to 127.0.0.1:<port> in the same run (ratio = through / direct):
a 100 MB download (MiB/s and the time to its first body byte, medians of --runs) and small requests
(requests/s: one keep-alive client in a row, and 8 clients at once). The same figures of a bare dial-out
relay before the same local service (bench/bare_relay.py: two asyncio processes, no Django, no checks, no
flow control) are printed beside them, a floor for the first byte and small requests. ``--json FILE`` appends
the rows of issue 10 (bench.report). Printed beside them, not rows of the issue: a 200-byte message's round
trip on a device-web WebSocket to the local service's echo, through each daphne, and straight. ``--hold`` keeps the world up after measuring, for a profiler (py-spy).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from bench import client_pyz, cpu_seconds, cpu_times, daphne_env, stop_cleanly_on_sigterm  # noqa: E402
from bench.report import Row, append, p50_p99, pct  # noqa: E402
from clients.common import loopback  # noqa: E402
from clients.common.credentials import Credential, save_credential  # noqa: E402

PY = sys.executable
VENV_BIN = Path(PY).parent
MIB = 1024 * 1024
PG_ADMIN = "postgres://postgres@127.0.0.1:5432/postgres"
REDIS_URL = "redis://127.0.0.1:6379/0"
PASSWORD = "bench password 1234 horse"  # noqa: S105 - a throwaway local account
EMBEDDED, SCALED = "embedded", "pg+redis, 2 daphne"


def free_port(low: int = 0, high: int = 0) -> int:
    import random

    for _ in range(500):
        port = random.randint(low, high) if low else 0  # noqa: S311 - picking a local port
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return sock.getsockname()[1]
    raise RuntimeError("no free port")


def wait_for(condition: Callable[[], Any], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except Exception:  # noqa: S110, BLE001 - not up yet
            pass
        time.sleep(0.1)
    raise RuntimeError(f"timed out waiting for {what}")


# --- the world --------------------------------------------------------------------------------


@contextlib.contextmanager
def postgres_database() -> Iterator[str]:
    import psycopg

    name = f"bench_deviceweb_{os.getpid()}_{secrets.token_hex(3)}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgres://postgres@127.0.0.1:5432/{name}"
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def redis_prefix() -> Iterator[str]:
    import redis

    prefix = f"benchdw{os.getpid()}{secrets.token_hex(3)}"
    try:
        yield prefix
    finally:
        client = redis.Redis.from_url(REDIS_URL)
        try:
            keys = list(client.scan_iter(f"{prefix}*", count=1000))
            if keys:
                client.delete(*keys)
        finally:
            client.close()


@dataclass
class World:
    tmp: Path
    env: dict[str, str]
    servers: list[str] = field(default_factory=list)  # base URLs of the daphne processes; the tunnel is on [0]
    procs: list[subprocess.Popen] = field(default_factory=list)
    device_id: str = ""
    web_port: int = 0
    ws_port: int = 0  # the local service's WebSocket echo
    service_pid: int = 0  # the local service's process (build())
    username: str = ""

    def start(self, argv: list[str], log: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        handle = open(self.tmp / log, "wb")  # noqa: SIM115 - lives as long as the process
        proc = subprocess.Popen(argv, cwd=ROOT, env=env or self.env, stdout=handle, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def daphne(self, name: str) -> str:
        port = free_port()
        self.start([str(VENV_BIN / "daphne"), "-b", "127.0.0.1", "-p", str(port), "--access-log", os.devnull,
                    "ai1net.asgi:application"], f"{name}.log", daphne_env(self.env, len(self.servers)))
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: httpx.get(f"{url}/healthz").status_code == 200, 60, name)
        self.servers.append(url)
        return url

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.send_signal(signal.SIGINT)
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()

    def pids(self) -> str:
        return " ".join(f"{Path(p.args[1] if p.args[0] == PY else p.args[0]).name}={p.pid}" for p in self.procs)


SETUP = """
import json
from ai1net.accounts.models import User
from devices import services
from devices.models import Device
user = User.objects.create_user(username=USERNAME, password=PASSWORD, device_web_enabled=True)
device, token = services.device_create(owner=user, name="bench", kind=Device.Kind.BRIDGE)
print(json.dumps({"device_id": str(device.pk), "token": token}))
"""


def build(world: World, daphnes: int, bridge_pyz: str | None = None) -> None:
    env = world.env
    subprocess.run([PY, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True)
    world.username = f"bench{os.getpid()}{secrets.token_hex(2)}"
    script = SETUP.replace("USERNAME", repr(world.username)).replace("PASSWORD", repr(PASSWORD))
    out = subprocess.run([PY, "manage.py", "shell", "-v", "0", "-c", script], cwd=ROOT, env=env, check=True,
                         capture_output=True, text=True).stdout
    made = json.loads(out.strip().splitlines()[-1])
    for i in range(daphnes):
        world.daphne(f"daphne-{'AB'[i]}")
    world.web_port = free_port(20000, 20999)
    world.ws_port = world.web_port
    while world.ws_port == world.web_port:  # device web reaches ports 20000-20999 only
        world.ws_port = free_port(20000, 20999)
    world.service_pid = world.start([PY, str(ROOT / "tests/deviceweb/upstream.py"), str(world.web_port),
                                     str(world.ws_port)], "upstream.log").pid
    wait_for(lambda: httpx.get(f"http://127.0.0.1:{world.web_port}/small").status_code == 200, 30, "the local service")
    home = world.tmp / "home"
    save_credential(home, Credential(url=world.servers[0], device_id=made["device_id"], token=made["token"],
                                     kind="bridge", name="bench"))
    world.device_id = made["device_id"]
    client_env = {k: v for k, v in env.items()
                  if not k.startswith(("DATABASE_URL", "REDIS_URL", "DJANGO_", "AI1NET_REDIS"))}
    # As users run it, the .pyz on a bare interpreter, or from the checkout (--bridge-checkout).
    bridge = [PY, "-I", "-S", bridge_pyz] if bridge_pyz else [PY, "-m", "clients.bridge"]
    world.start([*bridge, "--home", str(home), "run", "--expose", str(world.web_port), "--expose", str(world.ws_port)],
                "bridge.log", env=client_env)


def browser(world: World, server: str) -> httpx.Client:
    client = httpx.Client(base_url=f"{server}/d/{world.device_id}/{world.web_port}", timeout=120)
    client.get(f"{server}/accounts/login/")
    response = client.post(f"{server}/accounts/login/", data={
        "username": world.username, "password": PASSWORD, "csrfmiddlewaretoken": client.cookies["csrftoken"]})
    assert response.status_code == 302, response.text[:300]
    wait_for(lambda: client.get("/small").text == "ok", 30, f"the bridge through {server}")
    return client


# --- measurements -----------------------------------------------------------------------------


def download(client: httpx.Client, size: int) -> tuple[float, float]:
    """(MiB/s, ms to the first body byte) of one GET /bytes?n=size, read as it arrives."""
    started, got, first = time.perf_counter(), 0, 0.0
    with client.stream("GET", "/bytes", params={"n": size}) as response:
        for chunk in response.iter_raw():
            if not got:
                first = time.perf_counter() - started
            got += len(chunk)
    assert got == size, got
    return size / MIB / (time.perf_counter() - started), first * 1000


def small_serial(client: httpx.Client, count: int) -> float:
    started = time.perf_counter()
    for _ in range(count):
        assert client.get("/small").status_code == 200
    return count / (time.perf_counter() - started)


def small_parallel(client: httpx.Client, count: int) -> float:
    started = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: client.get("/small").status_code, range(count)))
    assert set(results) == {200}, set(results)
    return count / (time.perf_counter() - started)


@dataclass
class Figures:
    mibs: float
    first_ms: float
    serial: float
    parallel: float
    cpu_ms_per_mib: float = 0.0  # CPU of the path's own processes per MiB downloaded (none for the direct path)
    cpu_ms_per_request: float = 0.0  # the same per small request (8 clients)
    kernel_ms_per_mib: float = 0.0  # of cpu_ms_per_mib, the time in the kernel (system calls, socket copies)
    client_ms_per_mib: float = 0.0  # the downloading client's CPU (this process's thread) per MiB
    service_ms_per_mib: float = 0.0  # the local service's CPU per MiB
    busy_cores: float = 0.0  # CPU of the client, the local service and the path's processes over the downloads' wall time

    @property
    def total_ms_per_mib(self) -> float:
        """CPU per MiB of every process a download crosses."""
        return self.cpu_ms_per_mib + self.client_ms_per_mib + self.service_ms_per_mib


def machine_cores() -> int:
    """The cores this benchmark and the processes it starts may run on."""
    return len(os.sched_getaffinity(0))


def cpu_ceiling(figures: Figures, cores: int) -> float:
    """MiB/s a download could reach if every process on its way kept ``cores`` cores fully busy between them."""
    return cores * 1000 / figures.total_ms_per_mib if figures.total_ms_per_mib else 0.0


def cpu_budget_note(through: Figures, direct: Figures, cores: int, target: float = 0.5) -> str:
    """Where a download's CPU goes, what the machine's cores allow at most, and what the target would need of
    daphne + bridge: the CPU floor of the download row."""
    needed = target * direct.mibs
    budget = cores * 1000 / needed - through.client_ms_per_mib - through.service_ms_per_mib
    return (f"CPU per MiB: daphne + bridge {through.cpu_ms_per_mib:.2f} ({through.kernel_ms_per_mib:.2f} of it in the "
            f"kernel), client {through.client_ms_per_mib:.2f}, "
            f"local service {through.service_ms_per_mib:.2f} = {through.total_ms_per_mib:.2f} ms "
            f"(direct: client {direct.client_ms_per_mib:.2f} + local service {direct.service_ms_per_mib:.2f}); "
            f"{through.busy_cores:.2f} of {cores} cores busy meanwhile; with all {cores} busy, at most "
            f"{cpu_ceiling(through, cores):.0f} MiB/s ({cpu_ceiling(through, cores) / direct.mibs:.2f}x direct); "
            f"{target}x direct ({needed:.0f} MiB/s) needs daphne + bridge at {budget:.2f} ms per MiB or less")


def measure(clients: dict[str, httpx.Client], args: argparse.Namespace,
            pids: dict[str, list[int]], service: int) -> dict[str, Figures]:
    """Every figure of every client, run by run in turn (through, direct, through, direct ...), so a
    change of load on the machine hits both sides of a ratio alike. ``pids``: by client, the processes
    whose CPU is that path's own (none for the direct one); ``service``: the local service's pid."""
    size = args.mb * MIB
    downloads: dict[str, list[tuple[float, float]]] = {name: [] for name in clients}
    cpu: dict[str, float] = dict.fromkeys(clients, 0.0)
    cpu_kernel: dict[str, float] = dict.fromkeys(clients, 0.0)
    cpu_client: dict[str, float] = dict.fromkeys(clients, 0.0)
    cpu_service: dict[str, float] = dict.fromkeys(clients, 0.0)
    wall: dict[str, float] = dict.fromkeys(clients, 0.0)
    cpu_small: dict[str, float] = dict.fromkeys(clients, 0.0)
    serial: dict[str, list[float]] = {name: [] for name in clients}
    parallel: dict[str, list[float]] = {name: [] for name in clients}
    for client in clients.values():
        download(client, 8 * MIB)  # warm up both ends
    for _ in range(args.runs):
        for name, client in clients.items():
            (before, before_kernel), before_service = cpu_times(pids[name]), cpu_seconds([service])
            before_client, started = time.thread_time(), time.perf_counter()  # httpx reads in this thread
            downloads[name].append(download(client, size))
            wall[name] += time.perf_counter() - started
            cpu_client[name] += time.thread_time() - before_client
            cpu_service[name] += cpu_seconds([service]) - before_service
            after, after_kernel = cpu_times(pids[name])
            cpu[name] += after - before
            cpu_kernel[name] += after_kernel - before_kernel
    for _ in range(max(1, args.runs // 2)):
        for name, client in clients.items():
            serial[name].append(small_serial(client, args.small // 2))
    for _ in range(args.runs):
        for name, client in clients.items():
            before = cpu_seconds(pids[name])
            parallel[name].append(small_parallel(client, args.small))
            cpu_small[name] += cpu_seconds(pids[name]) - before
    median = statistics.median
    mibs = size / MIB * args.runs
    return {name: Figures(median(r[0] for r in downloads[name]), median(r[1] for r in downloads[name]),
                          median(serial[name]), median(parallel[name]),
                          1000 * cpu[name] / mibs,
                          1000 * cpu_small[name] / (args.small * args.runs),
                          1000 * cpu_kernel[name] / mibs, 1000 * cpu_client[name] / mibs,
                          1000 * cpu_service[name] / mibs,
                          (cpu[name] + cpu_client[name] + cpu_service[name]) / wall[name])
            for name in clients}


def ws_echo_rtts(urls: dict[str, tuple[str, str, str]], samples: int, rounds: int = 3) -> dict[str, list[float]]:
    """Round trips (ms) of a 200-byte text message on a WebSocket to the local service's echo, per name: the
    socket's URL, its session cookie and Origin ("" for none). Sockets kept open, sampled in turn, ``rounds``
    times."""
    from websockets.sync.client import connect

    sockets = {name: connect(url, additional_headers={"Cookie": cookie} if cookie else None, origin=origin or None,
                             open_timeout=30)
               for name, (url, cookie, origin) in urls.items()}
    payload = "x" * 200
    times: dict[str, list[float]] = {name: [] for name in urls}
    try:
        for ws in sockets.values():
            for _ in range(20):  # warm up
                ws.send(payload)
                ws.recv()
        for _ in range(rounds):
            for name, ws in sockets.items():
                for _ in range(samples // rounds):
                    started = time.perf_counter()
                    ws.send(payload)
                    assert ws.recv() == payload
                    times[name].append((time.perf_counter() - started) * 1000)
    finally:
        for ws in sockets.values():
            ws.close()
    return times


def ws_figures(world: World, clients: dict[str, httpx.Client], samples: int) -> None:
    """Device web's WebSocket path beside the same socket straight to the local service (printed; not a row of
    issue 10): a message's round trip through each daphne."""
    urls = {"direct": (f"ws://127.0.0.1:{world.ws_port}/echo", "", "")}
    for name, server in (("through", world.servers[0]), ("cross", world.servers[1] if len(world.servers) > 1 else "")):
        if server:
            host = server.removeprefix("http://")
            urls[name] = (f"ws://{host}/d/{world.device_id}/{world.ws_port}/echo",
                          f"sessionid={clients[name].cookies['sessionid']}", server)
    times = ws_echo_rtts(urls, samples)
    direct = times.pop("direct")
    labels = {"through": "on the daphne holding the tunnel", "cross": "on the other daphne (its stream relay)"}
    for name, values in times.items():
        print(f"  WebSocket echo, 200 B, {labels[name]}: {p50_p99(values)}; direct {p50_p99(direct)}; "
              f"p50 ratio {pct(values, .5) / pct(direct, .5):.2f}", flush=True)


def layer_ceiling(prefix: str, count: int = 200) -> tuple[float, float]:
    """The platform's Redis channel layer alone, one process sending to a channel it reads (the cross-process
    route's hop when the stream relay cannot be reached, both ends' CPU on one core): (MiB/s of 1 MiB data-frame
    messages, messages/s of small ones)."""
    import asyncio

    from ai1net.channel_layers import RedisChannelLayer

    async def run() -> tuple[float, float]:
        layer = RedisChannelLayer(hosts=[{"address": REDIS_URL, "socket_timeout": None}], prefix=f"{prefix}:ceiling",
                                  capacity=1000, expiry=30)
        channel = await layer.new_channel()
        results = []
        for size, n in ((MIB, count // 4), (200, count * 5)):
            message = {"type": "device.stream", "stream": "s" * 24, "frame": {
                "method": "web.data", "params": {"stream": "s" * 24, "seq": 0, "raw": b"x" * size}}}

            async def send(n: int = n, message: dict = message) -> None:
                for _ in range(n):
                    await layer.send(channel, message)

            started = time.perf_counter()
            sender = asyncio.ensure_future(send())
            for _ in range(n):
                await layer.receive(channel)
            await sender
            elapsed = time.perf_counter() - started
            results.append(n * size / MIB / elapsed if size == MIB else n / elapsed)
        await layer.flush()
        return results[0], results[1]

    return asyncio.run(run())


def print_pair(label: str, through: Figures, direct: Figures, floor: Figures, mb: int) -> None:
    def line(name: str, a: float, b: float, c: float, fmt: str = "12.1f") -> None:
        print(f"  {name:34} {a:{fmt}} {b:{fmt}} {a / b:7.3f} {c:{fmt}} {c / b:7.3f}", flush=True)

    print(f"{label}")
    print(f"  {'measurement':34} {'tunnel':>12} {'direct':>12} {'ratio':>7} {'bare relay':>12} {'ratio':>7}")
    line(f"download {mb} MB (MiB/s)", through.mibs, direct.mibs, floor.mibs)
    line("  first byte (ms, p50)", through.first_ms, direct.first_ms, floor.first_ms, "12.2f")
    line("small requests, 1 client (req/s)", through.serial, direct.serial, floor.serial)
    line("small requests, 8 clients (req/s)", through.parallel, direct.parallel, floor.parallel)
    print(f"  {'CPU of the path (ms per MiB)':34} {through.cpu_ms_per_mib:12.2f} {'':12} {'':7} "
          f"{floor.cpu_ms_per_mib:12.2f}")
    print(f"  {'CPU of the path (ms per request)':34} {through.cpu_ms_per_request:12.2f} {'':12} {'':7} "
          f"{floor.cpu_ms_per_request:12.2f}")
    print("  (CPU of the path: daphne + bridge through the tunnel, the relay's two processes for the bare relay)")
    print(f"  download's CPU budget: {cpu_budget_note(through, direct, machine_cores())}")


BARE_FLOOR = "the bare relay"


def tcp_note() -> str:
    """Which TCP congestion control the hops use: the system's for the local service and the client (the direct
    download's one hop), the platform's loopback choice for daphne's, the bridge's and the bare relay's sockets."""
    system = loopback.system_algorithm()
    if not system:
        return "TCP congestion control: the system's"
    ours = loopback.algorithm() or system
    return (f"TCP congestion control: {system} (the system's) where the local service and the client send, "
            f"{ours} where daphne, the bridge and the bare relay send (clients.common.loopback)")


def rows_for(config: str, through: Figures, direct: Figures, floor: Figures, mb: int, note: str = "") -> list[Row]:
    down = through.mibs / direct.mibs
    first = through.first_ms / direct.first_ms if direct.first_ms else 0.0
    small = through.parallel / direct.parallel
    extra = [note] if note else []
    bare = "a bare dial-out relay in the same run (bench/bare_relay.py: no Django, checks or flow control):"
    return [
        Row(f"device web {mb} MB download vs direct", config, f"{through.mibs:.1f} MiB/s",
            f"direct {direct.mibs:.1f} MiB/s", down, down, ">= 0.5", "x direct",
            [f"first byte {through.first_ms:.2f} ms through vs {direct.first_ms:.2f} ms direct ({first:.2f}x)",
             cpu_budget_note(through, direct, machine_cores()), tcp_note(),
             f"{bare} {floor.mibs:.1f} MiB/s ({floor.mibs / direct.mibs:.2f}x direct), "
             f"its two processes' CPU {floor.cpu_ms_per_mib:.2f} ms per MiB (not a floor for a download: it "
             "copies each frame more often than the platform does, and the platform has run faster than it)", *extra]),
        Row("device web first byte vs direct", config, f"{through.first_ms:.2f} ms p50",
            f"direct {direct.first_ms:.2f} ms p50", first, first, "<= 3", "x direct",
            [f"{bare} {floor.first_ms:.2f} ms p50 ({floor.first_ms / direct.first_ms:.2f}x direct)", *extra],
            BARE_FLOOR, round(floor.first_ms / direct.first_ms, 2) if direct.first_ms else None),
        Row("device web small requests, 8 clients vs direct", config, f"{through.parallel:.0f} req/s",
            f"direct {direct.parallel:.0f} req/s", small, small, ">= 0.4", "x direct",
            [f"1 client in a row: {through.serial:.0f} vs {direct.serial:.0f} req/s "
             f"({through.serial / direct.serial:.2f}x)",
             f"daphne + bridge CPU {through.cpu_ms_per_request:.2f} ms per request",
             f"{bare} {floor.parallel:.0f} req/s ({floor.parallel / direct.parallel:.2f}x direct), "
             f"its two processes' CPU {floor.cpu_ms_per_request:.2f} ms per request", *extra],
            BARE_FLOOR, round(floor.parallel / direct.parallel, 2)),
    ]


def bare_relay(world: World) -> tuple[httpx.Client, list[int]]:
    """Start bench/bare_relay.py's two processes before the same local service: (a client of it, their pids)."""
    http_port, ws_port = free_port(), free_port()
    relay = str(ROOT / "bench" / "bare_relay.py")
    front = world.start([PY, relay, "front", str(http_port), str(ws_port)], "bare-front.log")
    wait_for(lambda: socket.create_connection(("127.0.0.1", ws_port), 1).close() is None, 30, "the bare relay")
    device = world.start([PY, relay, "device", str(ws_port), str(world.web_port)], "bare-device.log")
    client = httpx.Client(base_url=f"http://127.0.0.1:{http_port}", timeout=120)
    wait_for(lambda: client.get("/small").text == "ok", 30, "the bare relay's device")
    return client, [front.pid, device.pid]


def run_config(config: str, base: dict[str, str], args: argparse.Namespace) -> list[Row]:
    tmp = Path(tempfile.mkdtemp(prefix="ai1net-deviceweb-"))
    world = World(tmp, {})
    rows: list[Row] = []
    with contextlib.ExitStack() as stack:
        if config == EMBEDDED:
            world.env = dict(base, DATABASE_URL=f"sqlite:///{tmp / 'bench.sqlite3'}")
            daphnes = 1
        else:
            url = stack.enter_context(postgres_database())
            prefix = stack.enter_context(redis_prefix())
            world.env = dict(base, DATABASE_URL=url, REDIS_URL=REDIS_URL, AI1NET_REDIS_PREFIX=prefix)
            daphnes = 2
        try:
            build(world, daphnes, args.bridge_pyz)
            direct = httpx.Client(base_url=f"http://127.0.0.1:{world.web_port}", timeout=120)
            tunnel = browser(world, world.servers[0])
            layer = "Redis" if daphnes == 2 else "in-memory"
            print(f"\n== {config}: {layer} channel layer, {daphnes} daphne; median of {args.runs} runs; "
                  f"ratio = through the tunnel / straight to the local service", flush=True)
            platform = [proc.pid for proc in world.procs if proc.pid != world.service_pid]
            floor_client, floor_pids = bare_relay(world)
            clients = {"through": tunnel, "direct": direct, "floor": floor_client}
            pids = {"through": platform, "direct": [], "floor": floor_pids}
            if daphnes == 2:
                clients["cross"] = browser(world, world.servers[1])
                pids["cross"] = platform
            ws_figures(world, clients, args.ws_samples)
            figures = measure(clients, args, pids, world.service_pid)
            through, straight, floor = figures["through"], figures["direct"], figures["floor"]
            if daphnes == 1:
                print_pair(f"{config}", through, straight, floor, args.mb)
                rows = rows_for(config, through, straight, floor, args.mb)
            else:
                print_pair(f"{config}: request on daphne A, which holds the tunnel (in-process route)",
                           through, straight, floor, args.mb)
                cross = figures["cross"]
                print_pair(f"{config}: request on daphne B, the tunnel on A (cross-process, A's stream relay)",
                           cross, straight, floor, args.mb)
                rows = rows_for(config, through, straight, floor, args.mb, "request on the daphne holding the tunnel")
                mibs, messages = layer_ceiling(world.env["AI1NET_REDIS_PREFIX"])
                print(f"  Redis channel layer alone (send + receive in one process): {mibs:.0f} MiB/s of 1 MiB "
                      f"messages, {messages:.0f} small messages/s", flush=True)
                rows += rows_for(f"{config} (cross-process)", cross, straight, floor, args.mb,
                                 "request on the other daphne: frames cross to the tunnel's daphne over its stream "
                                 f"relay; the Redis layer alone (the route without the relay) carries {mibs:.0f} MiB/s "
                                 f"of 1 MiB messages and {messages:.0f} small messages/s here")
            if args.hold:
                print(f"holding ({world.pids()}); tunnel {tunnel.base_url} as {world.username}; Ctrl-C to end",
                      flush=True)
                with contextlib.suppress(KeyboardInterrupt):
                    while True:
                        time.sleep(3600)
        finally:
            world.stop()
            if not args.keep_logs:
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                print(f"logs: {tmp}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", choices=["embedded", "pg+redis", "both"], default="both")
    parser.add_argument("--quick", action="store_true", help="fewer runs and requests (about a minute for both)")
    parser.add_argument("--runs", type=int, default=None, help="runs per measurement (default 5, quick 2)")
    parser.add_argument("--small", type=int, default=None, help="small requests per run (default 1000, quick 200)")
    parser.add_argument("--mb", type=int, default=100, help="size of the large download in MB")
    parser.add_argument("--ws-samples", type=int, default=None,
                        help="WebSocket echo round trips per path (default 600, quick 150)")
    parser.add_argument("--json", default=None, help="append the rows to this JSON file (bench.report)")
    parser.add_argument("--hold", action="store_true", help="keep each world up after measuring (profiling)")
    parser.add_argument("--keep-logs", action="store_true")
    parser.add_argument("--bridge-pyz", default=None, metavar="PATH",
                        help="run the bridge from this .pyz on a bare interpreter (-I -S), as users do (default: "
                             "one built from the checkout for this run)")
    parser.add_argument("--bridge-checkout", action="store_true",
                        help="run the bridge from the checkout (python -m clients.bridge) instead of a .pyz")
    args = parser.parse_args()
    stop_cleanly_on_sigterm()
    if args.bridge_pyz is None and not args.bridge_checkout:
        args.bridge_pyz = client_pyz()
    args.runs = args.runs or (2 if args.quick else 5)
    args.small = args.small or (200 if args.quick else 1000)
    args.ws_samples = args.ws_samples or (150 if args.quick else 600)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "REDIS_URL", "AI1NET_REDIS"))}
    base.update({"DJANGO_SETTINGS_MODULE": "bench.settings_bench", "AI1NET_DEBUG": "1", "PYTHONPATH": str(ROOT),
                 "PYTHONUNBUFFERED": "1"})
    configs = [EMBEDDED, SCALED] if args.config == "both" else [EMBEDDED if args.config == "embedded" else SCALED]
    started = time.monotonic()
    bridge = f"the bridge from {args.bridge_pyz} (-I -S), as users run it" if args.bridge_pyz else \
        "the bridge from the checkout"
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores; device web through the tunnel vs direct; "
          f"{bridge}; {tcp_note()}")
    rows: list[Row] = []
    for config in configs:
        rows += run_config(config, base, args)
    append(args.json, rows)
    print(f"\n{len(rows)} rows in {time.monotonic() - started:.0f} s")
    for row in rows:
        print(f"  {row.path} [{row.config}]: {row.value:.3f} {row.unit} (target {row.target}: "
              f"{'met' if row.met else 'NOT met'}){'; ' + '; '.join(row.notes) if row.notes else ''}")


if __name__ == "__main__":
    main()
