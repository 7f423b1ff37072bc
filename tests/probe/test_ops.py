"""Each operation against the real filesystem, git and processes: shapes, pages, caps, modes."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import stat
import subprocess
import time

import pytest

from clients.probe import ops
from clients.probe.ops import ProbeError
from tests.e2e_support import wait_until


def error(probe, op, **params) -> ProbeError:
    with pytest.raises(ProbeError) as info:
        probe.call(op, params)
    return info.value


# --- read ----------------------------------------------------------------------------------------
def test_read_pages_by_lines(readonly, world):
    (world["root"] / "n.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    page = readonly.call("read", {"path": "n.txt", "offset": 3, "limit": 4})
    assert page["lines"] == [[3, "line 3"], [4, "line 4"], [5, "line 5"], [6, "line 6"]]
    assert page["total_lines"] == 10 and page["truncated"] is True and page["next_offset"] == 7
    last = readonly.call("read", {"path": "n.txt", "offset": 7})
    assert last["lines"][-1] == [10, "line 10"] and last["next_offset"] is None and last["truncated"] is False
    beyond = readonly.call("read", {"path": "n.txt", "offset": 50})
    assert beyond["lines"] == [] and beyond["total_lines"] == 10 and beyond["next_offset"] is None


def test_read_keeps_line_endings_out_and_handles_a_missing_final_newline(readonly, world):
    (world["root"] / "crlf.txt").write_bytes(b"a\r\nb\r\nc")
    page = readonly.call("read", {"path": "crlf.txt"})
    assert page["lines"] == [[1, "a"], [2, "b"], [3, "c"]] and page["total_lines"] == 3
    (world["root"] / "empty.txt").write_bytes(b"")
    assert readonly.call("read", {"path": "empty.txt"})["lines"] == []


def test_read_byte_cap_splits_pages_at_line_boundaries(readonly, world):
    (world["root"] / "w.txt").write_text("".join(f"{i:04d}" + "x" * 95 + "\n" for i in range(100)))  # 100 B/line
    seen, offset, pages = [], 1, 0
    while offset:
        page = readonly.call("read", {"path": "w.txt", "offset": offset, "max_bytes": 1000})
        assert len(page["lines"]) == 10
        seen += page["lines"]
        offset, pages = page["next_offset"], pages + 1
    assert pages == 10 and [n for n, _ in seen] == list(range(1, 101))


def test_read_cuts_an_over_long_line_and_says_so(readonly, world):
    (world["root"] / "long.txt").write_text("y" * 5000 + "\nshort\n")
    page = readonly.call("read", {"path": "long.txt", "max_bytes": 100})
    assert page["lines"] == [[1, "y" * 100 + " [line cut]"]] and page["next_offset"] == 2
    assert readonly.call("read", {"path": "long.txt", "offset": 2})["lines"] == [[2, "short"]]


def test_binary_files_are_refused_unless_asked_as_base64(readonly, world):
    blob = bytes(range(256)) * 10
    (world["root"] / "b.bin").write_bytes(blob)
    assert error(readonly, "read", path="b.bin").code == "is_binary"
    first = readonly.call("read", {"path": "b.bin", "base64": True, "limit": 1000})
    assert base64.b64decode(first["data"]) == blob[:1000] and first["next_offset"] == 1000
    rest = readonly.call("read", {"path": "b.bin", "base64": True, "offset": 1000})
    assert base64.b64decode(rest["data"]) == blob[1000:] and rest["truncated"] is False


def test_read_refuses_directories_and_missing_files(readonly):
    assert error(readonly, "read", path="src").code == "is_a_directory"
    assert error(readonly, "read", path="missing.txt").code == "not_found"


def test_unknown_and_mistyped_arguments_are_refused(readonly):
    assert error(readonly, "read", path="README.md", lines=3).code == "invalid_argument"
    assert error(readonly, "read", path="README.md", offset="3").code == "invalid_argument"
    assert error(readonly, "read", path="README.md", offset=True).code == "invalid_argument"
    assert error(readonly, "read", path="README.md", limit=0).code == "invalid_argument"
    assert error(readonly, "nonsense").code == "unsupported"


@pytest.mark.slow
def test_a_50_mb_file_is_read_in_pages(readonly, world):
    line = "0123456789" * 9 + "abcdefghi\n"  # 100 bytes
    lines = 500_000
    with open(world["root"] / "big.log", "w") as f:
        for _ in range(0, lines, 10_000):
            f.write(line * 10_000)
    assert (world["root"] / "big.log").stat().st_size == 50_000_000
    started = time.monotonic()
    offset, pages, count = 1, 0, 0
    while offset:
        page = readonly.call("read", {"path": "big.log", "offset": offset, "limit": 100_000, "max_bytes": 3 * 2**20})
        assert page["lines"][0][0] == offset and page["total_lines"] == lines
        count += len(page["lines"])
        offset, pages = page["next_offset"], pages + 1
    elapsed = time.monotonic() - started
    per_page = 3 * 2**20 // 100  # whole lines within the byte cap
    assert count == lines and pages == -(-lines // per_page) == 16
    assert elapsed < 60, elapsed


# --- read_tree -----------------------------------------------------------------------------------
def test_read_tree_depth_cap_and_order(readonly, world):
    tree = readonly.call("read_tree", {"path": ".", "depth": 1})
    assert [(e["path"], e["type"]) for e in tree["entries"]] == [("README.md", "file"), ("src", "dir")]
    deep = readonly.call("read_tree", {"path": ".", "depth": 3})
    assert [e["path"] for e in deep["entries"]] == ["README.md", "src", "src/pkg", "src/pkg/mod.py"]
    assert deep["entries"][0]["size"] == 12
    capped = readonly.call("read_tree", {"path": ".", "depth": 3, "max_entries": 2})
    assert capped["count"] == 2 and capped["truncated"] is True


def test_read_tree_honours_gitignore(readonly, world):
    root = world["root"]
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("")
    (root / ".gitignore").write_text("# comment\n*.log\n!keep.log\nbuild/\n/top.txt\ndocs/**/*.tmp\n**/cache\n")
    for rel in [
        "a.log",
        "keep.log",
        "build/out.js",
        "top.txt",
        "sub/top.txt",
        "docs/x/y/z.tmp",
        "docs/z.md",
        "sub/cache/c",
        "buildfile",
    ]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x\n")
    (root / "sub" / ".gitignore").write_text("*.md\n")
    (root / "sub" / "n.md").write_text("x\n")
    paths = {e["path"] for e in readonly.call("read_tree", {"path": ".", "depth": 10})["entries"]}
    assert {"keep.log", "buildfile", "sub/top.txt", "docs/z.md", ".gitignore", "sub/.gitignore"} <= paths
    assert not paths & {"a.log", "build", "build/out.js", "top.txt", "docs/x/y/z.tmp", "sub/cache", "sub/n.md"}
    assert not [p for p in paths if p == ".git" or p.startswith(".git/")]
    everything = {
        e["path"] for e in readonly.call("read_tree", {"path": ".", "depth": 10, "gitignore": False})["entries"]
    }
    assert {"a.log", "build/out.js", "sub/n.md"} <= everything


# --- stat ----------------------------------------------------------------------------------------
def test_stat_shapes(readonly, world):
    os.chmod(world["root"] / "README.md", 0o640)
    info = readonly.call("stat", {"path": "README.md"})
    assert info["type"] == "file" and info["size"] == 12 and info["mode"] == "0o640" and info["is_symlink"] is False
    assert readonly.call("stat", {"path": "src"})["type"] == "dir"
    os.symlink("README.md", world["root"] / "l")
    link = readonly.call("stat", {"path": "l"})
    assert link["type"] == "symlink" and link["target"] == "README.md" and link["outside"] is False
    assert error(readonly, "stat", path="missing").code == "not_found"


# --- git -----------------------------------------------------------------------------------------
def git(root, *args):
    env = {"PATH": os.environ["PATH"], "HOME": str(root), "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
    subprocess.run(
        ["git", "-c", "user.name=T", "-c", "user.email=t@example.com", *args],
        cwd=root,
        env=env,
        check=True,
        capture_output=True,
    )


@pytest.fixture
def repo(world):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    root = world["root"]
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "first")
    (root / "README.md").write_text("hello\nthere\n")
    git(root, "commit", "-q", "-am", "second: there")
    (root / "README.md").write_text("hello\neverybody\n")
    return root


def test_git_diff_and_log(readonly, repo):
    diff = readonly.call("git_diff", {"path": "."})
    assert "-there" in diff["diff"] and "+everybody" in diff["diff"] and diff["truncated"] is False
    against_first = readonly.call("git_diff", {"path": "README.md", "rev": "HEAD~1"})["diff"]
    assert "-world" in against_first and "+everybody" in against_first
    log = readonly.call("git_log", {"path": "."})
    assert [c["subject"] for c in log["commits"]] == ["second: there", "first"]
    assert log["commits"][0]["author"] == "T" and len(log["commits"][0]["hash"]) == 40
    one = readonly.call("git_log", {"path": "README.md", "limit": 1})
    assert len(one["commits"]) == 1 and one["truncated"] is True


@pytest.mark.parametrize("rev", ["--output=/tmp/x", "-p", "HEAD --output=x", "a b", "HEAD\n"])
def test_git_refuses_options_smuggled_as_revisions(readonly, repo, rev):
    assert error(readonly, "git_diff", path=".", rev=rev).code == "invalid_argument"
    assert error(readonly, "git_log", path=".", rev=rev).code == "invalid_argument"


def test_git_ignores_repository_config_that_would_run_commands(readonly, repo, world):
    marker = world["tmp"] / "ran"
    script = world["tmp"] / "evil.sh"
    script.write_text(f"#!/bin/sh\ntouch {marker}\n")
    script.chmod(0o755)
    with open(repo / ".git" / "config", "a") as f:
        f.write(f"[core]\n\tfsmonitor = {script}\n\tpager = {script}\n[diff]\n\texternal = {script}\n")
    assert "+everybody" in readonly.call("git_diff", {"path": "."})["diff"]
    readonly.call("git_log", {"path": "."})
    assert not marker.exists()


def test_git_outside_a_repository_fails_cleanly(readonly):
    assert error(readonly, "git_log", path=".").code == "git_failed"


# --- ast_parse -----------------------------------------------------------------------------------
def test_ast_parse_python(readonly, world):
    (world["root"] / "m.py").write_text(
        "import os, sys as system\nfrom .pkg import a, b\n\n\nclass A(Base, metaclass=M):\n"
        "    def m(self):\n        def inner():\n            pass\n\n    async def am(self):\n        pass\n\n\n"
        "async def top():\n    pass\n"
    )
    out = readonly.call("ast_parse", {"path": "m.py"})
    assert out["language"] == "python" and out["outline"] == "ast"
    assert out["imports"] == [
        {"module": "os", "names": [], "line": 1},
        {"module": "sys", "names": [], "line": 1},
        {"module": ".pkg", "names": ["a", "b"], "line": 2},
    ]
    assert out["classes"] == [{"name": "A", "qualname": "A", "line": 5, "end_line": 11, "bases": ["Base"]}]
    funcs = {f["qualname"]: f for f in out["functions"]}
    assert funcs["A.m"]["kind"] == "method" and funcs["A.m"]["line"] == 6
    assert funcs["A.m.<locals>.inner"]["kind"] == "function"
    assert funcs["A.am"]["async"] is True and funcs["top"] == {
        "name": "top",
        "qualname": "top",
        "line": 14,
        "end_line": 15,
        "kind": "function",
        "async": True,
    }


def test_ast_parse_other_languages_and_errors(readonly, world):
    (world["root"] / "a.ts").write_text("import x from 'lib';\nexport class C {}\nexport async function go() {}\n")
    out = readonly.call("ast_parse", {"path": "a.ts"})
    assert out["outline"] == "regex" and out["imports"][0]["module"] == "lib"
    assert out["classes"][0]["name"] == "C" and out["functions"][0] == {
        "name": "go",
        "qualname": "go",
        "line": 3,
        "end_line": None,
        "kind": "function",
        "async": True,
    }
    (world["root"] / "x.cob").write_text("IDENTIFICATION DIVISION.\n")
    assert error(readonly, "ast_parse", path="x.cob").code == "unsupported"
    (world["root"] / "bad.py").write_text("def (:\n")
    assert error(readonly, "ast_parse", path="bad.py").code == "parse_error"


# --- write ---------------------------------------------------------------------------------------
def test_write_creates_and_replaces_atomically(probe, world):
    root = world["root"]
    made = probe.call("write", {"path": "src/new.txt", "content": "one\n"})
    assert made == {
        "path": str(root / "src/new.txt"),
        "bytes": 4,
        "created": True,
        "sha256": hashlib.sha256(b"one\n").hexdigest(),
    }
    os.chmod(root / "src/new.txt", 0o751)
    inode = (root / "src/new.txt").stat().st_ino
    again = probe.call("write", {"path": "src/new.txt", "content": "two\n"})
    assert again["created"] is False and (root / "src/new.txt").read_text() == "two\n"
    after = (root / "src/new.txt").stat()
    assert stat.S_IMODE(after.st_mode) == 0o751 and after.st_ino != inode  # a new file renamed over
    assert sorted(os.listdir(root / "src")) == ["new.txt", "pkg"]  # no temp file left behind
    assert error(probe, "write", path="nodir/x.txt", content="x").code == "not_found"
    assert error(probe, "write", path="src", content="x").code == "is_a_directory"
    assert error(probe, "write", path="a.txt", content="x", diff="y").code == "invalid_argument"


def test_write_applies_a_unified_diff_or_changes_nothing(probe, world):
    target = world["root"] / "src/pkg/mod.py"
    diff = (
        "--- a/src/pkg/mod.py\n+++ b/src/pkg/mod.py\n@@ -1,2 +1,3 @@\n def f():\n-    return 1\n+    return 2\n+# end\n"
    )
    assert probe.call("write", {"path": "src/pkg/mod.py", "diff": diff})["created"] is False
    assert target.read_text() == "def f():\n    return 2\n# end\n"
    assert error(probe, "write", path="src/pkg/mod.py", diff=diff).code == "diff_does_not_apply"
    assert target.read_text() == "def f():\n    return 2\n# end\n"
    create = "--- /dev/null\n+++ b/n.txt\n@@ -0,0 +1,2 @@\n+a\n+b\n"
    assert probe.call("write", {"path": "n.txt", "diff": create})["created"] is True
    assert (world["root"] / "n.txt").read_text() == "a\nb\n"


def test_write_refuses_git_internals(probe, world):
    (world["root"] / ".git" / "hooks").mkdir(parents=True)
    assert error(probe, "write", path=".git/hooks/pre-commit", content="#!/bin/sh\n").code == "not_permitted"
    assert error(probe, "write", path=".git/config", content="").code == "not_permitted"


# --- run -----------------------------------------------------------------------------------------
def test_run_takes_an_argv_never_a_shell(probe, world):
    out = probe.call("run", {"argv": ["echo", "$HOME; touch pwned", "`id`"], "cwd": "src"})
    assert out["stdout"] == "$HOME; touch pwned `id`\n" and out["exit_code"] == 0
    assert out["cwd"] == str(world["root"] / "src") and out["timed_out"] is False
    assert not (world["root"] / "src" / "pwned").exists()
    failed = probe.call("run", {"argv": ["sh", "-c", "echo err >&2; exit 3"]})
    assert failed["exit_code"] == 3 and failed["stderr"] == "err\n"
    assert error(probe, "run", argv=["definitely-not-a-command-xyz"]).code == "not_found"
    assert error(probe, "run", argv=[]).code == "invalid_argument"
    assert error(probe, "run", argv="ls").code == "invalid_argument"


def test_run_scrubs_the_environment(probe, world, monkeypatch):
    monkeypatch.setenv("AI1NET_PROBE_TOKEN", "dev_supersecret")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret")
    out = probe.call("run", {"argv": ["env"]})["stdout"]
    assert "supersecret" not in out and "aws-secret" not in out
    env = dict(line.split("=", 1) for line in out.splitlines())
    assert env["HOME"] == str(world["root"]) and env["PATH"] and env["LANG"] == "C.UTF-8"


def test_run_timeout_kills_the_whole_process_group(probe, world):
    started = time.monotonic()
    out = probe.call("run", {"argv": ["sh", "-c", "sleep 30 & sleep 30; echo never"], "timeout": 0.5})
    assert out["timed_out"] is True and "never" not in out["stdout"]
    assert time.monotonic() - started < 10


def test_run_output_is_capped(probe):
    out = probe.call("run", {"argv": ["sh", "-c", "head -c 100000 /dev/zero | tr '\\0' a"], "max_bytes": 1000})
    assert out["stdout"] == "a" * 1000 and out["truncated"] is True and out["exit_code"] == 0


def test_run_background_ring_buffer_output_and_stop(probe):
    job = probe.call("run_background", {"argv": ["sh", "-c", "for i in 1 2 3; do echo line$i; done; exec sleep 60"]})
    handle = job["handle"]
    got = wait_until(
        lambda: "line3" in (o := probe.call("run_output", {"handle": handle}))["output"] and o,
        timeout=10,
        message="background output",
    )
    assert got["running"] is True and got["output"] == "line1\nline2\nline3\n" and got["dropped"] == 0
    tail = probe.call("run_output", {"handle": handle, "offset": got["next_offset"]})
    assert tail["output"] == "" and tail["offset"] == got["next_offset"]
    stopped = probe.call("stop", {"handle": handle})
    assert stopped["running"] is False and stopped["exit_code"] is not None
    assert probe.call("run_output", {"handle": handle})["running"] is False
    assert error(probe, "run_output", handle="nope").code == "unknown_handle"


def test_run_background_keeps_only_the_newest_output(probe):
    job = probe.call("run_background", {"argv": ["sh", "-c", "head -c 3000000 /dev/zero | tr '\\0' b; echo END"]})
    done = wait_until(
        lambda: (o := probe.call("run_output", {"handle": job["handle"], "offset": 0}))["running"] is False and o,
        timeout=20,
        message="background command to end",
    )
    assert done["exit_code"] == 0 and done["dropped"] > 0 and done["offset"] == 3000004 - ops.RING_BYTES
    last = probe.call("run_output", {"handle": job["handle"], "offset": 3000004 - 10})
    assert last["output"] == "bbbbbbEND\n" and last["dropped"] == 0


# --- ping / info ---------------------------------------------------------------------------------
def test_ping_and_info(probe, world):
    assert probe.call("ping")["pong"] is True
    info = probe.call("info")
    assert info["roots"] == [str(world["root"])] and info["modes"] == {"write": True, "exec": True}
    assert set(info["ops"]) == set(ops.OPS) and isinstance(info["ripgrep"], bool) and info["python"]
    assert probe.call("probe.ping", {})["pong"] is True  # the method name as it arrives over the tunnel
