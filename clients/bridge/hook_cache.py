"""The hook's modules copied out of the ``.pyz``, for the hook's interpreter to import as plain files.

Every hook call from a ``.pyz`` paid zipimport reading the archive's directory (some 140 entries) before its
first import: 0.5 ms of a 9-10 ms call on the bench machine. ``extract`` writes the archive's ``clients``
package, compiled, into ``<home>/hook-cache/<key>``, the key naming the archive as it is on disk (its inode,
modification time and size). The command ``hooks install`` writes (``hooks_install.PYZ_HOOK_ENTRY``)
imports from there when that folder exists and from the archive otherwise: an archive replaced since (a new
version) has a new key, and its hooks read the archive until ``hooks install`` or the bridge's start
(``refresh``) writes its copy. Only those two write here, a hook call only reads, and ``hooks install
--rollback`` of the last hooks removes the lot (``remove``).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Optional

CACHE_DIR = "hook-cache"
PACKAGE = "clients/"
KEEP_OLD_SEC = 86400  # a hook started from an older copy may still import from it (its waits last minutes)


def running_pyz() -> Optional[str]:
    """The .pyz this process runs from; None from a checkout."""
    argv0 = sys.argv[0] if sys.argv else ""
    if argv0.endswith(".pyz"):
        return argv0
    package_file = str(Path(__file__).resolve())
    return package_file.split(".pyz", 1)[0] + ".pyz" if ".pyz" in package_file else None


def refresh(home: Path) -> Optional[Path]:
    """At the bridge's start: the copy of the archive it runs from, when ``hooks install`` made a cache
    here (its hooks look for the copy; after an update they read the archive until this writes it)."""
    pyz, cache = running_pyz(), cache_dir(home)
    if pyz is None or not cache.is_dir():
        return None
    return extract(Path(pyz), cache)


def remove(home: Path) -> None:
    """The copies, when no hooks are installed any more (``hooks install --rollback``): the bridge's start
    then writes none either."""
    import shutil

    shutil.rmtree(cache_dir(home), ignore_errors=True)


def cache_dir(home: Path) -> Path:
    return Path(home).expanduser().resolve() / CACHE_DIR


def key(pyz: Path) -> str:
    """The folder's name for the archive as it is on disk: what ``hooks_install.PYZ_HOOK_ENTRY``
    computes on each hook call (keep the two the same)."""
    stat = os.stat(pyz)
    return "%x-%x-%x" % (stat.st_ino, stat.st_mtime_ns, stat.st_size)


def extract(pyz: Path, cache: Path) -> Optional[Path]:
    """The archive's copy for hooks, written when missing (atomically: a folder renamed into place);
    None when it cannot be written (a read-only home: hooks then read the archive, as before)."""
    try:
        name = key(pyz)
        target = cache / name
        if target.is_dir():
            return target
    except OSError:
        return None
    # Only to write a copy (zipfile, py_compile and tempfile took 7 ms to import): the bridge's every start
    # asks, and mostly finds its copy there.
    import py_compile
    import shutil
    import tempfile
    import zipfile

    try:
        cache.mkdir(mode=0o700, parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=".stage-", dir=cache))
    except OSError:
        return None
    try:
        with zipfile.ZipFile(pyz) as archive:
            for info in archive.infolist():
                member = info.filename
                if not member.startswith(PACKAGE) or not member.endswith(".py") or ".." in member.split("/"):
                    continue
                dest = stage / member
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(archive.read(info))
                # Unchecked: the source is never compared (nothing edits these files; a new archive is a new key).
                py_compile.compile(str(dest), doraise=True,
                                   invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
        if key(pyz) != name:
            return None  # replaced while it was read: the next start writes the new one's
        os.rename(stage, target)
    except OSError:
        if not target.is_dir():  # else another process renamed the same files into place first
            return None
    except (zipfile.BadZipFile, py_compile.PyCompileError):
        return None
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    _prune(cache, keep=name)
    return target


def _prune(cache: Path, keep: str) -> None:
    """Copies of other archives, a day after they were written, and stages left by a crash."""
    import shutil

    now = time.time()
    try:
        entries = list(cache.iterdir())
    except OSError:
        return
    for entry in entries:
        if entry.name == keep:
            continue
        try:
            if now - entry.stat().st_mtime > KEEP_OLD_SEC:
                shutil.rmtree(entry, ignore_errors=True)
        except OSError:
            continue
