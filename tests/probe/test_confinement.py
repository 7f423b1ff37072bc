"""The allow-list, case by case: each test names the bypass it closes."""

from __future__ import annotations

import os

import pytest

from clients.probe import confine
from clients.probe.ops import ProbeError


def refused(probe, op, code="outside_allowed_roots", **params):
    with pytest.raises(ProbeError) as info:
        probe.call(op, params)
    assert info.value.code == code, info.value
    return info.value


def test_inside_paths_work_absolute_relative_and_with_harmless_dotdot(readonly, world):
    root = world["root"]
    assert readonly.call("read", {"path": str(root / "README.md")})["lines"] == [[1, "hello"], [2, "world"]]
    assert readonly.call("read", {"path": "README.md"})["path"] == str(root / "README.md")
    assert readonly.call("read", {"path": "src/pkg/../../README.md"})["lines"][0] == [1, "hello"]
    assert readonly.call("read", {"path": f"{root}/./src/../../proj/README.md"})["lines"][0] == [1, "hello"]


@pytest.mark.parametrize(
    "path",
    [
        "../outside/secret.txt",
        "src/../../outside/secret.txt",
        "src/pkg/../../../outside/deep/secret.txt",
        "a/b/c/../../../../../../../../etc/passwd",
        "src/pkg/" + "../" * 40 + "etc/passwd",
        "/etc/passwd",
        "..",
        "/",
    ],
)
def test_dotdot_mixes_and_deep_escapes_are_refused(readonly, path):
    detail = refused(readonly, "read", path=path).detail
    assert "secret" not in detail and "root:" not in detail


@pytest.mark.parametrize("op", ["read", "stat", "read_tree", "grep", "ast_parse", "git_log"])
def test_sibling_prefix_directory_is_not_inside(readonly, world, op):
    sibling = world["sibling"]
    assert str(sibling).startswith(str(world["root"]))  # the classic string-prefix trap
    params = {"pattern": "secret", "path": str(sibling)} if op == "grep" else {"path": str(sibling / "secret.txt")}
    if op == "read_tree":
        params = {"path": str(sibling)}
    refused(readonly, op, **params)
    refused(readonly, "read", path="../proj2/secret.txt")


@pytest.mark.parametrize("path", ["README.md\0", "\0", "src/\0/../README.md"])
def test_nul_bytes_are_refused(readonly, path):
    refused(readonly, "read", code="invalid_argument", path=path)
    refused(readonly, "stat", code="invalid_argument", path=path)


def test_empty_and_non_string_paths_are_refused(readonly):
    refused(readonly, "read", code="invalid_argument", path="")
    refused(readonly, "read", code="invalid_argument", path=["README.md"])


def test_symlink_to_an_outside_file_is_refused(readonly, world):
    os.symlink(world["outside"] / "secret.txt", world["root"] / "link")
    refused(readonly, "read", path="link")
    refused(readonly, "ast_parse", path="link")
    refused(readonly, "git_log", path="link")


def test_symlink_to_an_outside_directory_is_refused_and_never_walked(readonly, world):
    os.symlink(world["outside"], world["root"] / "out")
    refused(readonly, "read", path="out/secret.txt")
    refused(readonly, "read", path="out/deep/secret.txt")
    refused(readonly, "read_tree", path="out")
    refused(readonly, "grep", pattern="secret", path="out")
    tree = readonly.call("read_tree", {"path": ".", "depth": 5})
    link = next(e for e in tree["entries"] if e["path"] == "out")
    assert link["type"] == "symlink" and link["outside"] is True
    assert not [e for e in tree["entries"] if e["path"].startswith("out/")]
    for engine in ("python", "rg") if readonly.call("info")["ripgrep"] else ("python",):
        hits = readonly.call("grep", {"pattern": "secret", "engine": engine})
        assert hits["matches"] == [], engine


def test_three_hop_chains_are_followed_to_their_end(readonly, world):
    root = world["root"]
    os.symlink(world["outside"] / "secret.txt", root / "hop3")
    os.symlink("hop3", root / "hop2")
    os.symlink(root / "hop2", root / "hop1")
    refused(readonly, "read", path="hop1")
    os.symlink(root / "README.md", root / "in3")
    os.symlink("in3", root / "in2")
    os.symlink("in2", root / "in1")
    assert readonly.call("read", {"path": "in1"})["path"] == str(root / "README.md")


def test_a_chain_that_leaves_and_comes_back_is_refused(readonly, world):
    # Following it would need reading the outside link "back": whether it exists, and where it points.
    root = world["root"]
    os.symlink(world["outside"], root / "away")
    os.symlink(root / "src", world["outside"] / "back")
    refused(readonly, "read", path="away/back/pkg/mod.py")
    os.symlink(world["outside"] / "back" / "pkg" / "mod.py", root / "round-trip")
    refused(readonly, "read", path="round-trip")
    refused(readonly, "stat", path="round-trip")


def test_parent_directory_link_on_write_is_refused_and_nothing_lands_outside(probe, world):
    os.symlink(world["outside"], world["root"] / "out")
    refused(probe, "write", path="out/new.txt", content="x")
    refused(probe, "write", path="out/secret.txt", content="overwritten")
    refused(probe, "write", path="out/deep/secret.txt", diff="@@ -1 +1 @@\n-deep secret\n+changed\n")
    assert sorted(os.listdir(world["outside"])) == ["deep", "secret.txt"]
    assert (world["outside"] / "secret.txt").read_text() == "outside secret\n"


