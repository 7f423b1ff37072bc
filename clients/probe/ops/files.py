"""File ops: read, read_tree, stat and write, and the directory walk grep shares."""

from __future__ import annotations

import base64 as b64
import hashlib
import os
import secrets
import stat as st_mod
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from .. import ignore, udiff
from ..confine import DIR_FLAGS, FILE_FLAGS, O_CLOEXEC, O_NOFOLLOW, Confinement, outside
from ..errors import ProbeError
from .base import DEFAULT_PAGE_BYTES, MAX_PAGE_BYTES, Params, strip_eol

WRITE_MAX_BYTES = 16 * 1024 * 1024


# --- read ---------------------------------------------------------------------------------------
def op_read(conf: Confinement, p: Params) -> Dict[str, Any]:
    path = p.str("path")
    as_base64 = p.bool("base64")
    max_bytes = p.int("max_bytes", DEFAULT_PAGE_BYTES, 1, MAX_PAGE_BYTES)
    fd, real, info = conf.open_file(path)
    with os.fdopen(fd, "rb") as f:
        if as_base64:
            offset = p.int("offset", 0, 0, 1 << 62)
            limit = p.int("limit", max_bytes, 1, max_bytes)
            f.seek(offset)
            data = f.read(limit)
            end = offset + len(data)
            more = end < info.st_size
            return {
                "path": real,
                "encoding": "base64",
                "offset": offset,
                "size": info.st_size,
                "data": b64.b64encode(data).decode("ascii"),
                "truncated": more,
                "next_offset": end if more else None,
            }
        if b"\0" in f.read(8192):
            raise ProbeError("is_binary", f"{path} looks binary; ask with base64=true")
        f.seek(0)
        offset = max(p.int("offset", 1, 0, 1 << 62), 1)
        limit = p.int("limit", 2000, 1, 100000)
        reached = _skip_lines(f, offset - 1)
        lines: List[List[Any]] = []
        used = 0
        number = offset
        stopped_early = False
        while reached and len(lines) < limit:
            start = f.tell()
            raw = f.readline(max_bytes + 1)
            if not raw:
                break
            if len(raw) > max_bytes and not raw.endswith(b"\n"):
                if lines:  # an over-long line starts the next page
                    f.seek(start)
                    stopped_early = True
                    break
                f.readline()  # the rest of the over-long line is dropped, and said so
                text = raw[:max_bytes].decode("utf-8", "replace") + " [line cut]"
                lines.append([number, text])
                number += 1
                used = max_bytes  # the page is full
                continue
            if lines and used + len(raw) > max_bytes:
                f.seek(start)
                stopped_early = True
                break
            used += len(raw)
            lines.append([number, strip_eol(raw).decode("utf-8", "replace")])
            number += 1
        rest_lines, more = _count_rest(f)
        total = (number - 1 + rest_lines) if reached else _count_all(f)
    return {
        "path": real,
        "encoding": "utf-8",
        "offset": offset,
        "limit": limit,
        "lines": lines,
        "total_lines": total,
        "size": info.st_size,
        "truncated": bool(more or stopped_early),
        "next_offset": number if more else None,
    }


def _skip_lines(f: Any, count: int) -> bool:
    """Move past `count` lines; False when the file has fewer lines than that."""
    remaining = count
    while remaining:
        chunk = f.read(1 << 20)
        if not chunk:
            return False
        found = chunk.count(b"\n")
        if found < remaining:
            remaining -= found
            continue
        at = -1
        for _ in range(remaining):
            at = chunk.index(b"\n", at + 1)
        f.seek(at + 1 - len(chunk), os.SEEK_CUR)
        return f.peek(1) != b"" if hasattr(f, "peek") else True
    return True


def _count_rest(f: Any) -> Tuple[int, bool]:
    """(lines from the current position to the end, whether anything is left)."""
    count = 0
    last = b""
    anything = False
    while True:
        chunk = f.read(1 << 20)
        if not chunk:
            break
        anything = True
        count += chunk.count(b"\n")
        last = chunk[-1:]
    if anything and last != b"\n":
        count += 1
    return count, anything


def _count_all(f: Any) -> int:
    f.seek(0)
    return _count_rest(f)[0]


# --- walking ------------------------------------------------------------------------------------
class Entry:
    __slots__ = ("rel", "name", "kind", "dir_fd", "size")

    def __init__(self, rel: str, name: str, kind: str, dir_fd: int, size: Optional[int]) -> None:
        self.rel, self.name, self.kind, self.dir_fd, self.size = rel, name, kind, dir_fd, size


