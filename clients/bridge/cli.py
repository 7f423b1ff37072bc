"""The ``ai1net-bridge`` command line: ``pair``, ``run``, ``status``.

Subcommands live in a registry: each module in ``COMMAND_MODULES`` that exists is imported and its
``register(subparsers)`` adds its own commands (e.g. ``hook`` and ``hooks install`` in
``clients.bridge.hooks_cli``). A command sets ``func(args) -> int`` (the exit code) with
``parser.set_defaults(func=...)`` and calls ``add_home_argument(parser)`` so ``--home`` works after
the subcommand too.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import os
import platform
import socket
import sys
import threading
from pathlib import Path
from typing import List, Optional

from clients.bridge import __version__

DEFAULT_HOME = Path("~/.config/ai1net")
COMMAND_MODULES = ("clients.bridge.hooks_cli", "clients.bridge.service")
EXIT_USAGE = 2


def add_home_argument(parser: argparse.ArgumentParser, *, top_level: bool = False) -> None:
    parser.add_argument(
        "--home",
        type=Path,
        # Only the top-level parser sets a default, so `--home` before the subcommand is kept.
        default=DEFAULT_HOME if top_level else argparse.SUPPRESS,
        help=f"config and state directory (default {DEFAULT_HOME})",
    )


def home_dir(args: argparse.Namespace) -> Path:
    return Path(os.path.expanduser(str(args.home)))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ai1net-bridge", description="Keeps this desktop connected to ai1net (mobile reply)."
    )
    add_home_argument(parser, top_level=True)
    parser.add_argument("--version", action="version", version=f"ai1net-bridge {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log more")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    register(subparsers)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        module.register(subparsers)
    return parser


def register(subparsers: argparse._SubParsersAction) -> None:
    pair = subparsers.add_parser("pair", help="pair this machine with your ai1net account (QR code)")
    pair.add_argument("url", help="the platform, e.g. https://ai1net.example")
    pair.add_argument("--name", default=None, help="a name for this device (default: the hostname)")
    pair.add_argument("--force", action="store_true", help="replace an existing pairing")
    add_home_argument(pair)
    pair.set_defaults(func=cmd_pair)

    run = subparsers.add_parser("run", help="connect to the platform and serve (the daemon)")
    run.add_argument("--expose", type=_web_port, action="append", default=[], metavar="PORT",
                     help="let your browser reach http://127.0.0.1:PORT on this machine through the platform "
                          "(device web; 20000-20999; repeatable)")
    add_home_argument(run)
    run.set_defaults(func=cmd_run)

    status = subparsers.add_parser("status", help="show the pairing and whether the daemon runs")
    add_home_argument(status)
    status.set_defaults(func=cmd_status)


def _web_port(text: str) -> int:
    from clients import protocol

    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not protocol.web_port_allowed(port):
        raise argparse.ArgumentTypeError(
            f"{port} is outside {protocol.WEB_PORT_MIN}-{protocol.WEB_PORT_MAX}, the ports device web may expose")
    return port


def main(argv: Optional[List[str]] = None) -> int:
    from clients.common.cli import run_command

    return run_command(build_parser(), argv)


def cmd_pair(args: argparse.Namespace) -> int:
    from clients.common.credentials import load_credential, save_credential
    from clients.common.pairing import PairingError, pair

    home = home_dir(args)
    existing = load_credential(home)
    if existing and not args.force:
        print(
            f"already paired as {existing.name} ({existing.device_id}) with {existing.url}; "
            "use --force to pair again",
            file=sys.stderr,
        )
        return EXIT_USAGE
    hostname = socket.gethostname()
    try:
        cred = pair(
            args.url,
            name=args.name or hostname,
            kind="bridge",
            hostname=hostname,
            os_name=f"{platform.system()} {platform.release()}".strip(),
            version=__version__,
        )
    except PairingError as exc:
        print(f"ai1net-bridge: pairing failed: {exc}", file=sys.stderr)
        return 1
    path = save_credential(home, cred)
    print(f"paired as device {cred.device_id}; credential saved in {path}", flush=True)
    print(f"start the bridge with: ai1net-bridge --home {home} run", flush=True)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from clients.bridge import hook_cache
    from clients.bridge.daemon import BridgeDaemon, PidLock
    from clients.common.credentials import CredentialError, load_credential

    home = home_dir(args)
    try:
        cred = load_credential(home)
    except CredentialError as exc:
        print(f"ai1net-bridge: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if cred is None:
        print(f"ai1net-bridge: not paired yet (no credential in {home}); run: ai1net-bridge pair URL", file=sys.stderr)
        return EXIT_USAGE
    lock = PidLock(home)
    if not lock.acquire():
        print(f"ai1net-bridge: a bridge is already running on {home}", file=sys.stderr)
        return 1
    # The hooks' copy of this archive's modules, after an update (tens of ms: beside the connect, not before
    # it; not a daemon thread, so that a bridge stopping at once still leaves the copy whole).
    threading.Thread(target=hook_cache.refresh, args=(home,), name="hook-cache").start()
    # What the daemon imported lives as long as it does: keep it out of the collector's full passes
    # (8 ms each on the 2-core bench machine), which would otherwise land on a question or an answer
    # passing through. Objects made later are collected as before.
    gc.freeze()
    try:
        return asyncio.run(BridgeDaemon(home, cred, expose=args.expose).run())
    finally:
        lock.release()


def cmd_status(args: argparse.Namespace) -> int:
    from clients.bridge.daemon import INBOX_FILE, running_pid
    from clients.common.credentials import CredentialError, load_credential

    home = home_dir(args)
    try:
        cred = load_credential(home)
    except CredentialError as exc:
        print(f"paired: broken credential ({exc})")
        return 1
    pid = running_pid(home)
    daemon = f"running (pid {pid})" if pid else "not running"
    if cred is None:
        print("paired: no")
        print(f"daemon: {daemon}")
        return 1
    print("paired: yes")
    print(f"device id: {cred.device_id}")
    print(f"name: {cred.name}")
    print(f"url: {cred.url}")
    print(f"daemon: {daemon}")
    if (home / INBOX_FILE).exists():
        from clients.bridge.daemon import Inbox

        inbox = Inbox(home / INBOX_FILE, cred.device_id)
        try:
            print(f"applied seq: {inbox.applied_seq()}")
        finally:
            inbox.close()
    return 0
