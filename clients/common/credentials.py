"""The device credential on disk: ``<home>/credential.json``, readable by its owner only (0600)."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

CREDENTIAL_FILE = "credential.json"


class CredentialError(Exception):
    """The credential file exists but cannot be used."""


@dataclass(frozen=True)
class Credential:
    url: str
    device_id: str
    token: str
    kind: str
    name: str

    def __repr__(self) -> str:  # never print the token by accident
        return f"Credential(url={self.url!r}, device_id={self.device_id!r}, kind={self.kind!r}, name={self.name!r})"


def credential_path(home: Path) -> Path:
    return Path(home) / CREDENTIAL_FILE


def load_credential(home: Path) -> Optional[Credential]:
    path = credential_path(home)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise CredentialError(f"cannot read {path}: {exc}") from exc
    try:
        return Credential(
            url=str(data["url"]),
            device_id=str(data["device_id"]),
            token=str(data["token"]),
            kind=str(data["kind"]),
            name=str(data["name"]),
        )
    except (KeyError, TypeError) as exc:
        raise CredentialError(f"{path} is incomplete ({exc}); pair this device again") from exc


def save_credential(home: Path, cred: Credential) -> Path:
    """Write atomically; the file is created 0600 so the token is never readable by others, even briefly."""
    home = Path(home)
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = credential_path(home)
    fd, tmp = tempfile.mkstemp(prefix=".credential-", dir=str(home))  # mkstemp creates the file 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(asdict(cred), handle, indent=2)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def delete_credential(home: Path) -> bool:
    try:
        credential_path(home).unlink()
    except FileNotFoundError:
        return False
    return True
