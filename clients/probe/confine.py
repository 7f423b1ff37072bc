"""The probe's allow-list: every path an operation touches is resolved and checked here.

Rules (each one answers a known bypass of path checks):
- a path is resolved with its symlinks (``realpath``) and must then lie inside a resolved root, by
  path components, not string prefix: ``/a/proj`` does not allow ``/a/proj2``;
- relative paths are taken from the first root; NUL bytes and empty paths are refused;
- a file is opened with ``O_NOFOLLOW`` and what was opened is checked again (the kernel's path for
  the descriptor, and device + inode against a fresh resolve), so a file swapped for a link between
  the check and the open is refused;
- a write never goes through a symlink: the parent directory is resolved and checked, the final
  component must not be a link, and the file is replaced by a rename inside the checked directory;
- directory walks never follow links: they open each child relative to its parent's descriptor with
  ``O_NOFOLLOW``.
A refusal raises ``ProbeError("outside_allowed_roots")`` and says nothing about what lies outside.
POSIX only (Linux, macOS): the walks rely on ``dir_fd``.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from typing import Iterable, List, Optional, Tuple

from .errors import ProbeError

O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # a FIFO must not hang a read
FILE_FLAGS = os.O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK
DIR_FLAGS = os.O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC
# errno values an O_NOFOLLOW open returns when the final component is a link
LINK_ERRNOS = {errno.ELOOP, getattr(errno, "EMLINK", -1), getattr(errno, "EFTYPE", -1)}


def _after_resolve(real: str) -> None:
    """Runs between the check and the open. A seam for tests that swap a file for a link here."""


def contains(root: str, real: str) -> bool:
    try:
        return os.path.commonpath([root, real]) == root
    except ValueError:  # different drives, or a mix of absolute and relative
        return False


def fd_path(fd: int) -> Optional[str]:
    """The path the kernel holds for an open descriptor, where the platform tells it."""
    if sys.platform.startswith("linux"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
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


class Confinement:
    def __init__(self, roots: Iterable[str]) -> None:
        resolved: List[str] = []
        for root in roots:
            if not isinstance(root, str) or not root or "\0" in root:
                raise ValueError(f"not a usable directory: {root!r}")
            real = os.path.realpath(os.path.abspath(os.path.expanduser(root)))
            if not os.path.isdir(real):
                raise ValueError(f"not a directory: {root}")
            if real not in resolved:
                resolved.append(real)
        if not resolved:
            raise ValueError("at least one allowed directory is needed")
        self.roots = resolved

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

    def resolve(self, path: object) -> str:
        """The real path of an existing file or directory inside the roots (for reading)."""
        real = os.path.realpath(self.absolute(path))
        if not self.is_inside(real):
            raise self._outside()
        try:
            os.stat(real)
        except FileNotFoundError:
            raise ProbeError("not_found", f"no such file or directory: {path}") from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise ProbeError("not_found", f"symbolic link loop: {path}") from None
            raise ProbeError("io_error", f"{path}: {exc.strerror}") from None
        return real

    def resolve_parent(self, path: object) -> Tuple[str, str]:
        """(real parent directory, final name) without following the final component."""
        absolute = self.absolute(path).rstrip("/") or "/"
        parent, name = os.path.split(absolute)
        if name in ("", ".", ".."):
            raise ProbeError("invalid_argument", f"path must name a file: {path}")
        parent_real = os.path.realpath(parent)
        # The target, not the parent, must be inside: the parent of a root lies outside it.
        if not self.is_inside(os.path.join(parent_real, name)):
            raise self._outside()
        if not os.path.isdir(parent_real):
            raise ProbeError("not_found", f"no such directory: {parent}")
        return parent_real, name

    def resolve_for_write(self, path: object) -> Tuple[str, str]:
        """(real parent, name) for a file to create or replace; never through a symlink."""
        parent_real, name = self.resolve_parent(path)
        target = os.path.join(parent_real, name)
        if os.path.islink(target):
            if not self.is_inside(os.path.realpath(target)):
                raise self._outside()
            raise ProbeError("is_symlink", f"{path} is a symbolic link; write to the file it points to")
        return parent_real, name

    # --- opening ------------------------------------------------------------------------------
    def open_file(self, path: object) -> Tuple[int, str, os.stat_result]:
        """Open an existing regular file for reading: (fd, real path, fstat). The caller closes fd."""
        real = self.resolve(path)
        _after_resolve(real)
        try:
            fd = os.open(real, FILE_FLAGS)
        except OSError as exc:
            raise self._open_error(exc, path) from None
        try:
            st = self.verify(fd, path)
            if stat.S_ISDIR(st.st_mode):
                raise ProbeError("is_a_directory", f"{path} is a directory")
            if not stat.S_ISREG(st.st_mode):
                raise ProbeError("invalid_argument", f"{path} is not a regular file")
        except BaseException:
            os.close(fd)
            raise
        return fd, real, st

    def open_dir(self, path: object) -> Tuple[int, str]:
        real = self.resolve(path)
        _after_resolve(real)
        try:
            fd = os.open(real, DIR_FLAGS)
        except OSError as exc:
            if exc.errno == errno.ENOTDIR and os.path.islink(real):
                # Linux reports a link met by O_DIRECTORY|O_NOFOLLOW as "not a directory".
                raise self._outside("it was replaced by a symbolic link") from None
            if exc.errno == errno.ENOTDIR:
                raise ProbeError("not_a_directory", f"{path} is not a directory") from None
            raise self._open_error(exc, path) from None
        try:
            self.verify(fd, path)
        except BaseException:
            os.close(fd)
            raise
        return fd, real

    def verify(self, fd: int, path: object) -> os.stat_result:
        """Check again, after opening, that the descriptor is the file the path names inside the roots."""
        opened = fd_path(fd)
        if opened is not None and not self.is_inside(opened):
            raise self._outside("it changed while it was being opened")
        fresh = os.path.realpath(self.absolute(path))
        if not self.is_inside(fresh):
            raise self._outside("it changed while it was being opened")
        st = os.fstat(fd)
        try:
            now = os.stat(fresh)
        except OSError:
            raise self._outside("it changed while it was being opened") from None
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            raise self._outside("it changed while it was being opened")
        return st

    def _open_error(self, exc: OSError, path: object) -> ProbeError:
        if exc.errno in LINK_ERRNOS:
            # The checked file became a symbolic link before the open: treat it as an escape.
            return self._outside("it was replaced by a symbolic link")
        if exc.errno == errno.ENOENT:
            return ProbeError("not_found", f"no such file or directory: {path}")
        if exc.errno in (errno.EACCES, errno.EPERM):
            return ProbeError("not_permitted", f"{path}: permission denied by the operating system")
        return ProbeError("io_error", f"{path}: {exc.strerror}")

    @staticmethod
    def _outside(why: str = "") -> ProbeError:
        detail = "the path is outside the allowed directories"
        return ProbeError("outside_allowed_roots", f"{detail} ({why})" if why else detail)
