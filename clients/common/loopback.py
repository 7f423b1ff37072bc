"""TCP connections whose peer is on the same machine: sent without pacing.

Linux paces a connection's sends with timers of its own when its congestion control asks for pacing (BBR
does) and no ``fq`` queue discipline does it for the device; the loopback device has none. Servers often
run BBR as the default (the benchmark machine does). On a loopback connection there is no network for
congestion control to model, so the pacing only costs: one connection on that machine moved bulk data at
3,100-4,300 MiB/s for 0.36-0.44 ms of CPU per MiB with BBR, against 7,300-10,000 MiB/s and 0.19-0.24 ms with
Reno or CUBIC (``python -m bench.loopback_tcp``; bench/NOTES.md, "Loopback connections without pacing"). A
device-web download crosses such hops where daphne runs behind a proxy on its own host (README, "Scaling
out"), between daphne processes (the stream relay), from a local service to its bridge, and between a bridge
and a platform on one machine.

So a connection whose peer is a loopback address uses Reno, which every Linux kernel has built in and lets
any process choose (``net.ipv4.tcp_allowed_congestion_control``). Connections to other hosts keep the
system's choice. ``AI1NET_LOOPBACK_TCP_CONGESTION`` names another algorithm, or, empty, leaves every
connection as the system made it. Standard library only: the clients use it too.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from typing import Any, Optional

DEFAULT_ALGORITHM = "reno"
ENV = "AI1NET_LOOPBACK_TCP_CONGESTION"
_SYSCTL = "/proc/sys/net/ipv4/tcp_congestion_control"


def algorithm() -> str:
    """What a loopback connection is given ("": left as the system made it)."""
    return os.environ.get(ENV, DEFAULT_ALGORITHM).strip()


def system_algorithm() -> str:
    """The system's default congestion control, which every other connection keeps ("" where it cannot be read)."""
    try:
        with open(_SYSCTL) as sysctl:
            return sysctl.read().strip()
    except OSError:
        return ""


def is_loopback(host: Any) -> bool:
    try:
        address = ipaddress.ip_address(str(host).split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1 on a dual-stack socket
    return (mapped or address).is_loopback


def unpaced(sock: Optional[socket.socket]) -> bool:
    """Give ``sock`` the loopback algorithm when its peer is on this machine; True when it did. Never raises:
    a platform without ``TCP_CONGESTION``, a closed socket or a refused algorithm leaves it as it was."""
    name = algorithm()
    option = getattr(socket, "TCP_CONGESTION", None)
    if sock is None or not name or option is None:
        return False
    try:
        if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
            return False
        if not is_loopback(sock.getpeername()[0]):
            return False
        sock.setsockopt(socket.IPPROTO_TCP, option, name.encode())
    except (OSError, AttributeError):
        return False
    return True
