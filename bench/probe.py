"""A probe's remote hands as an agent feels them: one read command through the API, beside a bare API request.

    .venv/bin/python -m bench.probe                     # both configurations, 300 commands per daphne
    .venv/bin/python -m bench.probe --config embedded --commands 100

Each configuration starts its own world in a temporary folder (bench.deviceweb's helpers): daphne, a user
with an API token, and a probe whose tunnel is on daphne A. The probe runs as users run it: its ``.pyz``, built
from the checkout for the run, on a bare interpreter (``python -I -S ai1net-probe.pyz run URL --allow ROOT``);
``--client checkout`` runs ``python -m clients.probe`` instead.

- ``embedded``: a SQLite file and the in-memory channel layer, one daphne.
- ``pg+redis, 2 daphne``: a fresh PostgreSQL database and the Redis channel layer, two daphne processes; the
  agent asks on A (the probe's daphne: the call goes straight to the tunnel consumer) and on B (the call
  crosses to A over its stream relay).

Measured, one after another on a kept connection with the agent's token: ``POST /api/probes/<probe>/commands
{"op": "read", ...}`` answered with the file's lines (the command's row, its audit, the call to the probe
and back, the result stored), beside ``GET /api/probes/<probe>`` (the token, one read: an API request's
floor on the same daphne), sampled alternately. Printed, not a row of issue 10 (no target there).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from bench import client_pyz, stop_cleanly_on_sigterm  # noqa: E402
from bench.deviceweb import PY, REDIS_URL, World, postgres_database, redis_prefix, wait_for  # noqa: E402
from bench.report import p50_p99  # noqa: E402

SETUP = """
import json
from ai1net.accounts.models import User
from ai1net.accounts.services import api_token_create
from devices import services
user = User.objects.create_user(username="probebench", password="bench password 1234 horse")
device, token = services.device_create(owner=user, name="bench-probe", kind="probe")
print(json.dumps({"device_id": str(device.pk), "token": token, "api": api_token_create(user=user, name="agent")[1]}))
"""


def measure(client: httpx.Client, commands: int, path: str) -> tuple[list[float], list[float]]:
    """(read command round trips, bare API request round trips), in ms, sampled alternately."""
    body = {"op": "read", "args": {"path": path, "limit": 50}, "wait": 20}
    reads, floor = [], []
    for n in range(commands + 20):
        started = time.perf_counter()
        answer = client.post("/api/probes/bench-probe/commands", json=body)
        done = time.perf_counter()
        assert answer.status_code == 200 and answer.json()["state"] == "done", answer.text[:300]
        start_floor = time.perf_counter()
        assert client.get("/api/probes/bench-probe").status_code == 200
        floor_done = time.perf_counter()
        if n >= 20:  # after the warm-up
            reads.append((done - started) * 1000)
            floor.append((floor_done - start_floor) * 1000)
    return reads, floor


def run_config(config: str, base: dict[str, str], commands: int, probe: list[str]) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="ai1net-probebench-"))
    world = World(tmp, {})
    with contextlib.ExitStack() as stack:
        if config == "embedded":
            world.env = dict(base, DATABASE_URL=f"sqlite:///{tmp / 'bench.sqlite3'}")
            daphnes = 1
        else:
            world.env = dict(base, DATABASE_URL=stack.enter_context(postgres_database()), REDIS_URL=REDIS_URL,
                             AI1NET_REDIS_PREFIX=stack.enter_context(redis_prefix()))
            daphnes = 2
        try:
            subprocess.run([PY, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=world.env, check=True)
            out = subprocess.run([PY, "manage.py", "shell", "-v", "0", "-c", SETUP], cwd=ROOT, env=world.env,
                                 check=True, capture_output=True, text=True).stdout
            made = json.loads(out.strip().splitlines()[-1])
            for i in range(daphnes):
                world.daphne(f"daphne-{'AB'[i]}")
            project = tmp / "project"
            project.mkdir()
            target = project / "module.py"
            target.write_text("".join(f"def function_{n}(value):\n    return value * {n}\n" for n in range(100)))
            probe_env = {k: v for k, v in world.env.items()
                         if not k.startswith(("DATABASE_URL", "REDIS_URL", "DJANGO_", "AI1NET_REDIS"))}
            probe_env.update({"AI1NET_PROBE_TOKEN": made["token"], "AI1NET_PROBE_DEVICE_ID": made["device_id"]})
            world.start([*probe, "run", world.servers[0], "--allow", str(project)], "probe.log", env=probe_env)
            clients = [httpx.Client(base_url=server, headers={"Authorization": f"Bearer {made['api']}"}, timeout=30)
                       for server in world.servers]
            wait_for(lambda: clients[0].get("/api/probes/bench-probe").json().get("online") is True, 30,
                     "the probe online")
            labels = ["on the probe's daphne", "on the other daphne (its stream relay)"]
            print(f"\n== {config}: {daphnes} daphne; a read command through the API beside GET /api/probes/<probe>")
            for label, client in zip(labels, clients, strict=False):
                reads, floor = measure(client, commands, str(target))
                print(f"  probe read {label}: {p50_p99(reads)}; the bare API request {p50_p99(floor)}; p50 ratio "
                      f"{statistics.median(reads) / statistics.median(floor):.2f}", flush=True)
            for client in clients:
                client.close()
        finally:
            world.stop()
            shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", choices=["embedded", "pg+redis", "both"], default="both")
    parser.add_argument("--commands", type=int, default=300, help="read commands per daphne")
    parser.add_argument("--client", choices=["pyz", "checkout"], default="pyz",
                        help="run the probe from a .pyz built for the run (as users do), or the checkout")
    args = parser.parse_args()
    stop_cleanly_on_sigterm()
    probe = ([PY, "-I", "-S", client_pyz("ai1net-probe")] if args.client == "pyz"
             else [PY, "-m", "clients.probe"])
    print(f"the probe from {'a .pyz built for the run, as users run it' if args.client == 'pyz' else 'the checkout'}")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "REDIS_URL", "AI1NET_REDIS"))}
    base.update({"DJANGO_SETTINGS_MODULE": "bench.settings_bench", "AI1NET_DEBUG": "1", "PYTHONPATH": str(ROOT),
                 "PYTHONUNBUFFERED": "1"})
    configs = ["embedded", "pg+redis"] if args.config == "both" else [args.config]
    for config in configs:
        run_config(config, base, args.commands, probe)


if __name__ == "__main__":
    main()
