"""Builds each client into one self-contained `.pyz` (zipapp) carrying its pure-Python dependencies."""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import py_compile
import shutil
import stat
import tempfile
import zipapp
import zipfile
from collections.abc import Iterable
from pathlib import Path

CLIENTS = {"ai1net-bridge": "clients.bridge", "ai1net-probe": "clients.probe"}
# Pure-Python dependencies carried inside each .pyz: websockets falls back to Python where its
# C speedups are absent; qrcode draws the pairing QR in the terminal (PNG/PIL backends unused).
VENDORED = ["websockets", "qrcode"]
VENDOR_IGNORE = shutil.ignore_patterns("__pycache__", "*.so", "*.pyc", "tests")
# ... but for websockets' C masking as built for this interpreter (its full tag in the name), which
# clients/masking.py loads from the archive where the interpreter running it has the same tag.
NATIVE = {"websockets": "speedups"}
ROOT = Path(__file__).resolve().parent
INTERPRETER = "/usr/bin/env python3"
# What runs on every hook event (the command hooks_install.pyz_launcher writes): shipped compiled as well.
HOT_MODULES = {"ai1net-bridge": ("clients.__init__", "clients.bridge.__init__", "clients.bridge.__main__",
                                 "clients.bridge.hook", "clients.bridge.permission_hook")}


def build(out_dir: Path, names: Iterable[str] | None = None) -> list[Path]:
    """Each client's ``.pyz`` in ``out_dir`` (only those in ``names``, when given)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    built = []
    for name, module in CLIENTS.items():
        if (names is not None and name not in names) or not _has_entry_point(module):
            continue  # that client is not written yet
        with tempfile.TemporaryDirectory() as tmp:
            stage = Path(tmp)
            shutil.copytree(ROOT, stage / "clients", ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "build.py"))
            for dep in VENDORED:
                spec = importlib.util.find_spec(dep)
                assert spec and spec.origin, dep
                shutil.copytree(Path(spec.origin).parent, stage / dep, ignore=VENDOR_IGNORE)
                _carry_native(Path(spec.origin).parent, stage / dep, NATIVE.get(dep))
            stored = _precompile(stage, HOT_MODULES.get(name, ()))
            target = out_dir / f"{name}.pyz"
            _archive(stage, target, f"{module}.__main__:main", stored)
            built.append(target)
    return built


def _carry_native(source: Path, target: Path, module: str | None) -> None:
    """The C extension ``module`` of a vendored package as this interpreter loads it, when it has one."""
    if module is None:
        return
    name = module + importlib.machinery.EXTENSION_SUFFIXES[0]
    if (source / name).is_file():
        shutil.copyfile(source / name, target / name)


def _precompile(stage: Path, modules: tuple[str, ...]) -> set[str]:
    """Bytecode beside the source for the modules that run on every call (zipimport reads ``x.pyc``
    before ``x.py``; unchecked-hash, so no source timestamp is compared). Another Python version sees
    a foreign magic number and compiles the source, as without them. Returns the bytecode files' names
    in the archive."""
    written = set()
    for module in modules:
        source = stage / (module.replace(".", "/") + ".py")
        compiled = source.with_suffix(".pyc")
        py_compile.compile(str(source), cfile=str(compiled), doraise=True,
                           invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
        written.add(compiled.relative_to(stage).as_posix())
    return written


def _archive(stage: Path, target: Path, main: str, stored: set[str]) -> None:
    """What ``zipapp.create_archive(stage, target, interpreter=INTERPRETER, main=main, compressed=True)``
    writes, but for the files named in ``stored``, kept uncompressed: a hook call reads only those, so it
    neither imports zlib nor inflates (0.7 ms of the 3.7 a hook call took beyond a bare interpreter)."""
    module, function = main.split(":")
    (stage / "__main__.py").write_text(zipapp.MAIN_TEMPLATE.format(module=module, fn=function), encoding="utf-8")
    with target.open("wb") as fd:
        fd.write(f"#!{INTERPRETER}\n".encode())
        with zipfile.ZipFile(fd, "w") as archive:
            for path in sorted(stage.rglob("*")):
                name = path.relative_to(stage).as_posix()
                archive.write(path, name, zipfile.ZIP_STORED if name in stored else zipfile.ZIP_DEFLATED)
    target.chmod(target.stat().st_mode | stat.S_IEXEC)


def _has_entry_point(module: str) -> bool:
    try:
        return importlib.util.find_spec(f"{module}.__main__") is not None
    except ModuleNotFoundError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("static/downloads"))
    args = parser.parse_args()
    for path in build(args.out):
        print(f"built {path}")


if __name__ == "__main__":
    main()
