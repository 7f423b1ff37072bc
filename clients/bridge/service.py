"""``ai1net-bridge service install|uninstall|status``: run the daemon at login with the same ``--home``.

Linux: a systemd user unit (``~/.config/systemd/user/ai1net-bridge-<id>.service``), enabled with
``systemctl --user enable --now`` when a user manager is reachable. macOS: a launchd agent
(``~/Library/LaunchAgents/net.ai1net.bridge.<id>.plist``), loaded with ``launchctl``. ``<id>`` is
derived from the home folder, so two homes get two services. What was installed is recorded in
``<home>/service.json``; ``uninstall`` removes exactly that.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import plistlib
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

RECORD_FILE = "service.json"
SYSTEMD_DIR = Path("~/.config/systemd/user")
LAUNCHD_DIR = Path("~/Library/LaunchAgents")


def register(subparsers: argparse._SubParsersAction) -> None:
    from clients.bridge.cli import add_home_argument

    service = subparsers.add_parser("service", help="run the bridge at login (systemd user unit / launchd agent)")
    actions = service.add_subparsers(dest="service_command", metavar="ACTION")
    for name, text in (("install", "write and enable the login service"),
                       ("uninstall", "stop and remove exactly what install wrote"),
                       ("status", "say whether the bridge runs")):
        action = actions.add_parser(name, help=text)
        action.add_argument("--unit-dir", type=Path, default=None,
                            help="where the unit/agent file goes (default: the user's systemd or LaunchAgents folder; "
                                 "a custom folder is written only, not enabled)")
        action.add_argument("--platform", choices=("linux", "macos"), default=None, help=argparse.SUPPRESS)
        add_home_argument(action)
        action.set_defaults(func=cmd_service, service_command=name)
    service.set_defaults(func=lambda args: service.print_help() or 2)


def _platform(args: argparse.Namespace) -> str:
    if args.platform:
        return args.platform
    return "macos" if sys.platform == "darwin" else "linux"


def service_id(home: Path) -> str:
    return hashlib.sha256(str(Path(home).resolve()).encode("utf-8")).hexdigest()[:8]


def run_argv(home: Path) -> Tuple[List[str], Optional[str]]:
    """The daemon's command line (the .pyz we run from, or ``-m clients.bridge`` from a checkout) and
    the folder it must run in (the checkout) or None."""
    python = sys.executable or "python3"
    argv0 = sys.argv[0] if sys.argv else ""
    package_file = Path(__file__).resolve()
    if argv0.endswith(".pyz") or ".pyz" in str(package_file):
        pyz = argv0 if argv0.endswith(".pyz") else str(package_file).split(".pyz", 1)[0] + ".pyz"
        return [python, os.path.abspath(pyz), "--home", str(home), "run"], None
    root = str(package_file.parents[2])  # <root>/clients/bridge/service.py
    return [python, "-m", "clients.bridge", "--home", str(home), "run"], root


def _systemd_quote(arg: str) -> str:
    # systemd: double-quoted words, with %-specifiers and $-variables escaped.
    escaped = arg.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    return f'"{escaped}"'


def systemd_unit(home: Path) -> str:
    argv, cwd = run_argv(home)
    lines = [
        "[Unit]",
        f"Description=ai1net bridge (mobile reply) for {home}".replace("%", "%%"),
        "After=network-online.target",
        "Wants=network-online.target",
        "",
        "[Service]",
        "Type=simple",
        "ExecStart=" + " ".join(_systemd_quote(a) for a in argv),
    ]
    if cwd:
        lines.append("WorkingDirectory=" + cwd.replace("%", "%%"))  # the whole rest of the line; no quotes
    lines += [
        "Environment=PYTHONUNBUFFERED=1",
        "Restart=on-failure",
        "RestartSec=5",
        # 3 = the platform refused this device for good (revoked): restarting would not help.
        "RestartPreventExitStatus=3",
        "",
        "[Install]",
        "WantedBy=default.target",
        "",
    ]
    return "\n".join(lines)


def launchd_plist(home: Path, label: str) -> bytes:
    argv, cwd = run_argv(home)
    agent: Dict[str, object] = {
        "Label": label,
        "ProgramArguments": argv,
        "RunAtLoad": True,
        "KeepAlive": {"SuccessfulExit": False},
        "EnvironmentVariables": {"PYTHONUNBUFFERED": "1"},
        "StandardOutPath": str(Path(home) / "bridge.log"),
        "StandardErrorPath": str(Path(home) / "bridge.log"),
    }
    if cwd:
        agent["WorkingDirectory"] = cwd
    return plistlib.dumps(agent)


def _names(home: Path, platform: str, unit_dir: Optional[Path]) -> Tuple[str, Path]:
    ident = service_id(home)
    if platform == "macos":
        label = f"net.ai1net.bridge.{ident}"
        folder = unit_dir or LAUNCHD_DIR
        return label, Path(os.path.expanduser(str(folder))) / f"{label}.plist"
    unit = f"ai1net-bridge-{ident}.service"
    folder = unit_dir or SYSTEMD_DIR
    return unit, Path(os.path.expanduser(str(folder))) / unit


def _run(argv: List[str]) -> Tuple[int, str]:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)  # noqa: S603 - fixed argv
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 127, str(exc)
    return done.returncode, (done.stdout + done.stderr).strip()


def systemd_reachable() -> bool:
    if not shutil.which("systemctl"):
        return False
    code, _ = _run(["systemctl", "--user", "show-environment"])
    return code == 0


def _record(home: Path) -> Optional[Dict[str, str]]:
    try:
        value = json.loads((home / RECORD_FILE).read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def install(home: Path, *, platform: str, unit_dir: Optional[Path], out=sys.stdout) -> int:
    name, path = _names(home, platform, unit_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    if platform == "macos":
        path.write_bytes(launchd_plist(home, name))
    else:
        path.write_text(systemd_unit(home))
    enabled = False
    if unit_dir is not None:
        note = "written only (a custom folder): enable it yourself"
    elif platform == "linux" and systemd_reachable():
        _run(["systemctl", "--user", "daemon-reload"])
        code, text = _run(["systemctl", "--user", "enable", "--now", name])
        enabled = code == 0
        note = "enabled and started" if enabled else f"could not enable it: {text}"
    elif platform == "macos" and shutil.which("launchctl"):
        code, text = _run(["launchctl", "load", "-w", str(path)])
        enabled = code == 0
        note = "loaded" if enabled else f"could not load it: {text}"
    else:
        note = ("no systemd user manager is reachable here, so it is not enabled; it starts at the next "
                "login where one runs" if platform == "linux" else "launchctl is missing, so it is not loaded")
    (home / RECORD_FILE).write_text(json.dumps({"platform": platform, "name": name, "path": str(path),
                                                "enabled": enabled}, indent=2) + "\n")
    print(f"installed {path}: {note}", file=out)
    return 0


def uninstall(home: Path, *, out=sys.stdout) -> int:
    record = _record(home)
    if record is None:
        print("no login service is installed for this home", file=out)
        return 0
    path, name = Path(record["path"]), record["name"]
    if record.get("enabled"):
        if record.get("platform") == "macos":
            _run(["launchctl", "unload", "-w", str(path)])
        else:
            _run(["systemctl", "--user", "disable", "--now", name])
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    if record.get("enabled") and record.get("platform") == "linux":
        _run(["systemctl", "--user", "daemon-reload"])
    (home / RECORD_FILE).unlink()
    print(f"removed {path}", file=out)
    return 0


def status(home: Path, *, out=sys.stdout) -> int:
    from clients.bridge.daemon import running_pid

    record = _record(home)
    if record is None:
        print("service: not installed", file=out)
    else:
        state = ""
        if record.get("enabled") and record.get("platform") == "linux":
            _code, text = _run(["systemctl", "--user", "is-active", record["name"]])
            state = f" ({text})" if text else ""
        print(f"service: installed {record['path']}{state}", file=out)
    pid = running_pid(home)
    print(f"bridge: running (pid {pid})" if pid else "bridge: not running", file=out)
    return 0 if pid else 1


def cmd_service(args: argparse.Namespace) -> int:
    from clients.bridge.cli import home_dir

    home = home_dir(args).resolve()
    home.mkdir(parents=True, exist_ok=True)
    if args.service_command == "install":
        return install(home, platform=_platform(args), unit_dir=args.unit_dir)
    if args.service_command == "uninstall":
        return uninstall(home)
    return status(home)
