#!/usr/bin/env python
"""Mobile reply round trip, beside a bare Channels echo measured in the same run (issues 4 and 10).

    .venv/bin/python bench/roundtrip.py --quick                        # both configurations, about a minute
    .venv/bin/python bench/roundtrip.py                                # both configurations, 300 questions
    .venv/bin/python bench/roundtrip.py --questions 100 --config embedded --json rows.json

Configurations (each sets up its own database and starts its own processes):
- embedded: a temp SQLite file (migrated) + the in-memory channel layer, one daphne;
- scaled ("pg+redis, 2 daphne"): PostgreSQL (a fresh database on postgres@127.0.0.1:5432, dropped at the
  end) + Redis (redis://127.0.0.1:6379/0, a unique AI1NET_REDIS_PREFIX, its keys deleted at the end) and
  TWO daphne processes: the bridge's tunnel is connected to the first, the phone (its HTTP requests and
  its ``/ws/mobile`` socket) to the second, so every doorbell crosses Redis between processes.

Each daphne (access log off) serves ``bench.roundtrip_asgi:application``: ai1net plus the bare
``/ws/echo`` consumer, with a ``Server-Timing`` header on HTTP responses (the time daphne's process spent
on the request, from the ASGI call to the response start: middleware, session, view, service, commit).
A user with mobile reply on is logged in as the phone (session cookie; ``/ws/mobile`` opened with a
matching Origin), a bridge is paired through the JSON API and its daemon runs. Then, one question at a
time, in one agent session:

- leg 1 (hook):  t0 = the hook process is started, with the command line ``hooks install`` writes
                 (``python -I -S -c <the hook's entry> ai1net-bridge.pyz H/hook-cache --home H hook
                 --window 120 --answer-style allow``, the hook's modules read from their copy in H),
                 PreToolUse AskUserQuestion on stdin -> t1 = the phone's socket receives
                 ``mobile.question.created``; includes the interpreter start-up of the hook;
- leg 2 (hook):  the phone POSTs /api/mobile/answer (CSRF) -> t2 = the hook prints its JSON line;
- leg 1 (local): the same question asked through the daemon's loopback API (the hook's own client,
                 minus the interpreter) -> the phone's socket receives it;
- leg 2 (local): the phone POSTs the answer -> the pending POST /v1/questions/wait returns it.
- server time of one answer POST: the ``Server-Timing`` of every answer POST above (median).
Each question starts 50 ms after the previous one ended (``settle()``), as in use.

The bridge and its hook run as users run them: from the ``.pyz`` (built from the checkout for the run) on a
bare interpreter (``-I -S``); ``--client checkout`` runs ``python -m clients.bridge`` and the checkout's
``clients/bridge/run_hook.py``, as ``hooks install`` from a checkout writes.

Start-up: the hook with AI1NET_MOBILE_OFF=1 (spawn -> exit: reads stdin, imports its modules, asks
nobody), sampled alternately with a bare interpreter (``python -S -c pass`` and ``python -c pass``).
Echo: the round trip of a 200-byte JSON text message on ``/ws/echo`` of the phone's daphne (direct send,
the bare baseline; ratios are against it) and, for reference, on ``/ws/echo-layer`` (through a channel-
layer group_send, the path of the phone's doorbell). Figures are milliseconds. ``--json FILE`` appends
the three rows of issue 10 per configuration (bench/report.py).

Floors of the server time, each POSTed after each local question with that answer's body, after the same
50 ms pause as a question (bench/roundtrip_asgi.py):
``/bench/floor``, the stack alone (middleware, session, user, DRF view and checks, serializer), and
``/bench/floor-db``, that stack and then the answer's database work as bare statements (the question's
read; the answer's writes of the same kinds, order and pipeline, into the benchmark's own tables; a
durable commit). The second is the row's floor: what an answer costs on that database before the
product's own Python (models, checks, payloads, the audit's hashes, events).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
VENV_BIN = Path(sys.executable).parent

import httpx  # noqa: E402
import websockets  # noqa: E402

from bench import client_pyz, daphne_env, stop_cleanly_on_sigterm  # noqa: E402
from bench.report import Row, append, pct  # noqa: E402
from clients.bridge import hook_cache  # noqa: E402
from clients.bridge.hook import Daemon  # noqa: E402 - the hook's own loopback client
from clients.bridge.hooks_install import hook_command, precompile_hook, pyz_launcher  # noqa: E402

PAYLOAD = json.dumps({"kind": "echo", "pad": "x" * 173})  # 200 bytes
PG_ADMIN = "postgres://postgres@127.0.0.1:5432/postgres"
REDIS_URL = "redis://127.0.0.1:6379/0"
USERNAME, PASSWORD = "bench-phone", "bench correct horse battery staple"
SESSION_ID = "bench-session"
WARMUP = 5
SETTLE_SEC = 0.05  # between one question's end and the next one's start (settle())
QUICK_QUESTIONS = 12
CONFIG_LABEL = {"embedded": "embedded", "scaled": "pg+redis, 2 daphne"}
TARGETS = {"leg1": 60.0, "leg2": 30.0, "post": 5.0}  # issue 10: p99, p99, median (ms)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ms(start: float, end: float) -> float:
    return (end - start) * 1000


# How the bridge and its hook start (``--client``; main() sets them): the bridge's argv before its command,
# and the .pyz the hook runs from (None: ``hooks install``'s default from a checkout, clients/bridge/run_hook.py).
BRIDGE = [sys.executable, "-m", "clients.bridge"]
HOOK_PYZ: str | None = None


def client_env() -> dict[str, str]:
    """What the user's desktop runs with: nothing of the server's configuration."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "DATABASE_URL", "REDIS_URL",
                                                                     "AI1NET_REDIS"))}
    env.update({"PYTHONUNBUFFERED": "1", "AI1NET_BACKOFF_CAP": "1"})
    return env


