"""Instructions per HTTP request in daphne, counted by valgrind's callgrind: a figure that repeats.

    .venv/bin/python -m bench.instructions                        # every path below; 100 each, ~2 min
    .venv/bin/python -m bench.instructions --requests 200 --paths floor,answer
    .venv/bin/python -m bench.instructions --pg --paths echo-connect,tunnel-connect   # PostgreSQL + Redis

On the shared 2-core bench machines a path's wall and CPU times move by 10-30% from one run to the next (the
machine's own speed drifts), so a change that saves 2% of a request cannot be seen in them, however the runs
are interleaved. callgrind counts the instructions the daphne process executes, in every thread. On an
otherwise idle machine the same code counted the same to within 0.1% per floor POST from one run to the next,
about 1% per answer POST and 3-5% per connect; a busy machine adds a few percent (the loop's timers and the
threads' hand-overs run more often), so compare runs made alike. It is no stand-in for time (a cache miss or a wait for the database costs no instructions), and it
runs the process some 50 times slower; what it tells is how much work a change took away.

One daphne process (the embedded default: SQLite in a temp folder, the in-memory layer; with ``--pg`` a fresh
PostgreSQL database on 127.0.0.1:5432 and Redis on 127.0.0.1:6379 under a unique prefix, both removed at the
end, where only daphne's side of each database and Redis call is counted) serves
``bench.roundtrip_asgi:application`` under ``valgrind --tool=callgrind``. A logged-in client on one
keep-alive connection (plain sockets: every counted request is the same few bytes) sends, per path, some
requests to warm up, then ``--requests`` more with the counters zeroed before them and dumped after:

- ``bare``: ``GET /bench/gc``, answered by a plain ASGI callable in front of Django: daphne's own HTTP work;
- ``floor``: ``POST /bench/floor``, the answer POST without the answer (every middleware, the session and
  user, the DRF view with its checks, the serializer; bench/roundtrip_asgi.py);
- ``answer``: ``POST /api/mobile/answer`` for a pending question of a paired bridge (one question each; the
  bridge is not connected, so the answer waits in its outbox): the request of the "server time" row;
- ``echo-connect``: a WebSocket opened on the bare Channels echo and its first frame answered (the baseline
  of the connects row), each kept open until the count is taken, as in that row;
- ``tunnel-connect``: a device's tunnel opened and its hello answered, by bridges that connected before (as
  after a platform restart: bench/tunnel.py's connect storm), each kept open likewise.

Printed: million instructions per request or connect, and each beside ``bare`` (the connects, beside
``echo-connect``). The event loop's timers run while the
requests do (under 1% of the counts here). Needs ``valgrind`` (Debian's package); a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
VENV_BIN = Path(sys.executable).parent

import httpx  # noqa: E402
import websockets  # noqa: E402

from bench import stop_cleanly_on_sigterm  # noqa: E402
from bench.roundtrip import (  # noqa: E402
    PASSWORD,
    REDIS_URL,
    USERNAME,
    free_port,
    postgres_database,
    prepare_database,
    redis_prefix,
)
from bench.tunnel import PAYLOAD, RESTART_ACKED_SEQ, tunnel_open  # noqa: E402
from bench.tunnel import prepare_database as make_bridges  # noqa: E402

PATHS = ("bare", "floor", "answer", "echo-connect", "tunnel-connect")
CONNECTS = ("echo-connect", "tunnel-connect")
WARMUP = 20
QUESTION = "Which framework?"

# Run in the benchmark's Django (its settings, its database): a bridge paired to the phone's user, one agent
# session, and `count` pending questions; prints their ids and nonces (as /api/mobile/pending gives them).
ASK = """
import json, sys, uuid
import django
django.setup()
from django.contrib.auth import get_user_model
from devices.models import Device
from devices.services import device_create
from mobile import services
from mobile.models import Question
user = get_user_model().objects.get(username=sys.argv[1])
device, _token = device_create(owner=user, name="bench-desk", kind=Device.Kind.BRIDGE, hostname="bench-desk.local")
services.session_start(device=device, session_id="bench-session", cwd="/tmp/bench", source="startup", host="bench")
asked = []
for n in range(int(sys.argv[2])):
    qid = str(uuid.uuid4())
    services.question_create(device=device, question_id=qid, session_id="bench-session", tool_use_id=f"toolu_{n}",
                             questions=[{"question": sys.argv[3], "header": "Framework", "multiSelect": False,
                                         "options": [{"label": "React"}, {"label": "Vue"}]}], window_sec=3600)
    asked.append([qid, services.nonce_for(Question.objects.get(pk=qid))])
