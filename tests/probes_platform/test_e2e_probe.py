"""The gateway end to end: a real daphne, a real probe process, the agents' API over HTTP with an API
token. Reads run at once; writes and commands wait for approval, run once after it, never after a skip;
a read-only probe refuses them without asking; a probe that went away fails what it was sent."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import httpx
import pytest
from django.conf import settings

from ai1net.accounts.services import api_token_create
from devices import services as device_services
from devices.models import Device
from tests.e2e_support import Daphne, Process, relay_bytes_received, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def start_probe(server: Daphne, device: Device, token: str, root: Path, logs: Path, *flags: str) -> Process:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "DATABASE_URL", "REDIS_URL"))}
    env.update({"PYTHONUNBUFFERED": "1", "AI1NET_PROBE_TOKEN": token, "AI1NET_PROBE_DEVICE_ID": str(device.pk)})
    # Online through this process's connection: a connection that was cut may not have closed on the server yet.
    connections_before = Device.objects.get(pk=device.pk).connection_count
    process = Process([sys.executable, "-m", "clients.probe", "run", server.url, "--allow", str(root), *flags],
                      logs / f"probe-{device.name}.log", env=env)
    wait_until(lambda: (now := Device.objects.get(pk=device.pk)).is_online and now.connection_count > connections_before,
               20, message=f"probe online ({process.log_path})")
    return process


@pytest.fixture
def project(tmp_path) -> Path:
    root = tmp_path / "proj"
    root.mkdir()
    (root / "hello.py").write_text("def hello():\n    return 'hi'\n")
    (tmp_path / "proj2").mkdir()
    (tmp_path / "proj2" / "secret.txt").write_text("sibling\n")
    return root


@pytest.fixture
def server(tmp_path):
    daphne = Daphne(tmp_path)
    yield daphne
    daphne.stop()


def agent(server: Daphne, user) -> httpx.Client:
    raw = api_token_create(user=user, name="agent")[1]
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {raw}"}, timeout=70)


def owner(server: Daphne, client, user) -> httpx.Client:
    """The person, with a browser session (CSRF token in cookie and header): approvals come from here."""
    client.force_login(user)
    csrf = "c" * 32
    return httpx.Client(base_url=server.url, timeout=70, headers={"X-CSRFToken": csrf},
                        cookies={"sessionid": client.cookies["sessionid"].value, "csrftoken": csrf})


def command(http: httpx.Client, probe: str, op: str, args: dict, wait: float = 20) -> httpx.Response:
    return http.post(f"/api/probes/{probe}/commands", json={"op": op, "args": args, "wait": wait})


def test_reads_run_at_once_and_writes_are_refused_on_a_read_only_probe(server, user, project, tmp_path):
    device, token = device_services.device_create(owner=user, name="ro", kind="probe", ephemeral=True)
    probe = start_probe(server, device, token, project, tmp_path)
    http = agent(server, user)
    try:
        listed = http.get("/api/probes/").json()
        assert [(p["name"], p["online"], p["modes"]) for p in listed] == [("ro", True, [])]
        assert listed[0]["roots"] == [str(project.resolve())]

        read = command(http, "ro", "read", {"path": str(project / "hello.py"), "offset": 2, "limit": 1})
        assert read.status_code == 200, read.text
        assert read.json()["state"] == "done"
        assert read.json()["result"]["lines"] == [[2, "    return 'hi'"]]

        sibling = command(http, "ro", "read", {"path": str(project.parent / "proj2" / "secret.txt")})
        assert sibling.json()["state"] == "failed"
        assert sibling.json()["error"]["code"] == "outside_allowed_roots"

        write = command(http, "ro", "write", {"path": str(project / "new.txt"), "content": "x\n"})
        assert write.status_code == 200
        assert write.json()["state"] == "failed" and write.json()["error"]["code"] == "not_permitted"
        run = command(http, "ro", "run", {"argv": ["touch", str(project / "ran")]})
        assert run.json()["error"]["code"] == "not_permitted"
        assert http.get("/api/probes/approvals").json() == []
        assert not (project / "new.txt").exists() and not (project / "ran").exists()
    finally:
        http.close()
        probe.stop()


def test_writes_and_commands_wait_for_approval_and_run_once(server, client, user, project, tmp_path):
    device, token = device_services.device_create(owner=user, name="rw", kind="probe", ephemeral=True)
    probe = start_probe(server, device, token, project, tmp_path, "--write", "--exec")
    http = agent(server, user)
    person = owner(server, client, user)
    target = project / "hello.py"
    try:
        assert http.get("/api/probes/rw").json()["modes"] == ["exec", "write"]
        write = command(http, "rw", "write", {"path": str(target), "content": "def hello():\n    return 'hey'\n"})
        assert write.status_code == 202, write.text
        write_id = write.json()["id"]
        preview = wait_until(lambda: http.get(f"/api/probes/commands/{write_id}").json().get("preview"), 20)
        assert "-    return 'hi'" in preview and "+    return 'hey'" in preview
        assert "hi" in target.read_text()  # nothing written before the approval

        # The agent cannot approve its own request.
        self_approved = http.post(f"/api/probes/commands/{write_id}/approve", json={})
        assert self_approved.status_code == 403 and self_approved.json()["error"] == "approval_needs_a_person"
        approved = person.post(f"/api/probes/commands/{write_id}/approve", json={"wait": 20})
        assert approved.status_code == 200, approved.text
        assert approved.json()["state"] == "done"
        assert target.read_text() == "def hello():\n    return 'hey'\n"
        assert person.post(f"/api/probes/commands/{write_id}/approve", json={}).status_code == 409
        # The agent long-polls its command to the end.
        assert http.get(f"/api/probes/commands/{write_id}?wait=5").json()["state"] == "done"

        skipped = command(http, "rw", "run", {"argv": ["touch", str(project / "skipped")]})
        assert skipped.status_code == 202
        assert person.post(f"/api/probes/commands/{skipped.json()['id']}/reject").json()["state"] == "rejected"

        run = command(http, "rw", "run", {"argv": ["sh", "-c", "echo ran >> log.txt; cat log.txt"],
                                          "cwd": str(project)})
        run_id = run.json()["id"]
        done = person.post(f"/api/probes/commands/{run_id}/approve", json={"wait": 20}).json()
        assert done["state"] == "done", done
        assert done["result"]["exit_code"] == 0 and done["result"]["stdout"] == "ran\n"
        assert person.post(f"/api/probes/commands/{run_id}/approve", json={}).status_code == 409
        assert (project / "log.txt").read_text() == "ran\n"  # ran exactly once
        assert not (project / "skipped").exists()
    finally:
        http.close()
        person.close()
        probe.stop()


def test_a_probe_that_went_away_fails_commands_with_device_offline(server, client, user, project, tmp_path):
    device, token = device_services.device_create(owner=user, name="gone", kind="probe", ephemeral=True)
    probe = start_probe(server, device, token, project, tmp_path, "--exec")
    http = agent(server, user)
    person = owner(server, client, user)
    try:
        pending = command(http, "gone", "run", {"argv": ["touch", str(project / "late")]}).json()
        probe.stop()
        wait_until(lambda: not Device.objects.get(pk=device.pk).is_online, 20, message="probe offline")
        late = person.post(f"/api/probes/commands/{pending['id']}/approve", json={"wait": 20}).json()
        assert late["state"] == "failed" and late["error"]["code"] in ("device_offline", "not_found"), late
        read = command(http, str(device.pk), "ping", {})
        # An ephemeral probe's token died with its connection: it is gone from the router, or offline.
        assert read.status_code == 404 or read.json()["error"]["code"] == "device_offline"
        assert not (project / "late").exists()
    finally:
        http.close()
        person.close()
        probe.stop()


@pytest.mark.redis
@pytest.mark.skipif(not settings.REDIS_URL, reason="needs REDIS_URL (the scaled-out configuration)")
def test_asked_and_approved_on_other_processes_than_the_probes(server, client, user, project, tmp_path):
    """The probe holds its tunnel on daphne A; the agent asks through B and the person approves through C.
    The calls and their answers cross from B and C to A's stream relay (devices.web.relay), not Redis."""
    device, token = device_services.device_create(owner=user, name="far", kind="probe", ephemeral=True)
    probe = start_probe(server, device, token, project, tmp_path, "--write")
    b, c = Daphne(tmp_path, name="daphne-b"), Daphne(tmp_path, name="daphne-c")
    http = agent(b, user)
    person = owner(c, client, user)
    text = "".join(f"line {n}: {'x' * 40}\n" for n in range(800))  # about 40 KB
    (project / "long.txt").write_text(text)
    try:
        relay = Device.objects.get(pk=device.pk).relay  # A's, written by the probe's hello
        before = relay_bytes_received(relay)
        read = command(http, "far", "read", {"path": str(project / "long.txt")})
        assert read.json()["state"] == "done", read.text
        assert read.json()["result"]["lines"][799] == [800, f"line 799: {'x' * 40}"]
        assert relay_bytes_received(relay) - before > 20_000  # the answer came to B over A's relay
        asked = command(http, "far", "write", {"path": str(project / "far.txt"), "content": "far\n"}, wait=0)
        assert asked.status_code == 202
        done = person.post(f"/api/probes/commands/{asked.json()['id']}/approve", json={"wait": 20}).json()
        assert done["state"] == "done", done
        assert (project / "far.txt").read_text() == "far\n"
        assert http.get(f"/api/probes/commands/{asked.json()['id']}").json()["state"] == "done"
    finally:
        http.close()
        person.close()
        probe.stop()
        b.stop()
        c.stop()


