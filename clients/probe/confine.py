"""The probe's allow-list: every path an operation touches is resolved and checked here.

The rule (README, "Probes for agents"): the probe never looks at anything outside the allowed roots,
so nothing it answers can depend on what lies there.

- A path is resolved here, one component at a time, never by ``realpath`` or the kernel. Each
  component is examined with ``lstat`` relative to a descriptor of its parent, a directory already
  checked to lie inside a root; a symbolic link is followed by reading its text and going on from
  there. When the next step would examine a path outside the roots, resolution stops and the path
  is refused before anything there is touched: a link to an outside file that exists, to one that
  is missing, a chain that leaves, a loop through an outside path all get the same
  ``outside_allowed_roots`` with the same message.
- Steps through the roots' own ancestors (``/``, ``/home`` … on the way to a root) and through the
  names the owner gave as roots (``--allow ~/proj-link``) are taken by name, without looking.
- Inside is by path components, not string prefix: ``/a/proj`` does not allow ``/a/proj2``. Relative
  paths are taken from the first root; NUL bytes and empty paths are refused.
- Opening never lets the kernel follow a link either: a file or directory is opened from its root's
  descriptor one component at a time with ``O_NOFOLLOW``, the root's device and inode must be the
  ones seen at start, and the kernel's own path for the result is checked again where it tells it.
  A component that became a link after the check is refused like any link that leaves.
- Directory walks open each child relative to its parent's descriptor with ``O_NOFOLLOW``.
- A child process (git, rg, run) starts in a directory opened this way: on Linux it changes into it
  through the descriptor (``/proc/self/fd/N``), so a swap after the check cannot move it.
POSIX only (Linux, macOS): the walks rely on ``dir_fd``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
from typing import Dict, Iterable, Iterator, List, Optional, Tuple

from .errors import ProbeError

O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # a FIFO must not hang a read
FILE_FLAGS = os.O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK
DIR_FLAGS = os.O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC
# errno values an O_NOFOLLOW open returns when the final component is a link
LINK_ERRNOS = {errno.ELOOP, getattr(errno, "EMLINK", -1), getattr(errno, "EFTYPE", -1)}
MAX_LINKS = 40  # links followed in one resolution before it counts as a loop (Linux's own limit)
OUTSIDE = "the path is outside the allowed directories"  # the one message of every such refusal
PROC_FD = "/proc/self/fd"


def _after_resolve(real: str) -> None:
    """Runs between the check and the open. A seam for tests that swap a file for a link here."""


def _on_step(path: str) -> None:
    """Runs before each component of a resolution is examined. A seam for tests, like the one above."""


def contains(root: str, real: str) -> bool:
    try:
        return os.path.commonpath([root, real]) == root
    except ValueError:  # different drives, or a mix of absolute and relative
        return False


def fd_path(fd: int) -> Optional[str]:
    """The path the kernel holds for an open descriptor, where the platform tells it."""
    if sys.platform.startswith("linux"):
        try:
            target = os.readlink(f"{PROC_FD}/{fd}")
        except OSError:
            return None
        return target if target.startswith("/") and not target.endswith(" (deleted)") else None
    if sys.platform == "darwin":
        import fcntl

        get_path = getattr(fcntl, "F_GETPATH", None)
        if get_path is None:
            return None
        try:
            raw = fcntl.fcntl(fd, get_path, b"\0" * 1024)
        except OSError:
            return None
        return raw.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
    return None


class Found:
    """A resolved path: ``state`` is ``ok`` (``st`` is the lstat of its last component), ``missing``
    (some component does not exist; ``real`` is then partly lexical) or ``loop``."""

    __slots__ = ("real", "st", "state")

    def __init__(self, real: str, st: Optional[os.stat_result], state: str) -> None:
        self.real, self.st, self.state = real, st, state


class Confinement:
    def __init__(self, roots: Iterable[str]) -> None:
        resolved: List[str] = []
        aliases: Dict[str, str] = {}
        for root in roots:
            if not isinstance(root, str) or not root or "\0" in root:
                raise ValueError(f"not a usable directory: {root!r}")
            given = os.path.normpath(os.path.abspath(os.path.expanduser(root)))
            real = os.path.realpath(given)
            if not os.path.isdir(real):
                raise ValueError(f"not a directory: {root}")
            if real not in resolved:
                resolved.append(real)
            if given != real:
                aliases[given] = real
        if not resolved:
            raise ValueError("at least one allowed directory is needed")
        self.roots = resolved
        self.aliases = aliases
        self._identity = {root: _identity(os.stat(root)) for root in resolved}
        self._above = set()
        for path in resolved + list(aliases):
            while path != os.path.dirname(path):
                path = os.path.dirname(path)
                self._above.add(path)

    # --- checks -------------------------------------------------------------------------------
    def is_inside(self, real: str) -> bool:
        return any(contains(root, real) for root in self.roots)

    def root_of(self, real: str) -> str:
        for root in self.roots:
            if contains(root, real):
                return root
        raise self._outside()

    def absolute(self, path: object) -> str:
        if not isinstance(path, str) or not path:
            raise ProbeError("invalid_argument", "path must be a non-empty string")
        if "\0" in path:
            raise ProbeError("invalid_argument", "path must not contain NUL bytes")
        # "~" is not expanded: the home directory is not a root unless it was allowed.
        return path if os.path.isabs(path) else os.path.join(self.roots[0], path)

    # --- resolving ----------------------------------------------------------------------------
    def lookup(self, path: object, *, follow: bool = True) -> Found:
        """Resolve ``path`` without looking at anything outside the roots (see the module's rules).

        ``follow=False`` leaves a link in the last component unfollowed (``st`` is then the link's
        own lstat). Raises ``outside_allowed_roots`` when the resolution leaves the roots.
        """
        absolute = self.absolute(path)
        if absolute.endswith("/") or absolute.rsplit("/", 1)[-1] in (".", ".."):
            follow = True  # "link/" and "link/." name what the link points to
        pending = [part for part in reversed(absolute.split("/")) if part not in ("", ".")]
        current, missing, links = "/", False, 0
        last: Optional[os.stat_result] = None
        fd = self._enter(None, current, path)
        try:
            while pending:
                name = pending.pop()
                last = None
                if name == "..":
                    current = os.path.dirname(current)
                    fd = None if missing else self._enter(fd, current, path)
                    continue
                candidate = os.path.join(current, name)
                if not missing and candidate in self.aliases:
                    current = self.aliases[candidate]  # a root, by the name its owner gave it
                    fd = self._enter(fd, current, path)
                    continue
                if missing:
                    current = candidate
                    continue
                if fd is None:  # above the roots: only their ancestors, and the roots, are stepped on
                    if self.is_inside(candidate):
                        current = candidate
                        fd = self._enter(fd, current, path)
                    elif candidate in self._above:
                        current = candidate
                    else:
                        raise self._outside()
                    continue
                _on_step(candidate)
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    current, missing, fd = candidate, True, _close(fd)
                    continue
                except OSError as exc:
                    raise self._os_error(exc, path) from None
                if stat.S_ISLNK(st.st_mode) and (follow or pending):
                    links += 1
                    if links > MAX_LINKS:
                        return Found(candidate, None, "loop")
                    try:
                        target = os.readlink(name, dir_fd=fd)
                    except OSError as exc:  # it changed since the lstat: look again
                        if exc.errno == errno.ENOENT:
                            current, missing, fd = candidate, True, _close(fd)
                        elif exc.errno == errno.EINVAL:
                            pending.append(name)
                        else:
                            raise self._os_error(exc, path) from None
                        continue
                    pending.extend(part for part in reversed(target.split("/")) if part not in ("", "."))
                    if target.startswith("/"):
                        current = "/"
                        fd = self._enter(fd, current, path)
                    elif not target:
                        current, missing, fd = candidate, True, _close(fd)
                    continue
                current = candidate
                if not pending:
                    last = st
                elif stat.S_ISDIR(st.st_mode):
                    fd = self._descend(fd, name, st, path)
                else:  # "file/more": no such path
                    missing, fd = True, _close(fd)
            if not self.is_inside(current):
                raise self._outside()
            if missing:
                return Found(current, None, "missing")
            if last is None:  # ended on a directory that is open: a root, or reached by ".."
                assert fd is not None
                last = os.fstat(fd)
            return Found(current, last, "ok")
        finally:
            _close(fd)

    def resolve(self, path: object) -> str:
        """The real path of an existing file or directory inside the roots."""
        return self.existing(path)[0]

    def existing(self, path: object, *, follow: bool = True) -> Tuple[str, os.stat_result]:
        """(real path, lstat of its last component) of an existing path; not_found otherwise."""
        found = self.lookup(path, follow=follow)
        if found.state == "missing":
            raise ProbeError("not_found", f"no such file or directory: {path}")
        if found.state == "loop":
            raise ProbeError("not_found", f"symbolic link loop: {path}")
        assert found.st is not None
        return found.real, found.st

    def parent_of(self, path: object) -> Tuple[str, str]:
        """(real parent directory, final name) of a file to create or replace; the name is not followed."""
        absolute = self.absolute(path).rstrip("/") or "/"
        parent, name = os.path.split(absolute)
        if name in ("", ".", ".."):
            raise ProbeError("invalid_argument", f"path must name a file: {path}")
        found = self.lookup(parent)
        if found.state != "ok" or found.st is None or not stat.S_ISDIR(found.st.st_mode):
            raise ProbeError("not_found", f"no such directory: {parent}")
        if not self.is_inside(os.path.join(found.real, name)):
            raise self._outside()
        return found.real, name

    # --- opening ------------------------------------------------------------------------------
    def open_file(self, path: object) -> Tuple[int, str, os.stat_result]:
        """Open an existing regular file for reading: (fd, real path, fstat). The caller closes fd."""
        real, _ = self.existing(path)
        _after_resolve(real)
        fd = self.open_beneath(real, FILE_FLAGS, path)
        try:
            st = self._opened(fd)
            if stat.S_ISDIR(st.st_mode):
                raise ProbeError("is_a_directory", f"{path} is a directory")
            if not stat.S_ISREG(st.st_mode):
                raise ProbeError("invalid_argument", f"{path} is not a regular file")
        except BaseException:
            os.close(fd)
            raise
        return fd, real, st

    def open_dir(self, path: object) -> Tuple[int, str]:
        """Open an existing directory: (fd, real path). The caller closes fd."""
        real, st = self.existing(path)
        if not stat.S_ISDIR(st.st_mode):
            raise ProbeError("not_a_directory", f"{path} is not a directory")
        _after_resolve(real)
        fd = self.open_beneath(real, DIR_FLAGS, path)
        try:
            self._opened(fd)
        except BaseException:
            os.close(fd)
            raise
        return fd, real

    def open_beneath(self, real: str, flags: int, shown: object = None) -> int:
        """Open ``real`` (a resolved path inside a root) from its root's descriptor, never through a link."""
        shown = real if shown is None else shown
        root = max((r for r in self.roots if contains(r, real)), key=len, default=None)
        if root is None:
            raise self._outside()
        parts = [] if real == root else os.path.relpath(real, root).split(os.sep)
        try:
            fd = os.open(root, DIR_FLAGS)
        except OSError as exc:
            raise self._open_error(exc, -1, "", False, shown) from None
        if _identity(os.fstat(fd)) != self._identity[root]:
            os.close(fd)
            raise self._outside()  # the root itself was moved, or a directory above it swapped
        for index, part in enumerate(parts):
            final = index == len(parts) - 1
            try:
                child = os.open(part, flags if final else DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                error = self._open_error(exc, fd, part, final and flags == DIR_FLAGS, shown)
                os.close(fd)
                raise error from None
            os.close(fd)
            fd = child
        return fd

    @contextlib.contextmanager
    def child_cwd(self, path: object) -> Iterator[Tuple[str, str, Tuple[int, ...]]]:
        """(real path, cwd to give a child process, descriptors it must inherit) of a directory.

        Where ``/proc/self/fd`` exists the child changes into the opened directory through its own
        copy of the descriptor, so a swap after the check cannot send it elsewhere; elsewhere it is
        the checked real path, opened and checked just before.
        """
        fd, real = self.open_dir(path)
        try:
            if os.path.isdir(PROC_FD):
                yield real, f"{PROC_FD}/{fd}", (fd,)
            else:  # pragma: no cover - macOS
                yield real, real, ()
        finally:
            os.close(fd)

    # --- internals ----------------------------------------------------------------------------
    def _enter(self, fd: Optional[int], path: str, shown: object) -> Optional[int]:
        """Move a resolution's descriptor to ``path``: open it if inside a root, else hold none."""
        opened = self.open_beneath(path, DIR_FLAGS, shown) if self.is_inside(path) else None
        _close(fd)  # only now: on a failure above, the caller still owns (and closes) fd
        return opened

    def _descend(self, fd: int, name: str, seen: os.stat_result, shown: object) -> int:
        try:
            child = os.open(name, DIR_FLAGS, dir_fd=fd)
        except OSError as exc:
            raise self._open_error(exc, fd, name, False, shown) from None
        if _identity(os.fstat(child)) != _identity(seen):
            os.close(child)
            raise self._outside()  # swapped between the look and the open
        os.close(fd)
        return child

    def _opened(self, fd: int) -> os.stat_result:
        """Belt and braces: the kernel's own path for what was opened must lie inside too."""
        opened = fd_path(fd)
        if opened is not None and not self.is_inside(opened):
            raise self._outside()
        return os.fstat(fd)

    def _open_error(self, exc: OSError, dir_fd: int, name: str, want_dir: bool, shown: object) -> ProbeError:
        if exc.errno in LINK_ERRNOS:
            return self._outside()  # it became a link after the check: treated as one that leaves
        if exc.errno == errno.ENOTDIR:
            if dir_fd >= 0:
                try:
                    now: Optional[int] = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
                except OSError:
                    now = None
                # Linux reports a link met by O_DIRECTORY|O_NOFOLLOW as "not a directory". An entry that is
                # gone or a directory again by now was swapped meanwhile, maybe for such a link: refused
                # like one, so the answer never depends on where the swapped-in link pointed.
                if now is None or stat.S_ISLNK(now) or stat.S_ISDIR(now):
                    return self._outside()
            if want_dir:
                return ProbeError("not_a_directory", f"{shown} is not a directory")
            return ProbeError("not_found", f"no such file or directory: {shown}")
        return self._os_error(exc, shown)

    @staticmethod
    def _os_error(exc: OSError, shown: object) -> ProbeError:
        if exc.errno == errno.ENOENT:
            return ProbeError("not_found", f"no such file or directory: {shown}")
        if exc.errno in (errno.EACCES, errno.EPERM):
            return ProbeError("not_permitted", f"{shown}: permission denied by the operating system")
        return ProbeError("io_error", f"{shown}: {exc.strerror}")

    @staticmethod
    def _outside() -> ProbeError:
        return outside()


def outside() -> ProbeError:
    """The refusal of every path that leaves the roots: one code, one message, whatever lies there."""
    return ProbeError("outside_allowed_roots", OUTSIDE)


def _identity(st: os.stat_result) -> Tuple[int, int]:
    return st.st_dev, st.st_ino


def _close(fd: Optional[int]) -> None:
    if fd is not None:
        os.close(fd)