print(json.dumps(asked))
"""


class Client:
    """One keep-alive HTTP/1.1 connection, as few instructions on this side as a client can take."""

    def __init__(self, port: int, cookie: str = "", csrf: str = "") -> None:
        self.port, self.cookie, self.csrf = port, cookie, csrf
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        head = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{self.port}"]
        if self.cookie:
            head.append(f"Cookie: {self.cookie}")
        if body:
            head += [f"X-CSRFToken: {self.csrf}", "Content-Type: application/json", f"Content-Length: {len(body)}"]
        self.writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        assert self.reader is not None
        lines = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
        length = next((int(value) for name, value in headers.items() if name.lower() == "content-length"), None)
        if length is not None:
            return status, await self.reader.readexactly(length)
        chunks = []  # chunked
        while True:
            size = int((await self.reader.readuntil(b"\r\n")).strip(), 16)
            chunks.append(await self.reader.readexactly(size + 2))
            if size == 0:
                return status, b"".join(chunks)


async def log_in(port: int) -> Client:
    """The phone's session, through Django's login form as bench/roundtrip.py logs in (before any count)."""
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120) as phone:
        (await phone.get("/accounts/login/")).raise_for_status()
        login = await phone.post("/accounts/login/", data={"username": USERNAME, "password": PASSWORD,
                                                           "csrfmiddlewaretoken": phone.cookies["csrftoken"]})
        if login.status_code != 302:
            raise SystemExit(f"login failed: {login.status_code} {login.text[:300]}")
        cookies = dict(phone.cookies.items())
    return Client(port, "; ".join(f"{name}={value}" for name, value in cookies.items()), cookies["csrftoken"])


class Counted:
    """daphne under callgrind, its counters driven by ``callgrind_control``."""

    def __init__(self, workdir: Path, env: dict[str, str], port: int) -> None:
        self.workdir = workdir
        self.log = open(workdir / "daphne.log", "wb")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={workdir}/callgrind.%p",
             sys.executable, str(VENV_BIN / "daphne"), "-b", "127.0.0.1", "-p", str(port), "--access-log", os.devnull,
             "bench.roundtrip_asgi:application"], cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True)

    def control(self, *args: str) -> None:
        # Taken when the process next runs code: daphne's timers wake it several times a second.
        subprocess.run(["callgrind_control", *args, str(self.popen.pid)], check=True, capture_output=True,
                       timeout=120)

    def dump(self, name: str) -> int:
        """The instructions counted since the last zeroing."""
        self.control("--dump=" + name)
        newest = max(self.workdir.glob(f"callgrind.{self.popen.pid}.*"), key=lambda path: path.stat().st_mtime)
        match = re.search(r"^(?:summary|totals): (\d+)", newest.read_text(errors="replace"), re.MULTILINE)
        if match is None:
            raise SystemExit(f"no totals in {newest}")
        return int(match.group(1))

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(60)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self.log.close()


async def count(counted: Counted, client: Client, name: str, requests: int, questions: list[list[str]],
                bridges: list[tuple[str, str]]) -> int:
    url = f"ws://127.0.0.1:{client.port}"
    sockets: list[websockets.ClientConnection] = []

    async def one(n: int) -> None:
        if name == "echo-connect":
            ws = await websockets.connect(f"{url}/ws/echo", ping_interval=None, open_timeout=120)
            await ws.send(PAYLOAD)
            await ws.recv()
            sockets.append(ws)
            return
        if name == "tunnel-connect":
            sockets.append(await tunnel_open(url, bridges[n][1], RESTART_ACKED_SEQ))
            return
        if name == "bare":
            status, body = await client.request("GET", "/bench/gc")
        else:
            qid, nonce = questions[n]
            answer = json.dumps({"question_id": qid, "nonce": nonce, "answers": {QUESTION: ["Vue"]}}).encode()
            status, body = await client.request("POST", "/api/mobile/answer" if name == "answer" else "/bench/floor",
                                                answer)
        if status != 200:
            raise SystemExit(f"{name}: {status} {body[:300]!r}")

    try:
        for n in range(WARMUP):
            await one(n)
        await asyncio.to_thread(counted.control, "--zero")
        for n in range(WARMUP, WARMUP + requests):
            await one(n)
        return await asyncio.to_thread(counted.dump, name)
    finally:  # closed after the count, as the connects row leaves closes out
        await asyncio.gather(*[ws.close() for ws in sockets], return_exceptions=True)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=100, help="counted requests per path (default 100)")
    parser.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated, of {', '.join(PATHS)}")
    parser.add_argument("--keep-logs", action="store_true", help="keep the temp folder (callgrind's files, the log)")
    parser.add_argument("--pg", action="store_true", help="PostgreSQL + Redis on this machine, not the embedded default")
    args = parser.parse_args()
    paths = [path for path in args.paths.split(",") if path]
    if args.requests < 1 or not paths or set(paths) - set(PATHS):
        parser.error(f"--requests must be at least 1 and --paths a list of {', '.join(PATHS)}")
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("needs valgrind (Debian's package valgrind)")
    stop_cleanly_on_sigterm()
    workdir = Path(tempfile.mkdtemp(prefix="ai1net-instructions-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "REDIS_URL", "AI1NET_"))}
    env.update({"DJANGO_SETTINGS_MODULE": "bench.settings_bench", "AI1NET_DEBUG": "1", "PYTHONPATH": str(ROOT),
                "AI1NET_MOBILE_REPLY": "1", "DATABASE_URL": f"sqlite:///{workdir / 'bench.sqlite3'}"})
    with contextlib.ExitStack() as stack:
        if args.pg:
            env.update(DATABASE_URL=stack.enter_context(postgres_database()), REDIS_URL=REDIS_URL,
                       AI1NET_REDIS_PREFIX=stack.enter_context(redis_prefix()))
        await run(args, paths, workdir, env)


async def run(args: argparse.Namespace, paths: list[str], workdir: Path, env: dict[str, str]) -> None:
    config = "PostgreSQL + Redis" if args.pg else "embedded (SQLite, the in-memory layer)"
    print(f"configuration: {config}; database {env['DATABASE_URL']}", flush=True)
    prepare_database(env)
    asked = subprocess.run([sys.executable, "-c", ASK, USERNAME, str(2 * (WARMUP + args.requests)), QUESTION],
                           cwd=ROOT, env=env, check=True, capture_output=True, text=True)
    questions = json.loads(asked.stdout.strip().splitlines()[-1])
    bridges = make_bridges(env, WARMUP + args.requests) if "tunnel-connect" in paths else []
    port = free_port()
    counted = Counted(workdir, env, port)
    ok = False
    try:
        began = time.monotonic()
        while True:  # daphne under callgrind takes a minute or so to listen
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                break
            except OSError:
                if counted.popen.poll() is not None or time.monotonic() - began > 600:
                    raise SystemExit(f"daphne did not start:\n{(workdir / 'daphne.log').read_text()[-3000:]}") from None
                await asyncio.sleep(1)
        client = await log_in(port)
        await asyncio.to_thread(counted.control, "--instr=on")
        figures: dict[str, float] = {}
        for name in paths:
            # The floor takes the answer's first questions' bodies (it answers none of them); the answers, the rest.
            offset = WARMUP + args.requests if name == "answer" else 0
            total = await count(counted, client, name, args.requests, questions[offset:], bridges)
            figures[name] = total / args.requests / 1e6
            unit = "connect" if name in CONNECTS else "request"
            print(f"  {name}: {figures[name]:.3f} million instructions per {unit} ({args.requests} counted)",
                  flush=True)
        ok = True
    finally:
        counted.stop()
        if ok and not args.keep_logs:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"  logs and callgrind's files: {workdir}")
    print(f"\n{config}:\n| path | million instructions per request or connect | x baseline (bare; echo-connect) |"
          "\n|---|---|---|")
    for name, figure in figures.items():
        baseline = figures.get("echo-connect" if name in CONNECTS else "bare")
        ratio = f"{figure / baseline:.2f}" if baseline else "-"
        print(f"| {name} | {figure:.3f} | {ratio} |")


if __name__ == "__main__":
    asyncio.run(main())