def test_a_command_cut_by_a_dropped_connection_is_not_run_again_after_the_reconnect(server, client, user, project,
                                                                                     tmp_path):
    device, token = device_services.device_create(owner=user, name="flaky", kind="probe")  # survives reconnects
    probe = start_probe(server, device, token, project, tmp_path, "--exec")
    http = agent(server, user)
    person = owner(server, client, user)
    counter = project / "count.txt"
    try:
        asked = command(http, "flaky", "run", {"argv": ["sh", "-c", "echo run >> count.txt; sleep 30"],
                                               "cwd": str(project)}).json()
        sent = person.post(f"/api/probes/commands/{asked['id']}/approve", json={"wait": 0}).json()
        assert sent["state"] in ("approved", "sent")
        wait_until(lambda: counter.exists() and counter.read_text() == "run\n", 20, message="the command started")
        probe.kill()  # the connection drops mid-command
        ended = http.get(f"/api/probes/commands/{asked['id']}?wait=30").json()
        assert ended["state"] == "failed" and ended["error"]["code"] == "device_offline", ended
        probe = start_probe(server, device, token, project, tmp_path, "--exec")
        assert command(http, "flaky", "ping", {}).json()["state"] == "done"  # the new connection serves
        assert counter.read_text() == "run\n"  # and the cut command was not sent again
        again = person.post(f"/api/probes/commands/{asked['id']}/approve", json={})
        assert again.status_code == 409
    finally:
        http.close()
        person.close()
        probe.stop()


def test_a_one_run_probes_token_dies_after_it_disconnects(tmp_path, user, project):
    """The probe keeps nothing: once its connection is gone (past the grace), the token opens nothing."""
    server = Daphne(tmp_path, name="grace", AI1NET_EPHEMERAL_GRACE_SEC="1", AI1NET_HEARTBEAT_SEC="1")
    device, token = device_services.device_create(owner=user, name="once", kind="probe", ephemeral=True)
    probe = start_probe(server, device, token, project, tmp_path)
    try:
        probe.kill()  # as a crash or a closed laptop would: no goodbye
        wait_until(lambda: Device.objects.get(pk=device.pk).status == Device.Status.REVOKED, 20,
                   message="the one-run token revoked after the grace")
        again = Process([sys.executable, "-m", "clients.probe", "run", server.url, "--allow", str(project)],
                        tmp_path / "probe-again.log",
                        env={**{k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "DATABASE_URL"))},
                             "AI1NET_PROBE_TOKEN": token, "AI1NET_PROBE_DEVICE_ID": str(device.pk)})
        assert again.popen.wait(30) == 3, again.log()  # refused for good (4403), not retried
        assert not Device.objects.get(pk=device.pk).is_online
    finally:
        probe.stop()
        server.stop()
