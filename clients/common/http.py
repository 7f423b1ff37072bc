"""A tiny JSON-over-HTTP helper on urllib (the clients carry no HTTP library)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any, Dict, Optional, Tuple


def post_json(
    url: str, body: Dict[str, Any], *, timeout: float = 15.0, user_agent: str = "ai1net-client"
) -> Tuple[int, Dict[str, Any]]:
    """POST a JSON object; return (status, decoded body). HTTP error statuses are returned, not raised;
    network failures raise OSError (urllib.error.URLError is one)."""
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"not an http(s) URL: {url}")
    data = json.dumps(body).encode("utf-8")
    req = urllib.request.Request(  # noqa: S310 - scheme checked above
        url,
        data=data,
        method="POST",
        headers={"Content-Type": "application/json", "Accept": "application/json", "User-Agent": user_agent},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:  # noqa: S310 - scheme checked above
            return response.status, _decode(response.read())
    except urllib.error.HTTPError as exc:
        try:
            payload = _decode(exc.read())
        finally:
            exc.close()
        return exc.code, payload


def _decode(raw: bytes) -> Dict[str, Any]:
    if not raw:
        return {}
    try:
        value: Optional[Any] = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return {"detail": raw[:200].decode("utf-8", "replace")}
    return value if isinstance(value, dict) else {"value": value}
