"""grep: ripgrep and the pure-Python engine give the same answer on the same tree."""

from __future__ import annotations

import os
import shutil
import time

import pytest

from clients.probe.ops import ProbeError

needs_rg = pytest.mark.ripgrep  # tests/conftest.py stops the run when rg is missing


@pytest.fixture
def tree(world):
    root = world["root"]
    files = {
        "a.py": "import os\nTODO first\nnothing\n",
        "b.md": "todo lower\nTODO upper\n",
        "src/c.py": "x = 1  # TODO\r\ny = 2\r\n",
        "src/d.txt": "no newline at the end TODO",
        "src/deep/e.py": "déjà vu TODO ünïcode\n",
        "src/deep/f.log": "TODO in an ignored log\n",
        "build/out.py": "TODO in an ignored dir\n",
        "keep.log": "TODO kept by negation\n",
        ".hidden": "TODO hidden\n",
        ".cache/x.py": "TODO hidden dir\n",
        "docs/sub/g.md": "TODO g\n",
        "docs/sub/notes.tmp": "TODO tmp\n",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(text.encode())
    (root / ".gitignore").write_text("*.log\n!keep.log\nbuild/\ndocs/**/*.tmp\n")
    (root / "src" / ".gitignore").write_text("/d.txt\n")
    (root / "bin.dat").write_bytes(b"TODO\0binary\n")
    (root / "huge.txt").write_bytes(b"TODO huge\n" + b"z" * (11 * 1024 * 1024))
    os.symlink(root / "a.py", root / "link.py")
    return root


def both(probe, **params):
    rg = probe.call("grep", {"engine": "rg", **params})
    py = probe.call("grep", {"engine": "python", **params})
    assert rg.pop("engine") == "rg" and py.pop("engine") == "python"
    assert rg == py, (rg, py)
    return py


@needs_rg
def test_same_hits_from_both_engines(readonly, tree):
    out = both(readonly, pattern="TODO")
    hits = [(os.path.relpath(m["path"], tree), m["line"], m["text"]) for m in out["matches"]]
    assert hits == [
        ("a.py", 2, "TODO first"),
        ("b.md", 2, "TODO upper"),
        ("docs/sub/g.md", 1, "TODO g"),
        ("keep.log", 1, "TODO kept by negation"),
        ("src/c.py", 1, "x = 1  # TODO"),
        ("src/deep/e.py", 1, "déjà vu TODO ünïcode"),
    ]
    assert out["files"] == 6 and out["truncated"] is False


@needs_rg
@pytest.mark.parametrize(
    "params",
    [
        {"pattern": "todo", "ignore_case": True},
        {"pattern": "todo", "case_sensitive": False},
        {"pattern": "TODO", "glob": "*.py"},
        {"pattern": "TODO", "glob": "!*.md"},
        {"pattern": "TODO", "glob": "src/**"},
        {"pattern": r"^\w+ = \d", "path": "src"},
        {"pattern": "TODO$"},
        {"pattern": "TODO", "max_results": 3},
        {"pattern": "TODO", "path": "src/c.py"},
        {"pattern": "[ée]j", "path": "src/deep"},
        {"pattern": "nothing matches this"},
    ],
)
def test_engines_agree(readonly, tree, params):
    both(readonly, **params)


@needs_rg
def test_caps_cut_the_same_first_hits(readonly, tree):
    out = both(readonly, pattern="TODO", max_results=2)
    assert len(out["matches"]) == 2 and out["truncated"] is True


def test_bad_pattern_is_an_invalid_argument(readonly, tree):
    engines = ["python", "rg"] if shutil.which("rg") else ["python"]
    for engine in engines:
        with pytest.raises(ProbeError) as info:
            readonly.call("grep", {"pattern": "(unclosed", "engine": engine})
        assert info.value.code == "invalid_argument", engine


def test_auto_uses_ripgrep_when_present(readonly, tree):
    assert readonly.call("grep", {"pattern": "TODO"})["engine"] == ("rg" if shutil.which("rg") else "python")


def test_long_hit_lines_are_cut(readonly, world):
    (world["root"] / "wide.txt").write_text("TODO " + "w" * 2000 + "\n")
    out = readonly.call("grep", {"pattern": "TODO", "path": "wide.txt", "engine": "python"})
    assert out["matches"][0]["text"].endswith(" [line cut]") and len(out["matches"][0]["text"]) == 511


def make_files(root, count: int) -> None:
    for i in range(count):
        folder = root / f"d{i // 200:03d}"
        if i % 200 == 0:
            folder.mkdir(parents=True)
        body = "".join(f"def function_{i}_{n}(value):\n    return value * {n}\n" for n in range(10))
        if i % 1000 == 7:
            body += f"# NEEDLE {i}\n"
        (folder / f"f{i:05d}.py").write_text(body)


@pytest.mark.slow
def test_grep_over_20000_files(readonly, world):
    make_files(world["root"] / "many", 20_000)
    timings = {}
    engines = ["python", "rg"] if shutil.which("rg") else ["python"]
    results = {}
    for engine in engines:
        started = time.monotonic()
        results[engine] = readonly.call("grep", {"pattern": "NEEDLE", "path": "many", "engine": engine})
        timings[engine] = time.monotonic() - started
    for out in results.values():
        assert [m["text"] for m in out["matches"]] == [f"# NEEDLE {i}" for i in range(7, 20_000, 1000)]
    assert timings["python"] < 60, timings
    print("grep over 20,000 files:", {k: f"{v:.2f}s" for k, v in timings.items()})


@needs_rg
def test_a_directory_swapped_just_before_rg_starts_shows_no_hits(readonly, world, monkeypatch):
    from clients.probe.ops import search

    root = world["root"]
    (root / "data").mkdir()
    (root / "data" / "in.txt").write_text("needle inside\n")
    (world["outside"] / "out.txt").write_text("needle outside\n")
    real_popen = search.subprocess.Popen

    def swap_then_start(*args, **kwargs):
        os.rename(root / "data", world["tmp"] / "data-moved")
        os.symlink(world["outside"], root / "data")
        return real_popen(*args, **kwargs)

    monkeypatch.setattr(search.subprocess, "Popen", swap_then_start)
    with pytest.raises(ProbeError) as info:
        readonly.call("grep", {"pattern": "needle", "path": "data", "engine": "rg"})
    assert info.value.code == "outside_allowed_roots" and "needle" not in info.value.detail
