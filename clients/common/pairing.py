"""The pairing ceremony, device side (RFC 8628 device authorization grant).

Ask the platform for a code, show it as a QR code plus the readable user code, then poll until the
owner approves on their phone, honouring ``interval`` and ``slow_down``.
"""

from __future__ import annotations

import io
import sys
import time
from typing import Any, Callable, Dict, Optional, TextIO

from clients import limits
from clients.common.credentials import Credential
from clients.common.http import post_json

PAIRINGS_PATH = "/api/devices/pairings"
TOKEN_PATH = "/api/devices/pairings/token"
SLOW_DOWN_STEP = 5  # seconds added to the interval on each slow_down (RFC 8628 section 3.5)


class PairingError(Exception):
    """Pairing did not produce a credential; the message says why, for a person to read."""


def pair(
    url: str,
    *,
    name: str,
    kind: str,
    hostname: Optional[str] = None,
    os_name: Optional[str] = None,
    version: str,
    out: TextIO = sys.stdout,
    ephemeral: bool = False,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Credential:
    base = normalize_url(url)
    body = {"name": name, "kind": kind, "hostname": hostname or "", "os": os_name or "", "version": version}
    try:  # the platform's declared limits, checked before anything is sent
        for key, limit in (("name", "device.name"), ("hostname", "device.hostname"), ("os", "device.os"),
                           ("version", "device.version")):
            limits.check(limit, body[key], key)
    except limits.LimitExceeded as exc:
        raise PairingError(str(exc)) from None
    if ephemeral:
        body["ephemeral"] = True
    try:
        status, grant = post_json(base + PAIRINGS_PATH, body)
    except OSError as exc:
        raise PairingError(f"cannot reach {base}: {_reason(exc)}") from exc
    if status == 429:
        raise PairingError("too many pairing attempts from this address; wait a minute and try again")
    if status not in (200, 201) or "device_code" not in grant:
        raise PairingError(f"the platform refused the pairing request (HTTP {status}): {_detail(grant)}")

    show_code(grant, name=name, out=out)
    interval = max(1, int(grant.get("interval") or 5))
    deadline = clock() + max(1, int(grant.get("expires_in") or 600))
    network_failures = 0
    while True:
        sleep(interval)
        if clock() >= deadline:
            raise PairingError("the pairing code expired before it was approved; run pair again")
        try:
            status, answer = post_json(base + TOKEN_PATH, {"device_code": grant["device_code"]})
        except OSError as exc:
            # The platform may be restarting: keep trying until the code expires.
            network_failures += 1
            if network_failures in (1, 10):
                print(f"cannot reach {base} ({_reason(exc)}); still trying", file=out, flush=True)
            continue
        network_failures = 0
        if status == 200 and answer.get("device_token"):
            print("Approved. This device is paired.", file=out, flush=True)
            return Credential(
                url=base, device_id=str(answer["device_id"]), token=str(answer["device_token"]), kind=kind, name=name
            )
        code = answer.get("error")
        if code == "authorization_pending":
            continue
        if code == "slow_down" or status == 429:
            interval += SLOW_DOWN_STEP
            continue
        if code == "access_denied":
            raise PairingError("the pairing was denied on the platform; nothing was saved")
        if code == "expired_token":
            raise PairingError("the pairing code expired (or was already used); run pair again")
        raise PairingError(f"unexpected answer from the platform (HTTP {status}): {_detail(answer)}")


def show_code(grant: Dict[str, Any], *, name: str, out: TextIO) -> None:
    complete = grant.get("verification_uri_complete") or grant.get("verification_uri") or ""
    print(f'To pair "{name}" with your ai1net account, scan this code with your phone:', file=out)
    if complete and not render_qr(complete, out):
        print(f"  {complete}", file=out)
    print(f"or open {grant.get('verification_uri') or complete} and enter the code", file=out)
    print("", file=out)
    print(f"    code: {grant.get('user_code', '')}", file=out)
    print("", file=out)
    minutes = max(1, int(grant.get("expires_in") or 600) // 60)
    print(f"Waiting for approval (the code expires in {minutes} min)...", file=out, flush=True)


def render_qr(text: str, out: TextIO) -> bool:
    """Print ``text`` as a terminal QR code; False when qrcode is missing or the terminal can't show it."""
    try:
        import qrcode
    except ImportError:
        return False
    qr = qrcode.QRCode(border=2)
    qr.add_data(text)
    buffer = io.StringIO()
    qr.print_ascii(out=buffer, invert=True)
    drawing = buffer.getvalue()
    encoding = getattr(out, "encoding", None) or "utf-8"
    try:
        drawing.encode(encoding)
    except (UnicodeEncodeError, LookupError):
        return False
    out.write(drawing)
    return True


def normalize_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise PairingError(f"the platform URL must start with http:// or https://, got {url!r}")
    return url


def _detail(body: Dict[str, Any]) -> str:
    return str(body.get("detail") or body.get("error") or body or "no detail")


def _reason(exc: OSError) -> str:
    return str(getattr(exc, "reason", None) or exc)