def walk(
    top_fd: int,
    *,
    depth: int,
    gitignore: bool,
    hidden: bool,
    on_enter: Optional[Callable[[str], None]] = None,
) -> Iterator[Entry]:
    """Entries below an open directory, depth-first, sorted by name, links never followed.

    Each child directory is opened relative to its parent with O_NOFOLLOW, so a directory swapped
    for a link during the walk is not entered. ``.git`` is never listed.
    """
    seen = set()

    def visit(fd: int, rel: str, level: int, rules: ignore.IgnoreStack) -> Iterator[Entry]:
        info = os.fstat(fd)
        if (info.st_dev, info.st_ino) in seen:  # a bind-mount loop
            return
        seen.add((info.st_dev, info.st_ino))
        if on_enter is not None:
            on_enter(rel)
        if gitignore:
            rules = rules.push(rel, ignore.parse(_read_small(fd, ".gitignore")))
        try:
            children = sorted(os.scandir(fd), key=lambda e: e.name)
        except OSError:
            return
        for child in children:
            name = child.name
            if name == ".git" or (not hidden and name.startswith(".")):
                continue
            child_rel = f"{rel}/{name}" if rel else name
            try:
                if child.is_symlink():
                    kind, size = "symlink", None
                elif child.is_dir(follow_symlinks=False):
                    kind, size = "dir", None
                elif child.is_file(follow_symlinks=False):
                    kind, size = "file", child.stat(follow_symlinks=False).st_size
                else:
                    kind, size = "other", None
            except OSError:
                continue
            if gitignore and rules.ignored(child_rel, kind == "dir"):
                continue
            yield Entry(child_rel, name, kind, fd, size)
            if kind == "dir" and level < depth:
                try:
                    sub = os.open(name, DIR_FLAGS, dir_fd=fd)
                except OSError:
                    continue  # swapped for a link, removed, or unreadable
                try:
                    yield from visit(sub, child_rel, level + 1, rules)
                finally:
                    os.close(sub)

    yield from visit(top_fd, "", 1, ignore.IgnoreStack())


def _read_small(dir_fd: int, name: str, cap: int = 1 << 20) -> str:
    try:
        fd = os.open(name, FILE_FLAGS, dir_fd=dir_fd)
    except OSError:
        return ""
    with os.fdopen(fd, "rb") as f:
        if not st_mod.S_ISREG(os.fstat(f.fileno()).st_mode):
            return ""
        return f.read(cap).decode("utf-8", "replace")


