"""Fixtures for the probe's own tests: a tree with an allowed root, a sibling and an outside world."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from clients.probe.ops import Probe


@pytest.fixture
def world(tmp_path: Path) -> dict[str, Path]:
    """tmp/proj (the root), tmp/proj2 (a sibling with a shared prefix), tmp/outside (secrets)."""
    root = tmp_path / "proj"
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "src" / "pkg" / "mod.py").write_text("def f():\n    return 1\n")
    (root / "README.md").write_text("hello\nworld\n")
    sibling = tmp_path / "proj2"
    sibling.mkdir()
    (sibling / "secret.txt").write_text("sibling secret\n")
    outside = tmp_path / "outside"
    (outside / "deep").mkdir(parents=True)
    (outside / "secret.txt").write_text("outside secret\n")
    (outside / "deep" / "secret.txt").write_text("deep secret\n")
    return {"tmp": tmp_path, "root": root, "sibling": sibling, "outside": outside}


@pytest.fixture
def make_probe():
    probes = []

    def make(*roots: os.PathLike, write: bool = False, exec_: bool = False) -> Probe:
        probe = Probe([str(r) for r in roots], write=write, exec_=exec_)
        probes.append(probe)
        return probe

    yield make
    for probe in probes:
        probe.close()


@pytest.fixture
def probe(world, make_probe) -> Probe:
    return make_probe(world["root"], write=True, exec_=True)


@pytest.fixture
def readonly(world, make_probe) -> Probe:
    return make_probe(world["root"])
