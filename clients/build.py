"""Builds each client into one self-contained `.pyz` (zipapp) carrying its pure-Python dependencies."""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import tempfile
import zipapp
from pathlib import Path

CLIENTS = {"ai1net-bridge": "clients.bridge", "ai1net-probe": "clients.probe"}
VENDORED = ["websockets"]  # pure-Python fallback is used where its C speedups are absent
ROOT = Path(__file__).resolve().parent


def build(out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    built = []
    for name, module in CLIENTS.items():
        if importlib.util.find_spec(module) is None:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            stage = Path(tmp)
            shutil.copytree(ROOT, stage / "clients", ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "build.py"))
            for dep in VENDORED:
                spec = importlib.util.find_spec(dep)
                assert spec and spec.origin, dep
                shutil.copytree(
                    Path(spec.origin).parent, stage / dep, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyc")
                )
            target = out_dir / f"{name}.pyz"
            zipapp.create_archive(stage, target, interpreter="/usr/bin/env python3", main=f"{module}.__main__:main")
            built.append(target)
    return built


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("static/downloads"))
    args = parser.parse_args()
    for path in build(args.out):
        print(f"built {path}")


if __name__ == "__main__":
    main()
