"""Device web throughput: the same requests through the tunnel and straight to the local service.

    .venv/bin/python bench/deviceweb.py [--runs 3] [--small 500]

Starts its own world in a temporary folder: a SQLite database (or DATABASE_URL / REDIS_URL when set:
the scaled-out configuration), daphne, the local service of tests/deviceweb/upstream.py and a bridge
that exposes it. Measures a 10 MB and a 100 MB download (MiB/s, median of --runs) and small requests
(requests/s: one keep-alive client in a row, and 8 clients at once), each beside the same request
straight to 127.0.0.1:<port> in the same run, and prints the ratio.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
PY = sys.executable
MIB = 1024 * 1024


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


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except Exception:  # noqa: S110 - not up yet
            pass
        time.sleep(0.1)
    raise RuntimeError(f"timed out waiting for {what}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--small", type=int, default=500, help="small requests per measurement")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run(Path(tmp), args)


def run(tmp: Path, args: argparse.Namespace) -> None:
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="ai1net.settings", AI1NET_DEBUG="1", PYTHONUNBUFFERED="1",
               AI1NET_REDIS_PREFIX=f"bench{os.getpid()}")
    env.setdefault("DATABASE_URL", f"sqlite:///{tmp / 'bench.sqlite3'}")
    os.environ.update(env)
    subprocess.run([PY, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True)

    import django

    django.setup()
    import httpx

    from ai1net.accounts.models import User
    from clients.common.credentials import Credential, save_credential
    from devices import services
    from devices.models import Device

    password = "bench password 1234 horse"  # noqa: S105 - a throwaway local account
    user = User.objects.create_user(username=f"bench{os.getpid()}", password=password, device_web_enabled=True)
    procs: list[subprocess.Popen] = []

    def start(argv: list[str], log: str, **extra: str) -> subprocess.Popen:
        handle = open(tmp / log, "wb")  # noqa: SIM115 - lives as long as the process
        proc = subprocess.Popen(argv, cwd=ROOT, env=dict(env, **extra), stdout=handle, stderr=subprocess.STDOUT)
        procs.append(proc)
        return proc

    try:
        port = free_port()
        profile = ["-m", "cProfile", "-o", os.environ["BENCH_PROFILE_DAPHNE"]] if os.environ.get(
            "BENCH_PROFILE_DAPHNE") else []
        start([PY, *profile, str(Path(PY).parent / "daphne"), "-b", "127.0.0.1", "-p", str(port), "--access-log", os.devnull,
               "ai1net.asgi:application"], "daphne.log")
        server = f"http://127.0.0.1:{port}"
        wait_for(lambda: httpx.get(f"{server}/healthz").status_code == 200, 30, "daphne")
        web_port = free_port(20000, 20999)
        start([PY, str(ROOT / "tests/deviceweb/upstream.py"), str(web_port)], "upstream.log")
        local = f"http://127.0.0.1:{web_port}"
        wait_for(lambda: httpx.get(f"{local}/small").status_code == 200, 30, "the local service")
        device, token = services.device_create(owner=user, name="bench", kind=Device.Kind.BRIDGE)
        home = tmp / "home"
        save_credential(home, Credential(url=server, device_id=str(device.pk), token=token, kind="bridge",
                                         name="bench"))
        client_env = {k: v for k, v in env.items() if k not in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE")}
        handle = open(tmp / "bridge.log", "wb")  # noqa: SIM115
        profile = ["-m", "cProfile", "-o", os.environ["BENCH_PROFILE_BRIDGE"]] if os.environ.get(
            "BENCH_PROFILE_BRIDGE") else []
        procs.append(subprocess.Popen([PY, *profile, "-m", "clients.bridge", "--home", str(home), "run", "--expose",
                                       str(web_port)], cwd=ROOT, env=client_env, stdout=handle,
                                      stderr=subprocess.STDOUT))
        wait_for(lambda: Device.objects.get(pk=device.pk).is_online, 30, "the bridge")

        tunnel = httpx.Client(base_url=f"{server}/d/{device.pk}/{web_port}", timeout=120)
        tunnel.get(f"{server}/accounts/login/")
        tunnel.post(f"{server}/accounts/login/", data={"username": user.username, "password": password,
                                                      "csrfmiddlewaretoken": tunnel.cookies["csrftoken"]})
        direct = httpx.Client(base_url=local, timeout=120)
        assert tunnel.get("/small").text == "ok", "login or tunnel failed"
        layer = "Redis" if os.environ.get("REDIS_URL") else "in-memory"
        print(f"device web benchmark: daphne + bridge on loopback, {layer} channel layer, "
              f"median of {args.runs} runs; ratio = through the tunnel / straight to the local service")
        print(f"{'measurement':34} {'tunnel':>12} {'direct':>12} {'ratio':>7}")

        def download(client: httpx.Client, size: int) -> float:
            started, got = time.perf_counter(), 0
            with client.stream("GET", "/bytes", params={"n": size}) as response:
                for chunk in response.iter_raw(1024 * 1024):
                    got += len(chunk)
            assert got == size, got
            return size / MIB / (time.perf_counter() - started)

        def small_serial(client: httpx.Client) -> float:
            started = time.perf_counter()
            for _ in range(args.small):
                assert client.get("/small").status_code == 200
            return args.small / (time.perf_counter() - started)

        def small_parallel(client: httpx.Client) -> float:
            started = time.perf_counter()
            with ThreadPoolExecutor(8) as pool:
                results = list(pool.map(lambda _: client.get("/small").status_code, range(args.small)))
            assert set(results) == {200}
            return args.small / (time.perf_counter() - started)

        cases = [
            ("download 10 MB (MiB/s)", lambda c: download(c, 10 * MIB)),
            ("download 100 MB (MiB/s)", lambda c: download(c, 100 * MIB)),
            ("small requests, 1 client (req/s)", small_serial),
            ("small requests, 8 clients (req/s)", small_parallel),
        ]
        for name, fn in cases:
            through = statistics.median(fn(tunnel) for _ in range(args.runs))
            straight = statistics.median(fn(direct) for _ in range(args.runs))
            print(f"{name:34} {through:12.1f} {straight:12.1f} {through / straight:7.3f}", flush=True)
    finally:
        for proc in reversed(procs):
            proc.send_signal(signal.SIGINT)  # the bridge stops cleanly (and writes its profile)
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        user.delete()  # and its device: leave a shared DATABASE_URL as we found it


if __name__ == "__main__":
    main()
