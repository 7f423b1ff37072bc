"""Issue 13: a probe is never an oracle for what lies outside its roots.

Every op, addressed through a link to an outside file, an outside directory, a chain that ends
outside, a loop, and a link swapped in between the check and the use: a link that leaves is refused
with one code and one message whether its target exists or not; listings show it as
``{type: symlink, outside: true}`` and nothing more; no outside byte or metadata reaches an answer.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time

import pytest

from clients.probe import confine
from clients.probe.confine import OUTSIDE
from clients.probe.errors import ProbeError
from clients.probe.ops import run as run_module

OUTSIDE_TEXT = "outside secret"
OUTSIDE_MTIME = 1_111_111_111  # a date no inside file has: if it shows up, it came from outside
REFUSED = ("outside_allowed_roots", OUTSIDE)

# op name in these tests -> (probe op, params addressing `path`)
ADDRESS = {
    "read": ("read", lambda path: {"path": path}),
    "ast_parse": ("ast_parse", lambda path: {"path": path}),
    "stat": ("stat", lambda path: {"path": path}),
    "read_tree": ("read_tree", lambda path: {"path": path}),
    "grep-python": ("grep", lambda path: {"pattern": "secret", "path": path, "engine": "python"}),
    "grep-rg": ("grep", lambda path: {"pattern": "secret", "path": path, "engine": "rg"}),
    "git_diff": ("git_diff", lambda path: {"path": path}),
    "git_log": ("git_log", lambda path: {"path": path}),
    "run": ("run", lambda path: {"argv": ["cat", "secret.txt"], "cwd": path}),
    "run_background": ("run_background", lambda path: {"argv": ["cat", "secret.txt"], "cwd": path}),
    "write": ("write", lambda path: {"path": path, "content": "x\n"}),
}
EVERY_OP = list(ADDRESS)


def outcome(probe, name, path):
    """(code, detail) of a refusal, or ("done", result)."""
    if name == "grep-rg" and shutil.which("rg") is None:
        pytest.skip("ripgrep is not installed")
    if name.startswith("git") and shutil.which("git") is None:
        pytest.skip("git is not installed")
    op, params = ADDRESS[name]
    try:
        return "done", probe.call(op, params(path))
    except ProbeError as exc:
        return exc.code, exc.detail


def assert_no_outside_trace(answer, world):
    text = json.dumps(answer, default=str)
    assert OUTSIDE_TEXT not in text and str(world["outside"]) not in text, answer
    assert str(OUTSIDE_MTIME) not in text, answer


@pytest.fixture
def links(world):
    """Links in the root: to outside things that exist, to outside things that do not, chains, loops."""
    root, outside = world["root"], world["outside"]
    os.utime(outside / "secret.txt", (OUTSIDE_MTIME, OUTSIDE_MTIME))
    for name, target in {
        "to-file": outside / "secret.txt",
        "to-missing": outside / "missing.txt",
        "to-dir": outside,
        "to-missing-dir": outside / "no-such-dir",
        "chain": "chain-2",
        "chain-2": root / "chain-3",
        "chain-3": outside / "secret.txt",
        "chain-missing": "chain-missing-2",
        "chain-missing-2": outside / "missing.txt",
        "loop-out": outside / "loop",
        "loop-in": "loop-in-2",
        "loop-in-2": "loop-in",
        "inside": "README.md",
    }.items():
        os.symlink(target, root / name)
    os.symlink(root / "loop-out", outside / "loop")  # the loop passes through the outside
    return root


# --- addressing: refused alike, whatever lies outside ------------------------------------------
@pytest.mark.parametrize("name", EVERY_OP)
def test_a_link_to_an_outside_file_is_refused_alike_whether_it_exists_or_not(probe, world, links, name):
    there = outcome(probe, name, "to-file")
    assert there == REFUSED
    assert outcome(probe, name, "to-missing") == there
    assert outcome(probe, name, str(links / "to-file")) == there


@pytest.mark.parametrize("name", EVERY_OP)
def test_a_link_to_an_outside_directory_is_refused_alike_whether_it_exists_or_not(probe, world, links, name):
    (world["outside"] / "deep" / "secret.py").write_text("x = 1\n")
    answers = {
        path: outcome(probe, name, path)
        for path in [
            "to-dir",
            "to-missing-dir",
            "to-dir/deep",
            "to-dir/nope",
            "to-missing-dir/deep",
            "to-dir/deep/secret.py",
        ]
    }
    assert set(answers.values()) == {REFUSED}, answers


@pytest.mark.parametrize("name", EVERY_OP)
def test_a_chain_that_ends_outside_is_refused_alike_whether_its_end_exists_or_not(probe, world, links, name):
    assert outcome(probe, name, "chain") == REFUSED
    assert outcome(probe, name, "chain-missing") == REFUSED
    assert outcome(probe, name, "chain-2") == REFUSED


# What a loop inside the roots gets: it is all inside, so saying "loop" reveals nothing outside.
INSIDE_LOOP = {
    "stat": "done",
    "write": "is_symlink",
}


@pytest.mark.parametrize("name", EVERY_OP)
def test_loops(probe, world, links, name):
    # A loop through an outside path is refused like any link that leaves, and like a missing target.
    assert outcome(probe, name, "loop-out") == REFUSED
    code, answer = outcome(probe, name, "loop-in")
    assert code == INSIDE_LOOP.get(name, "not_found"), answer
    if code == "done":
        assert answer["type"] == "symlink" and answer["loop"] is True and "outside" not in answer
    elif code == "not_found":
        assert answer == "symbolic link loop: loop-in"


def test_issue_13_stat_of_a_link_out_no_longer_answers_with_its_target(readonly, world, links):
    # The report: stat on a link to an outside file answered done, with its target and target_type.
    for path in ("to-file", "to-missing", "to-dir", "chain", "loop-out"):
        with pytest.raises(ProbeError) as info:
            readonly.call("stat", {"path": path})
        assert (info.value.code, info.value.detail) == REFUSED
    inside = readonly.call("stat", {"path": "inside"})
    assert inside["target"] == "README.md" and inside["target_type"] == "file" and inside["outside"] is False


# --- listing: a link that leaves is a link, marked outside, and nothing more ---------------------
def test_read_tree_shows_a_link_that_leaves_by_its_own_entry_only(readonly, world, links):
    tree = readonly.call("read_tree", {"path": ".", "depth": 5})
    by_path = {entry["path"]: entry for entry in tree["entries"]}
    for name in ("to-file", "to-missing", "to-dir", "to-missing-dir", "chain", "chain-2", "chain-3", "loop-out"):
        assert by_path[name] == {"path": name, "type": "symlink", "outside": True}, name
    assert by_path["loop-in"] == {"path": "loop-in", "type": "symlink", "target": "loop-in-2", "loop": True}
    assert by_path["inside"]["target_type"] == "file" and by_path["inside"]["outside"] is False
    assert not [path for path in by_path if path.startswith(("to-dir/", "loop-out/"))]
    assert_no_outside_trace(tree, world)


@pytest.mark.parametrize("engine", ["python", "rg"])
def test_grep_never_reads_through_a_link_that_leaves(readonly, world, links, engine):
    if engine == "rg" and shutil.which("rg") is None:
        pytest.skip("ripgrep is not installed")
    (world["root"] / "src" / "notes.txt").write_text("inside secret\n")
    out = readonly.call("grep", {"pattern": "secret", "engine": engine})
    assert [(os.path.relpath(m["path"], world["root"]), m["text"]) for m in out["matches"]] == [
        ("src/notes.txt", "inside secret")
    ]
    assert_no_outside_trace(out, world)


# --- between the check and the use ---------------------------------------------------------------
@pytest.fixture
def victims(world):
    root = world["root"]
    (root / "victim.py").write_text('x = "inside secret"\n')
    (root / "victim-dir").mkdir()
    (root / "victim-dir" / "secret.txt").write_text("inside secret!!\n")  # 16 bytes; the outside one has 15
    os.utime(world["outside"] / "secret.txt", (OUTSIDE_MTIME, OUTSIDE_MTIME))
    return root


def swapper(world, name, target):
    """A one-shot swap: `name` in the root is moved away and replaced by a link to `target`."""
    root = world["root"]
    done = []

    def swap(*_args):
        if not done:
            done.append(True)
            os.rename(root / name, world["tmp"] / f"{name}-moved")
            os.symlink(target, root / name)

    return swap, done


# op -> the path it is given, and what is swapped for a link (a file for file ops, else a directory)
TOCTOU = {
    "read": ("victim.py", "victim.py"),
    "ast_parse": ("victim.py", "victim.py"),
    "grep-python": ("victim.py", "victim.py"),
    "grep-rg": ("victim.py", "victim.py"),
    "read_tree": ("victim-dir", "victim-dir"),
    "git_diff": ("victim-dir", "victim-dir"),
    "git_log": ("victim-dir", "victim-dir"),
    "run": ("victim-dir", "victim-dir"),
    "run_background": ("victim-dir", "victim-dir"),
    "write": ("victim-dir/new.txt", "victim-dir"),
}


@pytest.mark.parametrize("name", list(TOCTOU))
def test_a_path_replaced_by_a_link_between_check_and_use_is_refused(probe, world, victims, monkeypatch, name):
    path, swapped = TOCTOU[name]
    target = world["outside"] / "secret.txt" if swapped.endswith(".py") else world["outside"]
    swap, done = swapper(world, swapped, target)
    monkeypatch.setattr(confine, "_after_resolve", swap)
    answer = outcome(probe, name, path)
    assert done and answer == REFUSED
    assert_no_outside_trace(answer, world)
    assert sorted(os.listdir(world["outside"])) == ["deep", "secret.txt"]  # nothing written there


def test_stat_a_directory_replaced_by_a_link_during_resolution_is_refused(readonly, world, victims, monkeypatch):
    swap, done = swapper(world, "victim-dir", world["outside"])
    monkeypatch.setattr(confine, "_on_step", lambda path: swap() if path.endswith("/victim-dir") else None)
    answer = outcome(readonly, "stat", "victim-dir/secret.txt")
    assert done and answer == REFUSED


def test_stat_holds_on_to_the_directory_it_checked(readonly, world, victims, monkeypatch):
    # Swapped after the walk entered victim-dir: the answer is about the file that was checked
    # (wherever it was moved), never about the outside file the new link names.
    swap, done = swapper(world, "victim-dir", world["outside"])
    monkeypatch.setattr(confine, "_on_step", lambda path: swap() if path.endswith("/victim-dir/secret.txt") else None)
    code, answer = outcome(readonly, "stat", "victim-dir/secret.txt")
    assert done and code == "done" and answer["size"] == 16 and answer["mtime"] != OUTSIDE_MTIME


@pytest.mark.parametrize("name", ["run", "run_background"])
def test_a_command_starts_in_the_checked_directory_even_if_it_is_swapped_before_the_start(
    probe, world, victims, monkeypatch, name
):
    swap, done = swapper(world, "victim-dir", world["outside"])
    real_popen = subprocess.Popen

    def swap_then_start(*args, **kwargs):
        swap()
        return real_popen(*args, **kwargs)

    monkeypatch.setattr(run_module.subprocess, "Popen", swap_then_start)
    code, answer = outcome(probe, name, "victim-dir")
    assert done and code == "done"
    if name == "run":
        output = answer["stdout"]
    else:
        deadline = time.monotonic() + 10
        while probe.call("run_output", {"handle": answer["handle"]})["running"] and time.monotonic() < deadline:
            time.sleep(0.01)
        output = probe.call("run_output", {"handle": answer["handle"]})["output"]
    assert output == "inside secret!!\n"  # the directory that was checked, not the one the link names


# --- a link flipping while ops run: no answer ever carries an outside trace ----------------------
@pytest.mark.parametrize("name", ["read", "stat", "ast_parse", "grep-python", "grep-rg", "read_tree", "run"])
def test_a_link_flipping_under_running_ops_never_leaks(probe, world, monkeypatch, name):
    root, outside = world["root"], world["outside"]
    os.utime(outside / "secret.txt", (OUTSIDE_MTIME, OUTSIDE_MTIME))
    (root / "flipdir").mkdir()
    (root / "flipdir" / "secret.txt").write_text("inside secret!!\n")
    (root / "flip.py").write_text('x = "inside secret"\n')
    staging = world["tmp"] / "staging"
    staging.mkdir()
    is_dir = name in ("read_tree", "run") or name.startswith("grep")
    path = "flipdir" if is_dir else "flip.py"
    stop = threading.Event()

    def flip():
        while not stop.is_set():
            if is_dir:
                os.rename(root / "flipdir", staging / "flipdir")
                os.symlink(outside, root / "flipdir")
                os.unlink(root / "flipdir")
                os.rename(staging / "flipdir", root / "flipdir")
            else:
                os.symlink(outside / "secret.txt", staging / "link")
                os.rename(root / "flip.py", staging / "flip.py")
                os.rename(staging / "link", root / "flip.py")
                os.rename(staging / "flip.py", root / "flip.py")

    flipper = threading.Thread(target=flip, daemon=True)
    flipper.start()
    answers = set()
    try:
        for _ in range(60 if name in ("grep-rg", "run") else 300):
            code, answer = outcome(probe, name, path)
            answers.add(code)
            assert_no_outside_trace(answer, world)
            if code == "outside_allowed_roots":
                assert answer == OUTSIDE
            if name == "stat" and code == "done":  # the link there leaves: only the file is described
                assert (answer["type"], answer["size"]) == ("file", 20), answer
    finally:
        stop.set()
        flipper.join(5)
    assert answers <= {"done", "outside_allowed_roots", "not_found"}, answers


# --- git: the repository itself must not be reached by leaving the roots ------------------------
def git(cwd, *args):
    env = {"PATH": os.environ["PATH"], "HOME": str(cwd), "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
    command = ["git", "-c", "user.name=T", "-c", "user.email=t@example.com", *args]
    subprocess.run(command, cwd=cwd, env=env, check=True, capture_output=True)


@pytest.fixture
def outside_repo(world):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = world["outside"] / "repo"
    repo.mkdir()
    (repo / "README.md").write_text("hello\nworld\n")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "outside commit")
    return repo


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda root, repo: os.symlink(repo / ".git", root / ".git"), id="dot-git-link"),
        pytest.param(lambda root, repo: os.symlink(repo / "missing.git", root / ".git"), id="dot-git-link-missing"),
        pytest.param(lambda root, repo: (root / ".git").write_text(f"gitdir: {repo / '.git'}\n"), id="gitdir-file"),
        pytest.param(lambda root, repo: (root / ".git").write_text(f"gitdir: {repo}/nope\n"), id="gitdir-file-missing"),
    ],
)
@pytest.mark.parametrize("op", ["git_log", "git_diff"])
def test_git_refuses_a_repository_that_lives_outside(readonly, world, outside_repo, make, op):
    make(world["root"], outside_repo)
    with pytest.raises(ProbeError) as info:
        readonly.call(op, {"path": "."})
    assert (info.value.code, info.value.detail) == REFUSED


@pytest.mark.parametrize("what", ["commondir", "alternates"])
def test_git_refuses_a_repository_that_borrows_from_outside(readonly, world, outside_repo, what):
    root = world["root"]
    git(root, "init", "-q")
    if what == "commondir":
        (root / ".git" / "commondir").write_text(f"{outside_repo / '.git'}\n")
    else:
        (root / ".git" / "objects" / "info" / "alternates").write_text(f"{outside_repo / '.git' / 'objects'}\n")
    with pytest.raises(ProbeError) as info:
        readonly.call("git_log", {"path": "."})
    assert (info.value.code, info.value.detail) == REFUSED


def test_git_never_climbs_above_the_root_to_find_a_repository(readonly, world, outside_repo):
    alone = outcome(readonly, "git_log", ".")
    git(world["tmp"], "init", "-q")  # the directory holding the root is now a repository: still not used
    git(world["tmp"], "add", "proj/README.md")
    git(world["tmp"], "commit", "-q", "-m", "above the root")
    assert alone[0] == "git_failed" and outcome(readonly, "git_log", ".") == alone


def test_git_diff_shows_a_tracked_file_turned_link_as_a_link(readonly, world):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    root = world["root"]
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "first")
    os.unlink(root / "README.md")
    os.symlink(world["outside"] / "secret.txt", root / "README.md")
    diff = readonly.call("git_diff", {"path": "."})["diff"]
    assert "-hello" in diff and OUTSIDE_TEXT not in diff  # git diffs the link's text, never its target


def test_a_rev_cannot_name_a_file_by_its_path(readonly, world):
    for rev in ("HEAD:../outside/secret.txt", ":/secret", "HEAD:README.md"):
        with pytest.raises(ProbeError) as info:
            readonly.call("git_log", {"path": ".", "rev": rev})
        assert info.value.code == "invalid_argument"