class Proc:
    """A child in its own process group, output to a log file; stop() ends that group only."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str]) -> None:
        self.log_path = log
        self._log = open(log, "ab")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                      start_new_session=True)

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.alive:
            try:
                os.killpg(self.popen.pid, signal.SIGTERM)
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(10)
            except ProcessLookupError:
                pass
        self._log.close()


async def wait_for(condition, timeout: float, message: str, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = condition()
            if asyncio.iscoroutine(value):
                value = await value
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - keep polling; report the last error at the deadline
            last = exc
        await asyncio.sleep(interval)
    raise RuntimeError(f"timed out after {timeout}s waiting for {message}: {last!r}")


# --- configuration: database, user ------------------------------------------------------------

@contextlib.contextmanager
def postgres_database():
    import psycopg

    name = f"bench_roundtrip_{os.getpid()}_{secrets.token_hex(3)}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgres://postgres@127.0.0.1:5432/{name}"
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def redis_prefix():
    import redis

    prefix = f"benchrt{os.getpid()}{secrets.token_hex(3)}"
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


def prepare_database(env: dict[str, str]) -> None:
    """Migrate and create the phone's user, in one Django start-up."""
    script = (
        "import django\n"
        "django.setup()\n"
        "from django.core.management import call_command\n"
        "call_command('migrate', interactive=False, verbosity=0)\n"
        "from django.contrib.auth import get_user_model\n"
        f"u = get_user_model().objects.create_user(username={USERNAME!r}, password={PASSWORD!r})\n"
        "u.mobile_reply_enabled = True\n"
        "u.save(update_fields=['mobile_reply_enabled'])\n"
    )
    subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, check=True)


# --- the world: daphne, phone, bridge ---------------------------------------------------------

