"""git_diff and git_log: git run with its config defused, in a checked directory, on a checked repository.

Confinement: git starts in the directory the probe opened (see ``Confinement.child_cwd``); its search
for a repository stops at the root (``GIT_CEILING_DIRECTORIES``), and before git runs, every ``.git``
it could pick up on the way is checked: a ``.git`` that is a link, or a ``gitdir:`` file, whose target
leaves the roots refuses the op like any other path that does. git itself never follows links in
the worktree (it diffs a link's text), and the pathspec is the checked real path.
"""

from __future__ import annotations

import os
import re
import shutil
import stat as st_mod
from typing import Any, Dict, List, Optional, Tuple

from ..confine import Confinement
from ..errors import ProbeError
from .base import DEFAULT_PAGE_BYTES, MAX_PAGE_BYTES, Params, base_env
from .run import run_capped

GIT_CONFIG = [
    "-c", "core.hooksPath=/dev/null", "-c", "core.pager=cat", "-c", "core.fsmonitor=false",
    "-c", "core.untrackedCache=false", "-c", "diff.external=", "-c", "protocol.allow=never",
    "--no-pager",
]  # fmt: skip
# No ":" — "HEAD:path" and ":/text" would name blobs and commits by paths and text, not revisions.
REV = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./~^@{}+-]*(\.\.\.?[A-Za-z0-9_][A-Za-z0-9_./~^@{}+-]*)?")
GITDIR_FILE_MAX = 64 * 1024


def git_env(ceiling: str) -> Dict[str, str]:
    env = base_env("/nonexistent")
    env.update(
        {
            "XDG_CONFIG_HOME": "/nonexistent",
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_ATTR_NOSYSTEM": "1",
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_OPTIONAL_LOCKS": "0",
            "GIT_PAGER": "cat",
            "PAGER": "cat",
        }
    )
    if ceiling:
        env["GIT_CEILING_DIRECTORIES"] = ceiling
    return env


def check_repository(conf: Confinement, directory: str) -> None:
    """Refuse when the repository git would use from ``directory`` is reached by leaving the roots.

    git looks for ``.git`` in the directory and each parent up to the root (the ceiling stops it
    there). The first one found is checked like any path: a link must resolve inside the roots, and
    so must the places a ``gitdir:`` file, ``commondir`` and ``objects/info/alternates`` name (the
    ways a repository borrows another's files). Nothing outside is looked at to decide.
    """
    git_dir = _git_dir(conf, directory)
    if git_dir is None:
        return  # git will say it is not a repository
    common = git_dir
    for line in _lines(conf, os.path.join(git_dir, "commondir"))[:1]:
        common = conf.lookup(os.path.join(git_dir, line)).real
    for base in {git_dir, common}:
        objects = os.path.join(base, "objects")
        for line in _lines(conf, os.path.join(objects, "info", "alternates")):
            conf.lookup(os.path.join(objects, line))


def _git_dir(conf: Confinement, directory: str) -> Optional[str]:
    root = min((r for r in conf.roots if os.path.commonpath([r, directory]) == r), key=len)
    current = directory
    while True:
        dot_git = os.path.join(current, ".git")
        found = conf.lookup(dot_git, follow=False)
        if found.state == "ok" and found.st is not None:
            if st_mod.S_ISLNK(found.st.st_mode):
                return conf.lookup(dot_git).real  # raises outside_allowed_roots when it leaves
            if st_mod.S_ISREG(found.st.st_mode):
                for line in _lines(conf, dot_git):
                    if line.startswith("gitdir:"):
                        return conf.lookup(os.path.join(current, line[len("gitdir:") :].strip())).real
                return None
            return found.real
        if current == root:
            return None
        current = os.path.dirname(current)


def _lines(conf: Confinement, path: str) -> List[str]:
    """The meaningful lines of a small file of git's, or none when it does not exist."""
    if conf.lookup(path).state != "ok":
        return []
    fd, _, _ = conf.open_file(path)
    with os.fdopen(fd, "rb") as f:
        text = f.read(GITDIR_FILE_MAX).decode("utf-8", "surrogateescape")
    lines = []
    for line in text.splitlines():
        line = line.strip()
        if len(line) > 1 and line[0] == line[-1] == '"':
            line = line[1:-1]
        if line and not line.startswith("#"):
            lines.append(line)
    return lines


def run_git(
    conf: Confinement, path: str, args: List[str], max_bytes: int, timeout: float = 60
) -> Tuple[str, bytes, bool]:
    """(real path, stdout, truncated) of ``git args -- real`` run in ``path``'s directory."""
    git = shutil.which("git")
    if git is None:
        raise ProbeError("unsupported", "git is not installed on this machine")
    real, info = conf.existing(path)
    directory = real if st_mod.S_ISDIR(info.st_mode) else os.path.dirname(real)
    check_repository(conf, directory)
    outermost = min((r for r in conf.roots if os.path.commonpath([r, directory]) == r), key=len)
    ceiling = os.path.dirname(outermost) if outermost != os.path.dirname(outermost) else ""
    with conf.child_cwd(directory) as (_, cwd, pass_fds):
        result = run_capped(
            [git] + GIT_CONFIG + args + ["--", real], cwd, git_env(ceiling), timeout, max_bytes, pass_fds
        )
    if result["timed_out"]:
        raise ProbeError("timeout", "git took too long")
    if result["exit_code"] != 0:
        message = result["stderr"].decode("utf-8", "replace").strip()
        raise ProbeError("git_failed", message[:2000] or f"git exited with {result['exit_code']}")
    return real, result["stdout"], result["truncated"]


def _rev(p: Params) -> Optional[str]:
    rev = p.str("rev", None)
    if rev is not None and (len(rev) > 200 or not REV.fullmatch(rev)):
        raise ProbeError("invalid_argument", f"{p.op}: rev must be a revision such as HEAD~2 or main..topic")
    return rev


def op_git_diff(conf: Confinement, p: Params) -> Dict[str, Any]:
    path = p.str("path", ".")
    rev = _rev(p)
    staged = p.bool("staged")
    max_bytes = p.int("max_bytes", DEFAULT_PAGE_BYTES, 1, MAX_PAGE_BYTES)
    args = ["diff", "--no-ext-diff", "--no-textconv", "--no-color"]
    if staged:
        args.append("--cached")
    if rev:
        args.append(rev)
    real, out, truncated = run_git(conf, path, args, max_bytes)
    return {"path": real, "diff": out.decode("utf-8", "replace"), "truncated": truncated}


def op_git_log(conf: Confinement, p: Params) -> Dict[str, Any]:
    path = p.str("path", ".")
    rev = _rev(p)
    limit = p.int("limit", 20, 1, 1000)
    offset = p.int("offset", 0, 0, 1 << 30)
    args = ["log", "--no-color", "--no-show-signature", f"--max-count={limit + 1}", f"--skip={offset}"]
    args.append("--format=%H%x1f%an%x1f%ae%x1f%aI%x1f%s%x1e")
    if rev:
        args.append(rev)
    real, out, _ = run_git(conf, path, args, MAX_PAGE_BYTES)
    commits = []
    for record in out.decode("utf-8", "replace").split("\x1e"):
        fields = record.strip("\n").split("\x1f")
        if len(fields) == 5:
            commits.append(dict(zip(("hash", "author", "email", "date", "subject"), fields)))  # noqa: B905 - 3.9
    return {"path": real, "commits": commits[:limit], "truncated": len(commits) > limit}
