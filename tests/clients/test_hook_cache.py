"""The hook's copy of a .pyz's modules (clients/bridge/hook_cache.py): named after the archive as it is on disk,
written whole or not at all, older copies kept a day."""

from __future__ import annotations

import os
import time
import zipfile

from clients.bridge import hook_cache


def archive(path, members):
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in members.items():
            zf.writestr(name, text)
    return path


def test_the_copy_holds_the_clients_package_compiled_and_nothing_else(tmp_path):
    pyz = archive(tmp_path / "b.pyz", {"clients/__init__.py": "", "clients/bridge/hook.py": "X = 1\n",
                                       "clients/bridge/hook.pyc": b"stale", "websockets/__init__.py": "",
                                       "clients/../evil.py": "", "__main__.py": ""})
    cache = tmp_path / "home" / "hook-cache"
    copy = hook_cache.extract(pyz, cache)
    assert copy == cache / hook_cache.key(pyz)
    files = sorted(p.relative_to(copy).as_posix() for p in copy.rglob("*") if p.is_file())
    assert [f for f in files if "__pycache__" not in f] == ["clients/__init__.py", "clients/bridge/hook.py"]
    assert any(f.startswith("clients/bridge/__pycache__/hook.") for f in files)
    assert not (tmp_path / "home" / "evil.py").exists() and not (cache / "evil.py").exists()
    assert oct(cache.stat().st_mode & 0o777) == oct(0o700)
    assert hook_cache.extract(pyz, cache) == copy  # there already: nothing written again


def test_a_replaced_archive_gets_its_own_copy_and_old_ones_go_a_day_later(tmp_path):
    pyz = archive(tmp_path / "b.pyz", {"clients/__init__.py": "V = 1\n"})
    cache = tmp_path / "hook-cache"
    first = hook_cache.extract(pyz, cache)
    archive(tmp_path / "new.pyz", {"clients/__init__.py": "V = 2\n"}).replace(pyz)
    second = hook_cache.extract(pyz, cache)
    assert second != first and first.is_dir()  # a hook started from the first may still import from it
    assert (second / "clients" / "__init__.py").read_text() == "V = 2\n"
    day_old = time.time() - hook_cache.KEEP_OLD_SEC - 60
    os.utime(first, (day_old, day_old))
    (cache / ".stage-crashed").mkdir()
    os.utime(cache / ".stage-crashed", (day_old, day_old))
    archive(tmp_path / "newer.pyz", {"clients/__init__.py": "V = 3\n"}).replace(pyz)
    third = hook_cache.extract(pyz, cache)
    assert sorted(p.name for p in cache.iterdir()) == sorted([second.name, third.name])


def test_what_cannot_be_copied_leaves_nothing_behind(tmp_path):
    bad = tmp_path / "bad.pyz"
    bad.write_bytes(b"not a zip")
    cache = tmp_path / "hook-cache"
    assert hook_cache.extract(bad, cache) is None
    assert list(cache.iterdir()) == []
    assert hook_cache.extract(tmp_path / "missing.pyz", cache) is None
    broken = archive(tmp_path / "broken.pyz", {"clients/__init__.py": "def (:\n"})
    assert hook_cache.extract(broken, cache) is None and list(cache.iterdir()) == []
    # A home where the cache cannot be made (here a file in its way, which stops root as well as a read-only
    # folder stops a user): no copy, and the hooks read the archive.
    blocked = tmp_path / "blocked"
    blocked.write_text("")
    assert hook_cache.extract(archive(tmp_path / "ok.pyz", {"clients/__init__.py": ""}), blocked / "c") is None
    assert blocked.read_text() == ""


def test_refresh_writes_only_where_hooks_made_a_cache(tmp_path, monkeypatch):
    pyz = archive(tmp_path / "b.pyz", {"clients/__init__.py": ""})
    monkeypatch.setattr(hook_cache, "running_pyz", lambda: str(pyz))
    home = tmp_path / "home"
    home.mkdir()
    assert hook_cache.refresh(home) is None and not (home / "hook-cache").exists()
    (home / "hook-cache").mkdir()
    assert hook_cache.refresh(home) == home / "hook-cache" / hook_cache.key(pyz)
    monkeypatch.setattr(hook_cache, "running_pyz", lambda: None)  # a checkout: nothing to copy
    assert hook_cache.refresh(home) is None
