"""The one exception the probe's operations raise, and how it travels over the tunnel."""

from __future__ import annotations

from typing import Any, Dict

APPLICATION_ERROR = -32000  # clients.protocol.APPLICATION_ERROR; repeated so ops import nothing else


class ProbeError(Exception):
    """A refused or failed operation: ``code`` is stable and machine-readable, ``detail`` is for people.

    Codes: outside_allowed_roots, not_permitted, not_found, is_binary, too_large, invalid_argument,
    timeout, unsupported, is_symlink, not_a_directory, is_a_directory, diff_does_not_apply,
    parse_error, git_failed, unknown_handle, too_many_processes, io_error.

    Over the tunnel it becomes the JSON-RPC error ``{"code": -32000, "message": detail,
    "data": {"code": code, "detail": detail}}``: the tunnel maps any exception that carries
    ``rpc_code`` and ``data`` attributes to exactly that error.
    """

    rpc_code = APPLICATION_ERROR

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail

    @property
    def data(self) -> Dict[str, Any]:
        return {"code": self.code, "detail": self.detail}

    def __repr__(self) -> str:
        return f"ProbeError({self.code!r}, {self.detail!r})"