class World:
    """``servers`` daphne processes: the bridge's tunnel on the first, the phone on the last."""

    def __init__(self, env: dict[str, str], workdir: Path, servers: int = 1) -> None:
        self.env = env
        self.workdir = workdir
        self.home = workdir / "bridge-home"
        self.ports = [free_port() for _ in range(servers)]
        self.bridge_url = f"http://127.0.0.1:{self.ports[0]}"
        self.url = f"http://127.0.0.1:{self.ports[-1]}"  # the phone's daphne
        self.ws_url = f"ws://127.0.0.1:{self.ports[-1]}"
        self.procs: list[Proc] = []
        self.server_ms: list[float] = []
        self.server_cpu_ms: list[float] = []
        self.floor_ms: list[float] = []
        self.floor_cpu_ms: list[float] = []
        self.floor_db_ms: list[float] = []  # /bench/floor-db: the stack and the answer's statements alone
        self.floor_db_cpu_ms: list[float] = []
        self.floor_db_db_ms: list[float] = []
        self.floor_db_calls: list[float] = []
        self.server_db_ms: list[float] = []
        self.server_db_calls: list[float] = []
        self.last_body: dict = {}
        self.phone: httpx.AsyncClient | None = None
        self.daemon: Daemon | None = None
        self.answer_ms: list[float] = []
        self.socket = None
        self.reader: asyncio.Task | None = None
        self.arrivals: dict[str, asyncio.Future] = {}

    async def start(self) -> None:
        servers = []
        for n, port in enumerate(self.ports):
            daphne = Proc([str(VENV_BIN / "daphne"), "-b", "127.0.0.1", "-p", str(port), "--access-log", os.devnull,
                           "bench.roundtrip_asgi:application"], self.workdir / f"daphne{n}.log", daphne_env(self.env, n))
            self.procs.append(daphne)
            servers.append((daphne, port))

        def healthy() -> bool:
            for daphne, port in servers:
                if not daphne.alive:
                    raise SystemExit(f"daphne exited:\n{daphne.log()[-3000:]}")
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:  # noqa: S310
                    if response.status != 200:
                        return False
            return True

        await wait_for(healthy, 60, "daphne")
        self.phone = httpx.AsyncClient(base_url=self.url, timeout=30)
        (await self.phone.get("/accounts/login/")).raise_for_status()
        login = await self.phone.post("/accounts/login/", data={
            "username": USERNAME, "password": PASSWORD, "csrfmiddlewaretoken": self.phone.cookies["csrftoken"]})
        if login.status_code != 302:
            raise SystemExit(f"login failed: {login.status_code} {login.text[:300]}")
        await self.pair()
        daemon = Proc([*BRIDGE, "--home", str(self.home), "run"],
                      self.workdir / "bridge.log", client_env())
        self.procs.append(daemon)
        await wait_for(lambda: (self.home / "local.json").exists(), 30, "the daemon's local API")

        async def online() -> bool:
            state = (await self.phone.get("/api/mobile/state")).json()
            return any(b["online"] for b in state["bridges"])

        await wait_for(online, 30, "the bridge's tunnel")
        self.daemon = Daemon(str(self.home))
        cookie = "; ".join(f"{k}={v}" for k, v in self.phone.cookies.items())
        self.socket = await websockets.connect(f"{self.ws_url}/ws/mobile", ping_interval=None, max_size=None,
                                               additional_headers={"Cookie": cookie, "Origin": self.url})
        snapshot = json.loads(await self.socket.recv())
        assert snapshot["type"] == "mobile.snapshot", snapshot
        self.reader = asyncio.create_task(self._read())

    async def pair(self) -> None:
        pairing = Proc([*BRIDGE, "--home", str(self.home), "pair", self.bridge_url,
                        "--name", "bench-desk"], self.workdir / "pair.log", client_env())
        self.procs.append(pairing)
        match = await wait_for(lambda: re.search(r"code: ([A-Z0-9]{4}-[A-Z0-9]{4})", pairing.log()), 30,
                               "the pairing user code")
        approved = await self.phone.post(f"/api/devices/pairings/code/{match.group(1)}/approve", headers=self.csrf)
        approved.raise_for_status()
        await wait_for(lambda: not pairing.alive, 30, "pair to finish")
        if pairing.popen.returncode != 0:
            raise SystemExit(f"pair failed:\n{pairing.log()}")

    @property
    def csrf(self) -> dict[str, str]:
        return {"X-CSRFToken": self.phone.cookies["csrftoken"]}

    async def _read(self) -> None:
        async for raw in self.socket:
            now = time.perf_counter()
            event = json.loads(raw)
            if event.get("type") == "mobile.question.created":
                question = event["question"]
                future = self.arrivals.get(question["questions"][0]["question"])
                if future is not None and not future.done():
                    future.set_result((now, question))

    def expect(self, text: str) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        self.arrivals[text] = future
        return future

    async def answer(self, question: dict, text: str) -> None:
        body = {"question_id": question["question_id"], "nonce": question["nonce"], "answers": {text: ["Yes"]}}
        start = time.perf_counter()
        response = await self.phone.post("/api/mobile/answer", json=body, headers=self.csrf)
        self.answer_ms.append(ms(start, time.perf_counter()))
        self._timing(response, self.server_ms, self.server_cpu_ms, self.server_db_ms, self.server_db_calls)
        if response.status_code != 200:
            raise RuntimeError(f"answer refused: {response.status_code} {response.text[:300]}")
        self.last_body = body

    async def floor(self) -> None:
        """The same POST to ``/bench/floor`` (bench/roundtrip_asgi.py): the stack without the answer."""
        response = await self.phone.post("/bench/floor", json=self.last_body, headers=self.csrf)
        if response.status_code != 200:
            raise RuntimeError(f"floor refused: {response.status_code} {response.text[:300]}")
        self._timing(response, self.floor_ms, self.floor_cpu_ms)

    async def floor_db(self) -> None:
        """The same POST to ``/bench/floor-db`` (bench/roundtrip_asgi.py): the stack, then the answer's reads
        and writes as bare statements, without the rest of the product."""
        response = await self.phone.post("/bench/floor-db", json=self.last_body, headers=self.csrf)
        if response.status_code != 200:
            raise RuntimeError(f"floor-db refused: {response.status_code} {response.text[:300]}")
        self._timing(response, self.floor_db_ms, self.floor_db_cpu_ms, self.floor_db_db_ms, self.floor_db_calls)

    @staticmethod
    def _timing(response: httpx.Response, wall: list[float], cpu: list[float], db: list[float] | None = None,
                db_calls: list[float] | None = None) -> None:
        timing = dict(part.strip().split(";dur=", 1) for part in response.headers.get("server-timing", "").split(",")
                      if ";dur=" in part)
        if "app" in timing:
            wall.append(float(timing["app"]))
            cpu.append(float(timing.get("cpu", "nan")))
            if db is not None and db_calls is not None:
                db.append(float(timing.get("db", "nan")))
                db_calls.append(float(timing.get("dbn", "nan")))

    async def stop(self) -> None:
        if self.reader:
            self.reader.cancel()
        if self.socket:
            await self.socket.close()
        if self.phone:
            await self.phone.aclose()
        for proc in reversed(self.procs):
            proc.stop()


