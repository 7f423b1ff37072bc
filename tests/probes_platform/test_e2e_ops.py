"""Every operation through the gateway to a real probe over a real daphne, and the confinement codes
the probe returns arriving unchanged as `failed` + `error.code` (the probe's own tests cover the
confinement rules exhaustively; here: that the platform passes them through and never runs a refused op)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from devices import services as device_services
from tests.e2e_support import Daphne, wait_until
from tests.probes_platform.test_e2e_probe import agent, command, owner, start_probe

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def world(tmp_path, client, user):
    root = tmp_path / "proj"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "mod.py").write_text("import os\n\n\nclass Box:\n    def open(self):\n        return os.sep\n")
    (root / "README.md").write_text("# proj\nTODO: write docs\n")
    (root / ".gitignore").write_text("build/\n")
    (root / "build").mkdir()
    (root / "build" / "out.txt").write_text("TODO ignored\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret\n")
    (tmp_path / "proj2").mkdir()
    (tmp_path / "proj2" / "x.txt").write_text("sibling\n")
    os.symlink(outside / "secret.txt", root / "link-file")
    os.symlink(outside, root / "link-dir")
    os.symlink(root / "hop2", root / "hop1")
    os.symlink(root / "hop3", root / "hop2")
    os.symlink(outside / "secret.txt", root / "hop3")
    os.symlink(root / "nowhere", root / "broken")
    os.symlink(root / "loop-b", root / "loop-a")
    os.symlink(root / "loop-a", root / "loop-b")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-C", str(root)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "pkg", "README.md", ".gitignore"], check=True)
    subprocess.run([*git, "commit", "-qm", "first commit"], check=True)
    (root / "README.md").write_text("# proj\nTODO: write docs\nmore\n")

    server = Daphne(tmp_path)
    device, token = device_services.device_create(owner=user, name="ops", kind="probe", ephemeral=True)
    probe = start_probe(server, device, token, root, tmp_path, "--write", "--exec")
    http, person = agent(server, user), owner(server, client, user)
    try:
        yield {"root": root.resolve(), "outside": outside, "tmp": tmp_path, "http": http, "person": person}
    finally:
        http.close()
        person.close()
        probe.stop()
        server.stop()


def run(world, op, args, wait=20):
    response = command(world["http"], "ops", op, args, wait=wait)
    assert response.status_code in (200, 202), response.text
    return response.json()


def approve(world, body, wait=20):
    assert body["state"] == "awaiting_approval", body
    response = world["person"].post(f"/api/probes/commands/{body['id']}/approve", json={"wait": wait})
    assert response.status_code == 200, response.text
    return response.json()


def test_every_read_operation(world):
    root: Path = world["root"]
    assert run(world, "ping", {})["result"]["pong"] is True
    info = run(world, "info", {})["result"]
    assert info["roots"] == [str(root)] and info["modes"] == {"write": True, "exec": True}

    read = run(world, "read", {"path": str(root / "pkg" / "mod.py"), "offset": 4, "limit": 2})
    assert read["result"]["lines"] == [[4, "class Box:"], [5, "    def open(self):"]]
    assert read["result"]["next_offset"] == 6

    tree = run(world, "read_tree", {"path": str(root), "depth": 2})["result"]
    paths = {entry["path"]: entry for entry in tree["entries"]}
    assert "pkg/mod.py" in paths and "build" not in paths  # .gitignore honoured
    assert paths["link-dir"]["type"] == "symlink" and paths["broken"].get("broken") is True
    assert paths["loop-a"]["type"] == "symlink"

    hits = run(world, "grep", {"pattern": "TODO", "path": str(root)})["result"]["matches"]
    assert [(Path(h["path"]).name, h["line"]) for h in hits] == [("README.md", 2)]

    # A link that leaves the roots is listed as {outside: true} and nothing more; addressed, it is refused.
    assert paths["link-file"] == {"path": "link-file", "type": "symlink", "outside": True}
    stat = run(world, "stat", {"path": str(root / "link-file")})
    assert stat["state"] == "failed" and stat["error"]["code"] == "outside_allowed_roots", stat

    diff = run(world, "git_diff", {"path": str(root)})["result"]["diff"]
    assert "+more" in diff
    log = run(world, "git_log", {"path": str(root)})["result"]["commits"]
    assert [c["subject"] for c in log] == ["first commit"]

    outline = run(world, "ast_parse", {"path": str(root / "pkg" / "mod.py")})["result"]
    assert [c["name"] for c in outline["classes"]] == ["Box"]
    assert [(f["qualname"], f["line"]) for f in outline["functions"]] == [("Box.open", 5)]
    assert [i["module"] for i in outline["imports"]] == ["os"]


@pytest.mark.parametrize("path", [
    "{root}/../outside/secret.txt",
    "{root}/pkg/../../outside/secret.txt",
    "{root}/pkg/../../../../../../../../etc/passwd",
    "{tmp}/proj2/x.txt",
    "{root}/link-file",
    "{root}/link-dir/secret.txt",
    "{root}/hop1",
])
def test_escapes_end_failed_outside_allowed_roots(world, path):
    body = run(world, "read", {"path": path.format(root=world["root"], tmp=world["tmp"])})
    assert body["state"] == "failed" and body["error"]["code"] == "outside_allowed_roots", body


def test_a_nul_byte_is_refused_before_it_reaches_the_probe(world):
    response = command(world["http"], "ops", "read", {"path": f"{world['root']}/README.md\x00.txt"})
    assert response.status_code == 400 and response.json()["detail"].startswith("args.path:")


def test_writes_and_commands_after_approval(world):
    root: Path = world["root"]
    # A write through a parent-directory link that leaves the roots is refused even when approved.
    escaped = approve(world, run(world, "write", {"path": str(root / "link-dir" / "new.txt"), "content": "x"}))
    assert escaped["state"] == "failed" and escaped["error"]["code"] == "outside_allowed_roots"
    assert not (world["outside"] / "new.txt").exists()

    patch = "--- a/README.md\n+++ b/README.md\n@@ -1,3 +1,3 @@\n # proj\n-TODO: write docs\n+Docs written.\n more\n"
    written = approve(world, run(world, "write", {"path": str(root / "README.md"), "diff": patch}))
    assert written["state"] == "done", written
    assert (root / "README.md").read_text() == "# proj\nDocs written.\nmore\n"

    ran = approve(world, run(world, "run", {"argv": ["git", "status", "--short"], "cwd": str(root), "timeout": 20}))
    assert ran["result"]["exit_code"] == 0 and "README.md" in ran["result"]["stdout"]

    started = approve(world, run(world, "run_background", {"argv": ["sh", "-c", "echo started; sleep 30"],
                                                           "cwd": str(root)}))
    handle = started["result"]["handle"]
    output = wait_until(lambda: "started" in (run(world, "run_output", {"handle": handle})["result"]["output"]), 10)
    assert output
    stopped = approve(world, run(world, "stop", {"handle": handle}))
    assert stopped["state"] == "done" and stopped["result"]["running"] is False