def test_write_never_goes_through_a_final_symlink(probe, world):
    root = world["root"]
    os.symlink(world["outside"] / "secret.txt", root / "evil")
    refused(probe, "write", path="evil", content="x")
    os.symlink(root / "README.md", root / "alias")
    refused(probe, "write", code="is_symlink", path="alias", content="x")
    os.symlink(world["outside"] / "missing.txt", root / "dangling")
    refused(probe, "write", path="dangling", content="x")
    assert not (world["outside"] / "missing.txt").exists()
    assert (root / "README.md").read_text() == "hello\nworld\n"


def test_a_file_swapped_for_a_link_between_check_and_open_is_refused(readonly, world, monkeypatch):
    target = world["root"] / "README.md"

    def swap(real):
        os.replace(target, world["tmp"] / "moved")
        os.symlink(world["outside"] / "secret.txt", target)

    monkeypatch.setattr(confine, "_after_resolve", swap)
    error = refused(readonly, "read", path="README.md")
    assert "secret" not in error.detail


def test_a_parent_directory_swapped_for_a_link_between_check_and_open_is_refused(readonly, world, monkeypatch):
    root = world["root"]
    (root / "data").mkdir()
    (root / "data" / "secret.txt").write_text("inside\n")

    def swap(real):
        os.rename(root / "data", world["tmp"] / "data-moved")
        os.symlink(world["outside"], root / "data")

    monkeypatch.setattr(confine, "_after_resolve", swap)
    refused(readonly, "read", path="data/secret.txt")


def test_a_directory_swapped_for_a_link_before_opening_is_refused(readonly, world, monkeypatch):
    root = world["root"]

    def swap(real):
        os.rename(root / "src", world["tmp"] / "src-moved")
        os.symlink(world["outside"], root / "src")

    monkeypatch.setattr(confine, "_after_resolve", swap)
    refused(readonly, "read_tree", path="src")


def test_a_symlinked_allowed_root_still_works(world, make_probe):
    link = world["tmp"] / "proj-link"
    os.symlink(world["root"], link)
    probe = make_probe(link, write=True)
    assert probe.call("info")["roots"] == [str(world["root"])]
    assert probe.call("read", {"path": str(link / "README.md")})["lines"][0] == [1, "hello"]
    assert probe.call("read", {"path": "README.md"})["lines"][0] == [1, "hello"]
    assert probe.call("stat", {"path": str(link)})["type"] == "dir"
    assert probe.call("read_tree", {"path": str(link)})["count"] >= 3
    assert probe.call("write", {"path": str(link / "new.txt"), "content": "n\n"})["created"] is True
    assert (world["root"] / "new.txt").read_text() == "n\n"
    refused(probe, "read", path=str(link / ".." / "outside" / "secret.txt"))


def test_broken_links_and_loops_in_read_tree(readonly, world):
    root = world["root"]
    os.symlink("nowhere", root / "broken")
    os.symlink("loop-b", root / "loop-a")
    os.symlink("loop-a", root / "loop-b")
    os.symlink(".", root / "src" / "self")  # a directory loop, if anything followed it
    os.symlink(root, root / "src" / "up")
    tree = readonly.call("read_tree", {"path": ".", "depth": 50, "max_entries": 20000})
    by_path = {e["path"]: e for e in tree["entries"]}
    assert by_path["broken"] == {"path": "broken", "type": "symlink", "target": "nowhere", "broken": True}
    assert by_path["loop-a"]["loop"] is True and by_path["loop-b"]["loop"] is True
    assert by_path["src/self"]["type"] == "symlink" and by_path["src/up"]["outside"] is False
    assert not [p for p in by_path if p.startswith(("src/self/", "src/up/"))]
    assert tree["truncated"] is False
    refused(readonly, "read", code="not_found", path="broken")
    refused(readonly, "read", code="not_found", path="loop-a")
    assert readonly.call("stat", {"path": "loop-a"})["loop"] is True


def test_a_root_that_is_not_a_directory_is_refused_at_start(world, make_probe):
    with pytest.raises(ValueError):
        make_probe(world["root"] / "README.md")
    with pytest.raises(ValueError):
        make_probe(world["tmp"] / "missing")


def test_contains_is_by_component():
    assert confine.contains("/a/proj", "/a/proj/x")
    assert confine.contains("/a/proj", "/a/proj")
    assert not confine.contains("/a/proj", "/a/proj2")
    assert not confine.contains("/a/proj", "/a/proj2/x")
    assert confine.contains("/", "/etc")


@pytest.mark.parametrize("op", ["run", "run_background"])
def test_commands_cannot_start_outside(probe, world, op):
    os.symlink(world["outside"], world["root"] / "out")
    refused(probe, op, argv=["true"], cwd=str(world["outside"]))
    refused(probe, op, argv=["true"], cwd="out")
    refused(probe, op, argv=["true"], cwd=str(world["sibling"]))


def test_write_and_exec_are_refused_without_their_flags(readonly):
    refused(readonly, "write", code="not_permitted", path="x.txt", content="x")
    refused(readonly, "write", code="not_permitted", path="x.txt", diff="@@ -0,0 +1 @@\n+x\n")
    refused(readonly, "run", code="not_permitted", argv=["true"])
    refused(readonly, "run_background", code="not_permitted", argv=["true"])
    refused(readonly, "stop", code="not_permitted", handle="abc")
    assert "write" not in readonly.ops and "run" not in readonly.ops


def test_write_flag_alone_does_not_allow_commands(world, make_probe):
    probe = make_probe(world["root"], write=True)
    assert probe.call("write", {"path": "a.txt", "content": "a"})["created"] is True
    refused(probe, "run", code="not_permitted", argv=["true"])


def test_exec_flag_alone_does_not_allow_writes(world, make_probe):
    probe = make_probe(world["root"], exec_=True)
    refused(probe, "write", code="not_permitted", path="a.txt", content="a")
    assert probe.call("run", {"argv": ["true"]})["exit_code"] == 0