# --- measurements ------------------------------------------------------------------------------

def ask_event(text: str, n: int) -> dict:
    return {"session_id": SESSION_ID, "transcript_path": "/tmp/bench.jsonl", "cwd": "/tmp/bench",
            "permission_mode": "default", "hook_event_name": "PreToolUse", "tool_name": "AskUserQuestion",
            "tool_input": {"questions": [{"question": text, "header": "Bench", "multiSelect": False, "options": [
                {"label": "Yes", "description": "go on"}, {"label": "No", "description": "stop"}]}]},
            "tool_use_id": f"toolu_bench_{n}"}


async def echo_rtt(url: str, samples: int) -> list[float]:
    async with websockets.connect(url, ping_interval=None) as ws:
        for _ in range(20):
            await ws.send(PAYLOAD)
            await ws.recv()
        times = []
        for _ in range(samples):
            start = time.perf_counter()
            await ws.send(PAYLOAD)
            await ws.recv()
            times.append(ms(start, time.perf_counter()))
        return times


def hook_argv(world: World) -> tuple[list[str], dict[str, str]]:
    """The command ``hooks install`` writes into settings.json, as argv + env, with what ``hooks install``
    writes for it: from a checkout the bytecode (this environment sets PYTHONDONTWRITEBYTECODE), from the
    .pyz the copy of its modules in the bridge's home (``clients.bridge.hook_cache``)."""
    if HOOK_PYZ is None:
        precompile_hook()
        launcher = None
    else:  # with the copy of its modules that `hooks install` writes into the bridge's home
        cache = hook_cache.cache_dir(world.home)
        hook_cache.extract(Path(HOOK_PYZ), cache)
        launcher = pyz_launcher(HOOK_PYZ, sys.executable, cache)
    words = shlex.split(hook_command(home=world.home, launcher=launcher, window=120, style="allow"))
    env = client_env()
    while words and "=" in words[0] and not words[0].startswith(("/", "-")):
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    return words, env


