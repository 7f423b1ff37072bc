"""The small parsers under the ops: .gitignore matching and the unified-diff applier."""

from __future__ import annotations

import difflib

import pytest

from clients.probe import ignore, udiff
from clients.probe.errors import ProbeError


@pytest.mark.parametrize(
    ("pattern", "path", "is_dir", "expected"),
    [
        ("*.log", "a.log", False, True),
        ("*.log", "deep/down/a.log", False, True),
        ("*.log", "a.logx", False, False),
        ("build/", "build", True, True),
        ("build/", "build", False, False),
        ("/top.txt", "top.txt", False, True),
        ("/top.txt", "sub/top.txt", False, False),
        ("src/*.py", "src/a.py", False, True),
        ("src/*.py", "src/x/a.py", False, False),
        ("docs/**/*.tmp", "docs/a/b/c.tmp", False, True),
        ("docs/**/*.tmp", "docs/c.tmp", False, True),
        ("**/cache", "a/b/cache", True, True),
        ("**/cache", "cache", True, True),
        ("logs/**", "logs/a/b", False, True),
        ("a?c", "abc", False, True),
        ("a?c", "a/c", False, False),
        ("[ab]x", "bx", False, True),
        ("[!ab]x", "bx", False, False),
        ("\\#hash", "#hash", False, True),
    ],
)
def test_gitignore_rules(pattern, path, is_dir, expected):
    (rule,) = ignore.parse(pattern)
    assert rule.matches(path, is_dir) is expected


def test_gitignore_last_match_wins_and_deeper_files_override():
    stack = ignore.IgnoreStack().push("", ignore.parse("*.log\n!keep.log\n# c\n\n"))
    assert stack.ignored("a.log", False) and not stack.ignored("keep.log", False)
    deeper = stack.push("sub", ignore.parse("!*.log\n"))
    assert not deeper.ignored("sub/a.log", False) and deeper.ignored("a.log", False)


def roundtrip(old: str, new: str) -> str:
    diff = "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), "a/f", "b/f"))
    return udiff.apply(old, diff)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("a\nb\nc\n", "a\nB\nc\n"),
        ("a\nb\nc\n", "x\na\nb\nc\ny\n"),
        ("".join(f"{i}\n" for i in range(100)), "".join(f"{i}\n" for i in range(100) if i % 17)),
        ("a\nb\n", ""),
        ("", "a\n"),
    ],
)
def test_diff_roundtrips(old, new):
    assert roundtrip(old, new) == new


def test_diff_handles_the_final_newline_marker():
    diff = "--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+b\n"
    assert udiff.apply("a\nb", diff) == "a\nb\n"
    back = "--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n a\n-b\n+b\n\\ No newline at end of file\n"
    assert udiff.apply("a\nb\n", back) == "a\nb"


def test_diff_finds_a_hunk_that_moved_but_never_fuzzes():
    old = "intro\n" * 3 + "a\nb\nc\n"
    diff = "--- a/f\n+++ b/f\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n"
    assert udiff.apply(old, diff) == "intro\n" * 3 + "a\nB\nc\n"
    with pytest.raises(ProbeError) as info:
        udiff.apply("a\nX\nc\n", diff)
    assert info.value.code == "diff_does_not_apply"


@pytest.mark.parametrize(
    "diff",
    [
        "just text\n",
        "--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n a\n",
        "--- a/f\n+++ b/f\n@@ -1 +1 @@\n-a\n+b\n--- a/g\n+++ b/g\n@@ -1 +1 @@\n-a\n+b\n",
        "--- a/f\n+++ b/f\n@@ -1 +1 @@\n?a\n+b\n",
    ],
)
def test_malformed_diffs_are_refused(diff):
    with pytest.raises(ProbeError) as info:
        udiff.apply("a\n", diff)
    assert info.value.code == "invalid_argument"
