"""Builds each client into one self-contained `.pyz` (zipapp) carrying its pure-Python dependencies."""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import py_compile
import shutil
import tempfile
import zipapp
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
            _precompile(stage, HOT_MODULES.get(name, ()))
            target = out_dir / f"{name}.pyz"
            zipapp.create_archive(
                stage, target, interpreter="/usr/bin/env python3", main=f"{module}.__main__:main", compressed=True
            )
            built.append(target)
    return built


def _carry_native(source: Path, target: Path, module: str | None) -> None:
    """The C extension ``module`` of a vendored package as this interpreter loads it, when it has one."""
    if module is None:
        return
    name = module + importlib.machinery.EXTENSION_SUFFIXES[0]
    if (source / name).is_file():
        shutil.copyfile(source / name, target / name)


def _precompile(stage: Path, modules: tuple[str, ...]) -> None:
    """Bytecode beside the source for the modules that run on every call (zipimport reads ``x.pyc``
    before ``x.py``; unchecked-hash, so no source timestamp is compared). Another Python version sees
    a foreign magic number and compiles the source, as without them."""
    for module in modules:
        source = stage / (module.replace(".", "/") + ".py")
        py_compile.compile(str(source), cfile=str(source.with_suffix(".pyc")), doraise=True,
                           invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)


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