async def hook_run(world: World, event: dict) -> tuple[asyncio.subprocess.Process, float]:
    argv, env = hook_argv(world)
    t0 = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=ROOT, env=env, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    proc.stdin.write(json.dumps(event).encode())
    proc.stdin.close()
    return proc, t0


async def startup_costs(world: World, samples: int) -> dict[str, list[float]]:
    """Spawn -> exit of the hook with AI1NET_MOBILE_OFF=1 (reads stdin, loads its modules, asks nobody),
    sampled alternately with bare interpreters, so all three see the same machine."""
    argv, env = hook_argv(world)
    commands = {
        "hook": (argv, dict(env, AI1NET_MOBILE_OFF="1")),
        "bare -S": ([sys.executable, "-S", "-c", "pass"], env),
        "bare": ([sys.executable, "-c", "pass"], env),
    }
    times: dict[str, list[float]] = {name: [] for name in commands}
    for n in range(samples):
        for name, (command, command_env) in commands.items():
            t0 = time.perf_counter()
            proc = await asyncio.create_subprocess_exec(*command, cwd=ROOT, env=command_env,
                                                        stdin=asyncio.subprocess.PIPE,
                                                        stdout=asyncio.subprocess.DEVNULL)
            await proc.communicate(json.dumps(ask_event("noop", n)).encode())
            times[name].append(ms(t0, time.perf_counter()))
    return times


async def settle() -> None:
    """Each question starts a moment after the previous one ended, as in use (the agent works between
    two questions): the tail of the previous answer (the device's ack, the room's and phone's events,
    the bridge's bookkeeping) is not charged to the next question's first leg."""
    await asyncio.sleep(SETTLE_SEC)


async def one_hook_question(world: World, n: int) -> tuple[float, float]:
    text = f"Hook question {n}: go on?"
    await settle()
    arrival = world.expect(text)
    proc, t0 = await hook_run(world, ask_event(text, n))
    try:
        t1, question = await asyncio.wait_for(arrival, 30)
        start = time.perf_counter()
        posted = asyncio.create_task(world.answer(question, text))
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        t2 = time.perf_counter()
        await posted
        output = json.loads(line)
        assert output["hookSpecificOutput"]["updatedInput"]["answers"] == {text: "Yes"}, output
        stderr = await proc.stderr.read()
        assert await proc.wait() == 0 and not stderr, stderr
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return ms(t0, t1), ms(start, t2)


async def one_local_question(world: World, n: int) -> tuple[float, float]:
    """As the hook does it (its own Daemon client: one connection per request), minus the interpreter."""
    text = f"Local question {n}: go on?"
    await settle()
    arrival = world.expect(text)
    event = ask_event(text, 100_000 + n)
    body = {"session_id": SESSION_ID, "tool_use_id": event["tool_use_id"], "tool_input": event["tool_input"],
            "cwd": event["cwd"], "window_sec": 120}
    t0 = time.perf_counter()
    asked = await asyncio.to_thread(world.daemon.post, "pre-tool-use", body, 20.0)
    t1, question = await asyncio.wait_for(arrival, 30)
    waiting = asyncio.create_task(asyncio.to_thread(
        world.daemon.post, "questions/wait", {"question_id": asked["question_id"], "timeout": 25}, 30.0))
    start = time.perf_counter()
    await world.answer(question, text)
    result = await asyncio.wait_for(waiting, 30)
    t2 = time.perf_counter()
    assert result.get("state") == "answered" and result["answers"] == {text: ["Yes"]}, result
    return ms(t0, t1), ms(start, t2)


