"""The ``ai1net-probe`` command line: ``run URL --allow DIR [--allow DIR ...] [--write] [--exec]``.

By default the probe pairs for this run only (QR code + user code; the owner approves on the phone or
in Studio), keeps nothing on disk, and its token dies when the connection closes. ``--persist``
stores the credential under ``--home`` and reuses it, for servers that must reconnect unattended.
For tests and automation, ``AI1NET_PROBE_TOKEN`` + ``AI1NET_PROBE_DEVICE_ID`` skip pairing.

Platform requests ``probe.<op>`` are answered by ``ops.Probe.call`` in a worker thread; a
``ProbeError`` becomes the JSON-RPC error ``-32000`` with ``data = {"code", "detail"}``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import platform
import signal
import socket
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, List, Optional

from clients.probe.errors import ProbeError
from clients.probe.ops import VERSION, Probe

DEFAULT_HOME = Path("~/.config/ai1net-probe")
EXIT_USAGE = 2
EXIT_FINAL = 3  # the platform refused this probe for good (revoked, or its one-run token died)
log = logging.getLogger("ai1net.probe")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ai1net-probe", description="Remote hands for ai1net, confined to --allow.")
    parser.add_argument("--version", action="version", version=f"ai1net-probe {VERSION}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log more")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    run = subparsers.add_parser("run", help="pair for this run, connect and serve")
    run.add_argument("url", help="the platform, e.g. https://ai1net.example")
    run.add_argument("--allow", action="append", required=True, metavar="DIR", help="a directory the agent may use")
    run.add_argument("--write", action="store_true", help="allow writes (each one still needs your approval)")
    run.add_argument("--exec", action="store_true", help="allow commands (each one still needs your approval)")
    run.add_argument("--name", default=None, help="this probe's name (default: the hostname)")
    run.add_argument("--home", type=Path, default=DEFAULT_HOME, help="used only with --persist")
    run.add_argument("--persist", action="store_true", help="store the credential and reuse it on restart")
    run.add_argument("-v", "--verbose", action="store_true", help="log more")
    run.set_defaults(func=cmd_run)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    from clients.common.cli import run_command

    return run_command(build_parser(), argv)


def modes_label(probe: Probe) -> str:
    modes = [name for name, on in (("write", probe.write), ("exec", probe.exec)) if on]
    return "+".join(modes) if modes else "read-only"


def cmd_run(args: argparse.Namespace) -> int:
    try:
        probe = Probe(args.allow, write=args.write, exec_=args.exec)
    except ValueError as exc:
        print(f"ai1net-probe: --allow: {exc}", file=sys.stderr)
        return EXIT_USAGE
    credential = obtain_credential(args)
    if credential is None:
        return 1
    url, device_id, token = credential
    print(
        f"ai1net-probe: serving {', '.join(probe.confinement.roots)} ({modes_label(probe)}) as device {device_id}",
        flush=True,
    )
    try:
        return asyncio.run(serve(probe, url, token))
    finally:
        probe.close()


def obtain_credential(args: argparse.Namespace) -> Optional[tuple]:
    """(url, device id, token): from the environment, the stored credential (--persist), or pairing."""
    token = os.environ.get("AI1NET_PROBE_TOKEN")
    device_id = os.environ.get("AI1NET_PROBE_DEVICE_ID")
    if token and device_id:
        return args.url, device_id, token
    from clients.common.credentials import CredentialError, load_credential, save_credential
    from clients.common.pairing import PairingError, pair

    home = Path(os.path.expanduser(str(args.home)))
    if args.persist:
        try:
            stored = load_credential(home)
        except CredentialError as exc:
            print(f"ai1net-probe: {exc}", file=sys.stderr)
            return None
        if stored is not None and stored.kind == "probe" and stored.url.rstrip("/") == args.url.rstrip("/"):
            return stored.url, stored.device_id, stored.token
    hostname = socket.gethostname()
    try:
        cred = pair(
            args.url,
            name=args.name or hostname,
            kind="probe",
            hostname=hostname,
            os_name=f"{platform.system()} {platform.release()}".strip(),
            version=VERSION,
            ephemeral=not args.persist,
        )
    except PairingError as exc:
        print(f"ai1net-probe: pairing failed: {exc}", file=sys.stderr)
        return None
    if args.persist:
        save_credential(home, cred)
    return cred.url, cred.device_id, cred.token


class Server:
    """Answers the platform's ``probe.<op>`` requests; the ops run in worker threads."""

    def __init__(self, probe: Probe, workers: int = 8) -> None:
        self.probe = probe
        self.executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="probe-op")
        self.applied = 0  # the probe takes no deliveries; remembered in memory only

    async def on_request(self, method: str, params: Dict[str, Any]) -> Dict[str, Any]:
        from clients.common.tunnel import MethodNotFound, RequestError

        if not method.startswith("probe."):
            raise MethodNotFound(method)
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self.executor, self.probe.call, method, params)
        except ProbeError as exc:
            raise RequestError(exc.detail, code=exc.rpc_code, data=exc.data) from None

    async def on_deliver(self, seq: int, kind: str, payload: Dict[str, Any]) -> None:
        log.info("ignoring delivery %s of kind %s: a probe takes requests only", seq, kind)
        self.applied = max(self.applied, seq)

    def hello(self) -> Dict[str, Any]:
        return {
            "kind": "probe",
            "version": VERSION,
            "capabilities": self.probe.ops,
            "ports": [],
            "roots": list(self.probe.confinement.roots),
            "modes": {"write": self.probe.write, "exec": self.probe.exec},
        }


async def serve(probe: Probe, url: str, token: str) -> int:
    from clients.common.tunnel import FinalCloseError, Tunnel

    server = Server(probe)
    tunnel = Tunnel(
        url,
        token,
        hello=server.hello(),
        applied_seq=lambda: server.applied,
        on_deliver=server.on_deliver,
        on_request=server.on_request,
        user_agent=f"ai1net-probe/{VERSION}",
    )
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(signum, tunnel.stop)
        except (NotImplementedError, RuntimeError):
            pass
    try:
        await tunnel.run()
        return 0
    except FinalCloseError as exc:
        print(f"ai1net-probe: stopped: {exc.reason} (close code {exc.code})", file=sys.stderr, flush=True)
        return EXIT_FINAL
    finally:
        server.executor.shutdown(wait=False)
