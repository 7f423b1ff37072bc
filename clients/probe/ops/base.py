"""What every op family shares: typed arguments, limits, and the environment child processes get."""

from __future__ import annotations

import os
from typing import Any, Dict, List, Tuple

from ..errors import ProbeError

MAX_PAGE_BYTES = 3 * 1024 * 1024  # a result travels in one 4 MiB tunnel frame
DEFAULT_PAGE_BYTES = 256 * 1024
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
_UNSET: Any = object()


class Params:
    """Typed access to an op's arguments; refuses unknown names and wrong types."""

    def __init__(self, op: str, params: Dict[str, Any], allowed: Tuple[str, ...]) -> None:
        unknown = sorted(set(params) - set(allowed))
        if unknown:
            names = ", ".join(allowed) or "none"
            raise ProbeError("invalid_argument", f"{op}: unknown argument {unknown[0]!r}; it takes {names}")
        self.op = op
        self.params = params

    def _get(self, name: str, default: Any, kinds: Tuple[type, ...], what: str) -> Any:
        value = self.params.get(name, default)
        if value is _UNSET:
            raise ProbeError("invalid_argument", f"{self.op}: {name} is required")
        if value is default and name not in self.params:
            return value
        if value is None and default is None:
            return None
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise ProbeError("invalid_argument", f"{self.op}: {name} must be {what}")
        return value

    def str(self, name: str, default: Any = _UNSET) -> Any:
        return self._get(name, default, (str,), "a string")

    def bool(self, name: str, default: bool = False) -> bool:
        return self._get(name, default, (bool,), "true or false")

    def int(self, name: str, default: int, low: int, high: int) -> int:
        value = self._get(name, default, (int,), "an integer")
        if not low <= value <= high:
            raise ProbeError("invalid_argument", f"{self.op}: {name} must be between {low} and {high}")
        return value

    def number(self, name: str, default: float, low: float, high: float) -> float:
        value = self._get(name, default, (int, float), "a number")
        if not low <= value <= high:
            raise ProbeError("invalid_argument", f"{self.op}: {name} must be between {low} and {high}")
        return float(value)

    def argv(self) -> List[str]:
        value = self.params.get("argv")
        if not isinstance(value, list) or not value or not all(isinstance(a, str) and "\0" not in a for a in value):
            raise ProbeError("invalid_argument", f"{self.op}: argv must be a non-empty list of strings")
        return list(value)


def strip_eol(raw: bytes) -> bytes:
    if raw.endswith(b"\n"):
        raw = raw[:-1]
    return raw[:-1] if raw.endswith(b"\r") else raw


def base_env(home: str) -> Dict[str, str]:
    """A child's whole environment: nothing of the probe's own (its token above all) leaks in."""
    env = {
        "PATH": os.environ.get("PATH") or DEFAULT_PATH,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": home,
        "TERM": "dumb",
    }
    for name in ("USER", "LOGNAME", "TZ", "SYSTEMROOT"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env