async def run_config(name: str, label: str, env: dict[str, str], args, workdir: Path) -> list[Row]:
    servers = 2 if name == "scaled" else 1
    print(f"\n== {CONFIG_LABEL[name]}: {label} ==  (logs: {workdir})", flush=True)
    load_before = os.getloadavg()[0]
    prepare_database(env)
    world = World(env, workdir, servers=servers)
    echo_samples = 100 if args.quick else max(200, args.questions)

    try:
        await world.start()
        echo = await echo_rtt(f"{world.ws_url}/ws/echo", echo_samples)
        echo_layer = await echo_rtt(f"{world.ws_url}/ws/echo-layer", echo_samples)
        start = {"session_id": SESSION_ID, "transcript_path": "/tmp/bench.jsonl", "cwd": "/tmp/bench",
                 "hook_event_name": "SessionStart", "source": "startup"}
        proc, _ = await hook_run(world, start)
        await proc.communicate()
        startup = await startup_costs(world, 10 if args.quick else 50)
        warmup = 3 if args.quick else WARMUP
        began = time.perf_counter()
        for n in range(warmup):
            await one_hook_question(world, -1 - n)
            await one_local_question(world, -1 - n)
            await world.floor()
            await world.floor_db()  # the first makes the floor's tables, outside the timings
        each = (time.perf_counter() - began) / warmup
        print(f"  ~{each * 1000:.0f} ms per question pair; {args.questions} pairs ~{each * args.questions:.0f} s",
              flush=True)
        hook1, hook2, local1, local2 = [], [], [], []
        world.answer_ms.clear()
        world.server_ms.clear()
        world.server_cpu_ms.clear()
        world.floor_ms.clear()
        world.floor_cpu_ms.clear()
        for figures in (world.floor_db_ms, world.floor_db_cpu_ms, world.floor_db_db_ms, world.floor_db_calls):
            figures.clear()
        world.server_db_ms.clear()
        world.server_db_calls.clear()
        for n in range(args.questions):  # interleaved, so both see the same conditions
            a, b = await one_hook_question(world, n)
            hook1.append(a)
            hook2.append(b)
            a, b = await one_local_question(world, n)
            local1.append(a)
            local2.append(b)
            for _ in range(1 if args.quick else 2):  # between the questions, outside their timings
                # Each after the pause an answer follows: right after a request the server (and its
                # database's process) is warm, which flattered the floors (bench/NOTES.md).
                await settle()
                await world.floor()
                await settle()
                await world.floor_db()
        echo_after = await echo_rtt(f"{world.ws_url}/ws/echo", echo_samples)
    finally:
        await world.stop()
    echo_all = echo + echo_after
    rows = [
        ("echo: bare Channels WS round trip, 200 B", echo_all),
        ("echo via layer group_send (reference)", echo_layer),
        ("bare interpreter: python -c pass", startup["bare"]),
        ("bare interpreter: python -S -c pass", startup["bare -S"]),
        ("hook start-up: spawn -> exit (MOBILE_OFF=1)", startup["hook"]),
        ("leg 1 hook: hook start -> phone WS", hook1),
        ("leg 1 local: POST /v1/pre-tool-use -> WS", local1),
        ("leg 2 hook: phone POST answer -> stdout", hook2),
        ("leg 2 local: phone POST -> /v1 wait returns", local2),
        ("  of which phone POST /api/mobile/answer", world.answer_ms),
        ("  of which server time (Server-Timing)", world.server_ms),
        ("  server CPU meanwhile (Server-Timing cpu)", world.server_cpu_ms),
        ("  in database calls (Server-Timing db)", world.server_db_ms),
        ("floor: same POST, stack only (/bench/floor)", world.floor_ms),
        ("  floor: server CPU meanwhile", world.floor_cpu_ms),
        ("floor: stack + statements (/bench/floor-db)", world.floor_db_ms),
        ("  floor-db: server CPU meanwhile", world.floor_db_cpu_ms),
        ("  floor-db: in database calls", world.floor_db_db_ms),
        ("hook total: leg 1 + leg 2", [a + b for a, b in zip(hook1, hook2, strict=True)]),
        ("local total: leg 1 + leg 2", [a + b for a, b in zip(local1, local2, strict=True)]),
    ]
    e50, e99 = pct(echo_all, 0.5), pct(echo_all, 0.99)
    print(f"  {'leg (ms)':44s} {'n':>5s} {'p50':>8s} {'p99':>8s} {'x echo p50':>11s} {'x echo p99':>11s}")
    for row_name, values in rows:
        p50, p99 = pct(values, 0.5), pct(values, 0.99)
        print(f"  {row_name:44s} {len(values):5d} {p50:8.2f} {p99:8.2f} {p50 / e50:10.1f}x {p99 / e99:10.1f}x")
    print(f"  (echo before the questions p50/p99 {pct(echo, .5):.2f}/{pct(echo, .99):.2f}, "
          f"after {pct(echo_after, .5):.2f}/{pct(echo_after, .99):.2f}; "
          f"1-min load average {load_before:.1f} at start, {os.getloadavg()[0]:.1f} at end)", flush=True)
    return report_rows(CONFIG_LABEL[name], echo_all, startup, hook1, hook2, local1, local2, world)


