"""The platform's VAPID key pair (RFC 8292): from the environment, or made once for development.

``AI1NET_VAPID_PRIVATE_KEY`` holds the private key (raw 32 bytes or DER, base64url; or PEM);
``AI1NET_VAPID_PUBLIC_KEY`` is optional and must match it. Without them and with debug on, a pair is
generated once and kept in ``VAPID_KEY_FILE`` (``.vapid.json`` in the project folder, ignored by git);
with debug off Web Push is simply off.
"""

from __future__ import annotations

import base64
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from django.conf import settings
from py_vapid import Vapid


@dataclass(frozen=True)
class VapidKeys:
    vapid: Vapid
    public_key: str  # the applicationServerKey: the uncompressed P-256 point, base64url without padding


class VapidKeyError(ValueError):
    pass


_lock = threading.Lock()
_cache: dict[tuple, VapidKeys | None] = {}


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def public_key_of(vapid: Vapid) -> str:
    return b64url(vapid.public_key.public_bytes(serialization.Encoding.X962,
                                                serialization.PublicFormat.UncompressedPoint))


def parse_private_key(text: str) -> Vapid:
    try:
        if text.lstrip().startswith("-----BEGIN"):
            return Vapid.from_pem(text.encode())
        return Vapid.from_string(private_key=text)
    except Exception as exc:  # noqa: BLE001 - any parse failure is the same configuration error
        raise VapidKeyError("AI1NET_VAPID_PRIVATE_KEY is not a P-256 private key (raw or DER base64url, or PEM).") \
            from exc


def from_environment(private: str, public: str) -> VapidKeys:
    vapid = parse_private_key(private)
    derived = public_key_of(vapid)
    if public and public.rstrip("=") != derived:
        raise VapidKeyError("AI1NET_VAPID_PUBLIC_KEY does not belong to AI1NET_VAPID_PRIVATE_KEY.")
    return VapidKeys(vapid=vapid, public_key=derived)


def _from_file(path: Path) -> VapidKeys:
    """Read the development key file, creating it first if it is missing (atomically: first one wins)."""
    if not path.exists():
        key = ec.generate_private_key(ec.SECP256R1())
        raw = key.private_numbers().private_value.to_bytes(32, "big")
        vapid = Vapid.from_raw(b64url(raw).encode())
        body = json.dumps({"private_key": b64url(raw), "public_key": public_key_of(vapid)})
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(body)
        try:
            os.link(tmp, path)  # fails if another process made it first: theirs stands
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
    data = json.loads(path.read_text())
    return from_environment(data["private_key"], data.get("public_key", ""))


def keys() -> VapidKeys | None:
    """The key pair Web Push signs with, or None when Web Push is off (no keys, debug off)."""
    private, public, key_file = settings.VAPID_PRIVATE_KEY, settings.VAPID_PUBLIC_KEY, settings.VAPID_KEY_FILE
    cache_key = (private, public, str(key_file or ""))
    with _lock:
        if cache_key not in _cache:
            if private:
                try:
                    _cache[cache_key] = from_environment(private, public)
                except VapidKeyError:
                    _cache[cache_key] = None  # the deploy check says why
            elif key_file:
                _cache[cache_key] = _from_file(Path(key_file))
            else:
                _cache[cache_key] = None
        return _cache[cache_key]
