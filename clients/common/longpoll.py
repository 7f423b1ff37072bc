"""HTTP long-poll transport of the tunnel, for networks that block WebSockets (the bridge falls back
to it by itself; see ``clients.common.tunnel.Tunnel(longpoll=True)``).

``POST <platform>/api/devices/bridge/pull {"ackedSeq"}`` is held by the platform until outbox items
exist (or ~25 s) and answers ``{"items": [{seq, kind, payload}...], "heartbeatSec", "deviceId"}``;
``POST <platform>/api/devices/bridge/push {"id", "method", "params"}`` runs a device -> platform
request (same ids, so retries are answered from the first result). Standard library only: the calls
block, so the tunnel runs them in a thread.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any, Dict, Optional, Tuple

from clients import protocol

PULL_PATH = "/api/devices/bridge/pull"
PUSH_PATH = "/api/devices/bridge/push"
PULL_TIMEOUT = 90.0  # the platform holds a pull for about 25 s; this only catches a dead line
PUSH_TIMEOUT = 40.0


def base_url(url: str) -> str:
    """The platform's base URL (http/https) from what the credential holds (http(s) or ws(s))."""
    url = url.strip().rstrip("/")
    if url.endswith(protocol.TUNNEL_PATH):
        url = url[: -len(protocol.TUNNEL_PATH)]
    if url.startswith("wss://"):
        url = "https://" + url[len("wss://") :]
    elif url.startswith("ws://"):
        url = "http://" + url[len("ws://") :]
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"the platform URL must start with http:// or https://, got {url!r}")
    return url


class LongPollClient:
    def __init__(self, url: str, token: str, *, user_agent: str = "ai1net-client") -> None:
        self.base = base_url(url)
        self._token = token
        self.user_agent = user_agent

    def _post(self, path: str, body: Dict[str, Any], timeout: float) -> Tuple[int, Dict[str, Any]]:
        data = json.dumps(body).encode("utf-8")
        if len(data) > protocol.MAX_FRAME_BYTES:
            raise ValueError(f"the request is larger than {protocol.MAX_FRAME_BYTES} bytes")
        request = urllib.request.Request(  # noqa: S310 - http(s) checked in base_url
            self.base + path, data=data, method="POST",
            headers={"Content-Type": "application/json", "Accept": "application/json",
                     "Authorization": f"Bearer {self._token}", "User-Agent": self.user_agent},
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
                return response.status, _decode(response.read(protocol.MAX_FRAME_BYTES * 2))
        except urllib.error.HTTPError as exc:
            try:
                return exc.code, _decode(exc.read(65536))
            finally:
                exc.close()

    def pull(self, acked_seq: int, timeout: float = PULL_TIMEOUT) -> Tuple[int, Dict[str, Any]]:
        return self._post(PULL_PATH, {"ackedSeq": int(acked_seq)}, timeout)

    def push(self, request_id: str, method: str, params: Dict[str, Any],
             timeout: float = PUSH_TIMEOUT) -> Tuple[int, Dict[str, Any]]:
        return self._post(PUSH_PATH, {"id": request_id, "method": method, "params": params}, timeout)


def _decode(raw: bytes) -> Dict[str, Any]:
    if not raw:
        return {}
    try:
        value: Optional[Any] = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return {"detail": raw[:200].decode("utf-8", "replace")}
    return value if isinstance(value, dict) else {"value": value}
