"""The probe operations the gateway knows: argument checks, the canonical hash, the probe's modes.

The probe enforces its allow-list itself; here we only refuse what is malformed (400 naming the
field) so that a bad request never reaches a machine, and decide which ops need approval.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ai1net.exceptions import ValidationFailed
from ai1net.limits import enforce
from clients.limits import LIMITS
from probes.models import ALL_OPS, OP_MODE

MAX_ARGS_BYTES = LIMITS["probe.args"].max  # a write's content travels in one tunnel frame (4 MiB cap)

# Known argument names and their JSON types. Unknown names pass through to the probe (it validates
# its own extras, e.g. caps); the approval covers them anyway because it is bound to the full hash.
_STR = (str,)
_INT = (int,)
_NUM = (int, float)
_BOOL = (bool,)
ARG_TYPES: dict[str, tuple[type, ...]] = {
    "path": _STR,
    "offset": _INT,
    "limit": _INT,
    "depth": _INT,
    "pattern": _STR,
    "glob": _STR,
    "content": _STR,
    "diff": _STR,
    "cwd": _STR,
    "timeout": _NUM,
    "handle": _STR,
    "base64": _BOOL,
    "ignore_case": _BOOL,
    "gitignore": _BOOL,
    "staged": _BOOL,
    "engine": _STR,
    "max_bytes": _INT,
    "max_entries": _INT,
    "max_results": _INT,
    "rev": _STR,
}
REQUIRED: dict[str, tuple[str, ...]] = {
    "read": ("path",),
    "read_tree": ("path",),
    "grep": ("pattern",),
    "stat": ("path",),
    "ast_parse": ("path",),
    "write": ("path",),
    "run": ("argv",),
    "run_background": ("argv",),
    "stop": ("handle",),
    "run_output": ("handle",),
}


def args_hash(op: str, args: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of {op, args}: what an approval is bound to."""
    canonical = json.dumps({"op": op, "args": args}, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def validate(op: Any, args: Any) -> tuple[str, dict[str, Any]]:
    if not isinstance(op, str) or op not in ALL_OPS:
        raise ValidationFailed(f"op: unknown operation; use one of {', '.join(sorted(ALL_OPS))}.", code="invalid_op")
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise ValidationFailed("args: must be an object.", code="invalid_args")
    enforce("probe.args", args, "args")  # declared in clients.limits: 413 naming the field and the limit
    for name, value in args.items():
        if _has_nul(name) or _has_nul(value):
            # No path holds a NUL, and PostgreSQL's JSON cannot store one: refused on every database alike.
            raise ValidationFailed(f"args.{name}: NUL bytes are not allowed.", code="invalid_args")
        expected = ARG_TYPES.get(name)
        if expected is None:
            continue
        # bool is an int in Python; a JSON true is never a line number.
        if not isinstance(value, expected) or (isinstance(value, bool) and bool not in expected):
            kind = "/".join(sorted({t.__name__ for t in expected}))
            raise ValidationFailed(f"args.{name}: must be {kind}.", code="invalid_args")
        if expected in (_INT, _NUM) and value < 0:
            raise ValidationFailed(f"args.{name}: must not be negative.", code="invalid_args")
    if "argv" in args:
        argv = args["argv"]
        if not isinstance(argv, list) or not argv or not all(isinstance(item, str) for item in argv):
            raise ValidationFailed("args.argv: must be a non-empty list of strings.", code="invalid_args")
    for name in REQUIRED.get(op, ()):
        if name not in args or args[name] in ("", []):
            raise ValidationFailed(f"args.{name}: required for {op}.", code="invalid_args")
    if op == "write" and ("content" in args) == ("diff" in args):
        raise ValidationFailed("args.content: give exactly one of content or diff.", code="invalid_args")
    return op, args


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, list):
        return any(_has_nul(item) for item in value)
    if isinstance(value, dict):
        return any(_has_nul(key) or _has_nul(item) for key, item in value.items())
    return False


def probe_modes(capabilities: Any) -> set[str]:
    """What the probe was started to allow (`write`, `exec`), read from its hello `capabilities`.

    Accepts a list of names (`"write"`, `"exec"`, `"probe.write"`, `"mode:exec"`) or an object
    (`{"modes": [...]}` or `{"write": true, "exec": true}`).
    """
    modes: set[str] = set()
    names: list[Any] = []
    if isinstance(capabilities, dict):
        listed = capabilities.get("modes")
        if isinstance(listed, list):
            names.extend(listed)
        names.extend(key for key in ("write", "exec") if capabilities.get(key) is True)
    elif isinstance(capabilities, list):
        names.extend(capabilities)
    for name in names:
        if not isinstance(name, str):
            continue
        bare = name.split(":", 1)[-1].removeprefix("probe.")
        if bare == "write":
            modes.add("write")
        elif bare in ("exec", "run", "run_background"):
            modes.add("exec")
    return modes


def required_mode(op: str) -> str | None:
    return OP_MODE.get(op)