def link_info(conf: Confinement, dir_fd: int, name: str, link_real: str) -> Optional[Dict[str, Any]]:
    """What may be said about a link inside the roots, learned without leaving them; None when the
    link could not be read (it changed meanwhile).

    Its text is read once, through its directory's descriptor, and that text is what is resolved,
    so the description always belongs to the text it was read from. A link whose resolution leaves
    the roots is ``{outside: true}`` and nothing more: not its text, nor whether or what it reaches.
    Otherwise: its text (``target``, the link's own content) with ``target_type`` + ``outside: false``,
    or ``broken``, or ``loop``.
    """
    try:
        text = os.readlink(name, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        found = conf.lookup(os.path.join(os.path.dirname(link_real), text)) if text else None
    except ProbeError as exc:
        if exc.code == "outside_allowed_roots":
            return {"outside": True}
        found = None
    out: Dict[str, Any] = {"target": text}
    if found is not None and found.state == "loop":
        out["loop"] = True
    elif found is None or found.state == "missing" or found.st is None:
        out["broken"] = True
    else:
        out["target_type"] = "dir" if st_mod.S_ISDIR(found.st.st_mode) else "file"
        out["outside"] = False
    return out


def op_read_tree(conf: Confinement, p: Params) -> Dict[str, Any]:
    path = p.str("path", ".")
    depth = p.int("depth", 3, 1, 50)
    max_entries = p.int("max_entries", 1000, 1, 20000)
    use_gitignore = p.bool("gitignore", True)
    fd, real = conf.open_dir(path)
    entries: List[Dict[str, Any]] = []
    truncated = False
    try:
        for entry in walk(fd, depth=depth, gitignore=use_gitignore, hidden=True):
            if len(entries) >= max_entries:
                truncated = True
                break
            item: Dict[str, Any] = {"path": entry.rel, "type": entry.kind}
            if entry.size is not None:
                item["size"] = entry.size
            if entry.kind == "symlink":
                item.update(
                    link_info(conf, entry.dir_fd, entry.name, os.path.join(real, entry.rel)) or {"broken": True}
                )
            entries.append(item)
    finally:
        os.close(fd)
    return {"path": real, "depth": depth, "entries": entries, "count": len(entries), "truncated": truncated}


# --- stat ---------------------------------------------------------------------------------------
def op_stat(conf: Confinement, p: Params) -> Dict[str, Any]:
    """The path's own lstat. A link is described only when it resolves inside the roots; one that
    leaves them is refused like any path that does (the addressing rule), exists or not."""
    path = p.str("path")
    real, info = conf.existing(path, follow=False)
    mode = info.st_mode
    kind = (
        "symlink"
        if st_mod.S_ISLNK(mode)
        else "dir"
        if st_mod.S_ISDIR(mode)
        else "file"
        if st_mod.S_ISREG(mode)
        else "other"
    )
    out: Dict[str, Any] = {
        "path": real,
        "type": kind,
        "size": info.st_size,
        "mode": oct(st_mod.S_IMODE(mode)),
        "mtime": info.st_mtime,
        "is_symlink": kind == "symlink",
    }
    if kind == "symlink":
        dir_fd = conf.open_beneath(os.path.dirname(real), DIR_FLAGS, path)
        try:
            link = link_info(conf, dir_fd, os.path.basename(real), real)
        finally:
            os.close(dir_fd)
        if link is None or link.get("outside") or len(os.fsencode(link["target"])) != info.st_size:
            raise outside()  # it leaves the roots, or it changed since its lstat: refused alike
        out.update(link)
    return out


# --- write --------------------------------------------------------------------------------------
def op_write(conf: Confinement, p: Params) -> Dict[str, Any]:
    path = p.str("path")
    content = p.str("content", None)
    diff = p.str("diff", None)
    if (content is None) == (diff is None):
        raise ProbeError("invalid_argument", "write: give exactly one of content or diff")
    parent, name = conf.parent_of(path)
    target = os.path.join(parent, name)
    inside = os.path.relpath(target, conf.root_of(target)).split(os.sep)
    if ".git" in inside:
        # Git's own config and hooks would run commands later; they are not the agent's to change.
        raise ProbeError("not_permitted", "the probe does not write inside .git directories")
    dir_fd, _ = conf.open_dir(parent)
    try:
        try:
            existing: Optional[os.stat_result] = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            existing = None
        if existing is not None:
            if st_mod.S_ISLNK(existing.st_mode):
                conf.lookup(target)  # a link that leaves the roots is refused as such, exists or not
                raise ProbeError("is_symlink", f"{path} is a symbolic link; write to the file it points to")
            if st_mod.S_ISDIR(existing.st_mode):
                raise ProbeError("is_a_directory", f"{path} is a directory")
            if not st_mod.S_ISREG(existing.st_mode):
                raise ProbeError("invalid_argument", f"{path} is not a regular file")
        if diff is not None:
            original = None
            if existing is not None:
                fd = os.open(name, FILE_FLAGS, dir_fd=dir_fd)
                with os.fdopen(fd, "rb") as f:
                    original = f.read(WRITE_MAX_BYTES + 1).decode("utf-8", "surrogateescape")
            content = udiff.apply(original, diff)
        data = content.encode("utf-8", "surrogateescape")
        if len(data) > WRITE_MAX_BYTES:
            raise ProbeError("too_large", f"write: more than {WRITE_MAX_BYTES} bytes")
        _replace(dir_fd, name, data, None if existing is None else st_mod.S_IMODE(existing.st_mode))
    finally:
        os.close(dir_fd)
    return {"path": target, "bytes": len(data), "created": existing is None, "sha256": hashlib.sha256(data).hexdigest()}


def _replace(dir_fd: int, name: str, data: bytes, mode: Optional[int]) -> None:
    """Write a temp file beside the target, fsync it, rename it over the target, fsync the directory."""
    temp = f".{name[:100]}.{secrets.token_hex(6)}.ai1net-tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o666, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(temp, dir_fd=dir_fd)
        except OSError:
            pass
        raise
    try:
        os.fsync(dir_fd)
    except OSError:
        pass  # some filesystems refuse fsync on directories
