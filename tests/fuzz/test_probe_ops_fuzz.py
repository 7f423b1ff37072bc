"""Fuzzing the probe's command frames: ``Probe.call("probe.<op>", params)`` (what the tunnel's request handler
runs for each platform request) with hostile arguments for every op.

Each call returns a result that travels as one JSON text frame, or raises ``ProbeError`` with a code and a
detail (the JSON-RPC error the platform shows); no other exception escapes, and nothing outside the allowed
root is opened, listed, written or removed (Python's audit events, recorded while the op runs).
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clients import protocol
from clients.probe.ops import HANDLERS, OPS, Probe, ProbeError
from tests.fuzz import strategies as hs
from tests.fuzz.conftest import SHARED_FIXTURE

pytestmark = [pytest.mark.slow]

# Audit events that touch the file system by path (https://docs.python.org/3/library/audit_events.html).
PATH_EVENTS = {"open": 0, "os.listdir": 0, "os.scandir": 0, "os.remove": 0, "os.rename": 0, "os.rmdir": 0,
               "os.mkdir": 0, "os.chmod": 0, "os.chown": 0, "os.truncate": 0, "os.utime": 0, "os.symlink": 1,
               "os.link": 1, "shutil.rmtree": 0, "shutil.copyfile": 1, "shutil.move": 1}


class Touched:
    """Paths the current thread's ops touch while ``watching`` (one audit hook for the whole run: they
    cannot be removed)."""

    watching: Path | None = None
    paths: list[str] = []
    installed = False
    lock = threading.Lock()

    @classmethod
    def hook(cls, event: str, args: tuple) -> None:
        if cls.watching is None or event not in PATH_EVENTS:
            return
        for arg in args[:PATH_EVENTS[event] + 1] if event in ("os.rename", "shutil.copyfile", "shutil.move") \
                else args[PATH_EVENTS[event]:PATH_EVENTS[event] + 1]:
            if isinstance(arg, str | bytes | os.PathLike):
                cls.paths.append(os.fsdecode(arg))

    @classmethod
    def install(cls) -> None:
        with cls.lock:
            if not cls.installed:
                sys.addaudithook(cls.hook)
                cls.installed = True


@pytest.fixture
def world(tmp_path: Path) -> dict[str, Path]:
    """tmp/proj (the root, a git repository), tmp/proj2 (a sibling sharing the prefix), tmp/outside, and
    links inside the root that lead out."""
    root, sibling, outside = tmp_path / "proj", tmp_path / "proj2", tmp_path / "outside"
    (root / "src").mkdir(parents=True)
    (root / "src" / "mod.py").write_text("import os\n\n\ndef f():\n    return 1\n")
    (root / "README.md").write_text("hello\nworld\n")
    (root / "bin.dat").write_bytes(b"\x00\x01\x02")
    sibling.mkdir()
    (sibling / "secret.txt").write_text("sibling secret\n")
    outside.mkdir()
    (outside / "secret.txt").write_text("outside secret\n")
    (root / "out").symlink_to(outside)
    (root / "out.txt").symlink_to(outside / "secret.txt")
    (root / "loop").symlink_to(root / "loop")
    return {"tmp": tmp_path, "root": root, "sibling": sibling, "outside": outside}


@pytest.fixture
def probe(world):
    Touched.install()
    running = Probe([str(world["root"])], write=True, exec_=True)
    yield running
    running.close()


def paths_for(world: dict[str, Path]) -> st.SearchStrategy[str]:
    root, outside = world["root"], world["outside"]
    return st.sampled_from([
        ".", "src", "src/mod.py", "README.md", "bin.dat", "new.txt", "src/new/deep.txt", "out", "out/secret.txt",
        "out.txt", "loop", "loop/x", "..", "../outside/secret.txt", "../proj2/secret.txt", "src/../../outside",
        str(outside / "secret.txt"), str(world["sibling"] / "secret.txt"), str(root) + "2/secret.txt", "/",
        "/etc/passwd", "~/.ssh/id_rsa", "$HOME", "src/\x00x", "", " ", "\\..\\outside", "a" * 5000,
        "//" + str(outside), str(root / "src" / ".." / ".." / "outside"), "-rf", "--help", ".git/config",
    ]) | hs.nasty_text


def args_for(op: str, world: dict[str, Path]) -> st.SearchStrategy[dict[str, Any]]:
    """Every argument the op takes, each maybe hostile, maybe missing, and sometimes one it does not take."""
    path = paths_for(world)
    # Commands that end at once whatever their arguments (the fuzzer must not run what it makes up).
    argv = st.builds(lambda head, tail: [head, *tail], st.sampled_from(["true", "echo", "printf"]),
                     st.lists(path | hs.nasty_text, max_size=3)) | hs.json_values
    value = {"path": path, "cwd": path, "pattern": hs.nasty_text | st.sampled_from(["(", "[", "a{99999}", "(a+)+$",
                                                                                    "\\", "*"]),
             "glob": path | st.sampled_from(["**", "!*", "[", "*.py"]), "argv": argv, "rev": hs.nasty_text
             | st.sampled_from(["HEAD", "--output=/tmp/x", "HEAD~999", "-p", "..", "@{-1}"]),
             "content": hs.nasty_text, "diff": hs.nasty_text | st.just("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n"),
             "engine": st.sampled_from(["auto", "rg", "python", "sed"]) | hs.nasty_text,
             "handle": hs.nasty_text}
    wrong = hs.scalars | hs.extreme_ints | hs.extreme_floats
    names = HANDLERS[op][1]
    fields = {name: value.get(name, wrong) | wrong for name in names}
    extra = st.dictionaries(hs.nasty_text, wrong, max_size=1)
    return st.builds(lambda chosen, more: {**chosen, **more},
                     st.fixed_dictionaries({}, optional=fields), extra | st.just({}) | st.just({}))


def _call(probe: Probe, op: str, args: Any, root: Path) -> tuple[Any, list[str]]:
    Touched.paths = []
    Touched.watching = root
    try:
        try:
            return probe.call(op, args), Touched.paths
        except ProbeError as exc:
            return exc, Touched.paths
    finally:
        Touched.watching = None


def outside_touched(paths: list[str], world: dict[str, Path]) -> list[str]:
    """Paths in the test's world that are not in the root (what the system itself opens is not the op's)."""
    tmp, root = os.path.realpath(world["tmp"]), os.path.realpath(world["root"])
    touched = []
    for path in paths:
        full = os.path.abspath(os.path.join(root, path))
        if (full + "/").startswith(tmp + "/") and not (full + "/").startswith(root + "/"):
            touched.append(path)
    return touched


@pytest.mark.parametrize("op", OPS)
@SHARED_FIXTURE
@given(data=st.data())
def test_every_op_refuses_hostile_args_by_name_and_stays_in_its_root(probe, world, op, data):
    args = data.draw(args_for(op, world), label="args")
    answer, touched = _call(probe, "probe." + op, args, world["root"])
    if isinstance(answer, ProbeError):
        assert isinstance(answer.code, str) and answer.code, answer
        assert isinstance(answer.detail, str) and answer.detail.strip(), answer
    else:
        assert isinstance(answer, dict), answer
        # Travels as one text frame: JSON, and UTF-8 (a lone surrogate in a file name would not be).
        protocol.result("1", answer).encode("utf-8")
    assert not outside_touched(touched, world), (op, args, touched)
    assert (world["outside"] / "secret.txt").read_text() == "outside secret\n"


@SHARED_FIXTURE
@given(method=hs.nasty_text | st.sampled_from(["probe.", "probe.probe.read", "read", "probe.__init__",
                                                 "probe.HANDLERS", "probe.call"]),
       params=hs.json_values)
def test_unknown_ops_and_params_that_are_not_an_object(probe, world, method, params):
    answer, touched = _call(probe, method, params, world["root"])
    if not isinstance(answer, ProbeError):  # a real op, called with an object
        assert method.removeprefix("probe.") in OPS and isinstance(params, dict | None), (method, answer)
    assert not outside_touched(touched, world), (method, params, touched)


def test_the_audit_hook_sees_an_op_open_a_file(probe, world):
    """The recorder is live: a read of a file in the root is seen (else the check above could not fail)."""
    answer, touched = _call(probe, "probe.read", {"path": "README.md"}, world["root"])
    assert answer["lines"][0] == [1, "hello"]
    assert any(path.endswith("README.md") for path in touched), touched
    assert outside_touched([str(world["outside"] / "secret.txt")], world)
    assert json.dumps(answer)