def report_rows(config: str, echo: list[float], startup: dict[str, list[float]], hook1: list[float],
                hook2: list[float], local1: list[float], local2: list[float], world: World) -> list[Row]:
    """The three rows of issue 10 (bench/report.py), each beside the bare echo of the same run."""
    e50, e99 = pct(echo, 0.5), pct(echo, 0.99)
    baseline = f"echo p50 {e50:.2f} / p99 {e99:.2f} ms"

    def figure(values: list[float]) -> str:
        return f"p50 {pct(values, 0.5):.1f} / p99 {pct(values, 0.99):.1f} ms (n={len(values)})"

    hook_start, bare_s, bare = (pct(startup[k], 0.5) for k in ("hook", "bare -S", "bare"))
    leg1 = Row(
        path="hook starts -> phone shows question", config=config, measured=figure(hook1), baseline=baseline,
        ratio=round(pct(hook1, 0.99) / e99, 1), value=round(pct(hook1, 0.99), 1), target=f"<= {TARGETS['leg1']:g}",
        unit="ms p99",
        notes=[f"hook start-up (spawn -> exit, mobile reply off) p50 {hook_start:.1f} ms beside a bare "
               f"`python -S -c pass` {bare_s:.1f} ms and `python -c pass` {bare:.1f} ms (same run, alternating)",
               f"without the interpreter (the daemon's loopback API -> phone WS): {figure(local1)}"])
    leg2 = Row(
        path="phone POSTs answer -> hook prints", config=config, measured=figure(hook2), baseline=baseline,
        ratio=round(pct(hook2, 0.99) / e99, 1), value=round(pct(hook2, 0.99), 1), target=f"<= {TARGETS['leg2']:g}",
        unit="ms p99",
        notes=[f"the POST's own client-side time {figure(world.answer_ms)}; "
               f"to the daemon's waiting loopback request: {figure(local2)}"])
    server = world.server_ms or [float("nan")]
    post = Row(
        path="server time of one answer POST", config=config,
        measured=f"median {pct(server, 0.5):.2f} / p99 {pct(server, 0.99):.2f} ms (n={len(server)})",
        baseline=baseline, ratio=round(pct(server, 0.5) / e50, 1), value=round(pct(server, 0.5), 2),
        target=f"<= {TARGETS['post']:g}", unit="ms median",
        floor="the stack and the answer's statements alone (/bench/floor-db)",
        floor_value=round(pct(world.floor_db_ms, 0.5), 2) if world.floor_db_ms else None,
        notes=["Server-Timing: daphne's ASGI call -> response start (middleware, session, view, service, "
               "commit), bench/roundtrip_asgi.py",
               f"CPU time of the phone's daphne process meanwhile: median {pct(world.server_cpu_ms or [0.0], 0.5):.2f}"
               f" ms (the rest of the wall time is waiting: for the database, for a core; 1-min load average "
               f"{os.getloadavg()[0]:.1f} at the end)",
               f"in database calls (statements and commits, from Django's execute to the result): median "
               f"{pct(world.server_db_ms or [0.0], 0.5):.2f} ms, {pct(world.server_db_calls or [0.0], 0.5):.0f} calls",
               f"floor, the same POST through the same stack (middleware, session, user, DRF view, switch and "
               f"two-factor checks, serializer) without the answer (/bench/floor): median "
               f"{pct(world.floor_ms or [0.0], 0.5):.2f} ms, CPU {pct(world.floor_cpu_ms or [0.0], 0.5):.2f} ms",
               f"floor, that stack and then the answer's database work as bare statements (the question's read; "
               f"the answer's writes, same kinds, order and pipeline; a durable commit) without the rest of the "
               f"product (/bench/floor-db): median {pct(world.floor_db_ms or [0.0], 0.5):.2f} ms, CPU "
               f"{pct(world.floor_db_cpu_ms or [0.0], 0.5):.2f} ms, in database calls "
               f"{pct(world.floor_db_db_ms or [0.0], 0.5):.2f} ms, {pct(world.floor_db_calls or [0.0], 0.5):.0f} calls"])
    return [leg1, leg2, post]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, default=None,
                        help=f"questions per leg and configuration (default 300, {QUICK_QUESTIONS} with --quick)")
    parser.add_argument("--quick", action="store_true", help="few samples: about a minute for both configurations")
    parser.add_argument("--config", choices=["embedded", "scaled", "both"], default="both")
    parser.add_argument("--json", help="append the rows of issue 10 to this file (bench/report.py)")
    parser.add_argument("--keep-logs", action="store_true", help="keep the temp folder with the processes' logs")
    parser.add_argument("--client", choices=["pyz", "checkout"], default="pyz",
                        help="run the bridge and its hook from a .pyz built for the run (as users do), or the checkout")
    args = parser.parse_args()
    stop_cleanly_on_sigterm()
    global HOOK_PYZ
    if args.client == "pyz":
        pyz = client_pyz()
        BRIDGE[:] = [sys.executable, "-I", "-S", pyz]
        HOOK_PYZ = str(pyz)
    if args.questions is None:
        args.questions = QUICK_QUESTIONS if args.quick else 300
    if args.questions < 1:
        parser.error("--questions must be at least 1")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "REDIS_URL", "AI1NET_REDIS"))}
    base.update({"DJANGO_SETTINGS_MODULE": "bench.settings_bench", "AI1NET_DEBUG": "1", "PYTHONPATH": str(ROOT),
                 "PYTHONUNBUFFERED": "1", "AI1NET_PAIRING_INTERVAL_SEC": "1", "AI1NET_MOBILE_REPLY": "1"})
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores, {args.questions} questions per leg "
          f"(+{3 if args.quick else WARMUP} warm-up), hook and local-API questions interleaved, one at a time; the "
          f"bridge and its hook from {'a .pyz built for the run, as users run them' if args.client == 'pyz' else 'the checkout'}")
    configs = ["embedded", "scaled"] if args.config == "both" else [args.config]
    rows: list[Row] = []
    for config in configs:
        workdir = Path(tempfile.mkdtemp(prefix=f"ai1net-roundtrip-{config}-"))
        ok = False
        try:
            if config == "embedded":
                env = dict(base, DATABASE_URL=f"sqlite:///{workdir / 'bench.sqlite3'}")
                rows += await run_config(config, "SQLite (temp file) + in-memory channel layer", env, args, workdir)
            else:
                with postgres_database() as url, redis_prefix() as prefix:
                    env = dict(base, DATABASE_URL=url, REDIS_URL=REDIS_URL, AI1NET_REDIS_PREFIX=prefix)
                    rows += await run_config(config, "PostgreSQL 127.0.0.1:5432 + Redis channel layer", env, args,
                                             workdir)
            ok = True
        finally:
            if ok and not args.keep_logs:
                shutil.rmtree(workdir, ignore_errors=True)
    append(args.json, rows)
    print()
    for row in rows:
        print(f"  {row.path} [{row.config}]: {row.measured}; {row.baseline}; target {row.target} {row.unit}: "
              f"{'met' if row.met else 'NOT met'}")


if __name__ == "__main__":
    asyncio.run(main())
