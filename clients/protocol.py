"""The tunnel's wire protocol: frame shapes, method names, close codes, limits.

Shared by the platform's consumers and by the clients, so it lives here (the clients must stay
self-contained) and the server imports it from ``clients.protocol``. Standard library only;
keep it importable on Python 3.9.

Every WebSocket text frame is one JSON-RPC 2.0 message:
  request       {"jsonrpc": "2.0", "id": <str|int>, "method": str, "params": {...}}
  notification  {"jsonrpc": "2.0", "method": str, "params": {...}}
  result        {"jsonrpc": "2.0", "id": ..., "result": ...}
  error         {"jsonrpc": "2.0", "id": ..., "error": {"code": int, "message": str, "data": {...}}}
"""

import json
from typing import Any, Dict, Optional, Union

PROTOCOL_VERSION = 1
TUNNEL_PATH = "/ws/device"

# Limits. A frame larger than this is refused by both sides.
MAX_FRAME_BYTES = 4 * 1024 * 1024
DEFAULT_HEARTBEAT_SEC = 20
# A peer that sent nothing for HEARTBEAT_MISSES * heartbeatSec is closed with CLOSE_HEARTBEAT_TIMEOUT.
HEARTBEAT_MISSES = 3

# --- methods ---------------------------------------------------------------------------------
# device -> platform
HELLO = "hello"  # request; params: protocolVersion, kind, version, capabilities, ports, roots, ackedSeq
ACK = "ack"  # notification; params: {"seq": int} (acks every item up to and including seq)
HEARTBEAT = "heartbeat"  # notification, both directions; params: {}
# platform -> device
DELIVER = "deliver"  # notification; params: {"seq": int, "kind": str, "payload": {...}}
# Application requests in either direction use app-prefixed method names, e.g. "mobile.question",
# "probe.read", "web.request". Device -> platform requests carry a client-generated id
# (a UUID string) so that a retry after a reconnect is answered from the stored first result.

# --- close codes -----------------------------------------------------------------------------
CLOSE_NORMAL = 1000
CLOSE_PROTOCOL_ABUSE = 4400  # repeated malformed frames, no hello, frame too large
CLOSE_UNAUTHORIZED = 4401  # unknown or missing token: final, do not retry
CLOSE_REVOKED = 4403  # the device was revoked (or an ephemeral token died): final
CLOSE_HEARTBEAT_TIMEOUT = 4408  # the peer was silent too long
CLOSE_REPLACED = 4409  # a newer connection of the same device took over
FINAL_CLOSE_CODES = frozenset({CLOSE_UNAUTHORIZED, CLOSE_REVOKED})

CLOSE_REASONS = {
    CLOSE_PROTOCOL_ABUSE: "too many malformed frames",
    CLOSE_UNAUTHORIZED: "the device token is not valid; pair this device again",
    CLOSE_REVOKED: "this device was revoked by its owner; pair it again to reconnect",
    CLOSE_HEARTBEAT_TIMEOUT: "no heartbeat",
    CLOSE_REPLACED: "replaced by a newer connection of the same device",
}

# --- JSON-RPC error codes --------------------------------------------------------------------
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
APPLICATION_ERROR = -32000  # data: {"code": "<application error code>", ...}

Message = Dict[str, Any]
RequestId = Union[str, int]


class ProtocolError(Exception):
    """A frame that is not a valid JSON-RPC 2.0 message; ``code`` is the JSON-RPC error code."""

    def __init__(self, code: int, message: str, request_id: Optional[RequestId] = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id


def request(method: str, params: Optional[Dict[str, Any]], request_id: RequestId) -> str:
    return _dump({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params or {}})


def notification(method: str, params: Optional[Dict[str, Any]] = None) -> str:
    return _dump({"jsonrpc": "2.0", "method": method, "params": params or {}})


def result(request_id: RequestId, value: Any) -> str:
    return _dump({"jsonrpc": "2.0", "id": request_id, "result": value})


def error(request_id: Optional[RequestId], code: int, message: str, data: Optional[Dict[str, Any]] = None) -> str:
    body: Dict[str, Any] = {"code": code, "message": message}
    if data:
        body["data"] = data
    return _dump({"jsonrpc": "2.0", "id": request_id, "error": body})


def parse(text: Union[str, bytes]) -> Message:
    """Parse one frame. Raises ProtocolError with the JSON-RPC code to answer with."""
    if isinstance(text, bytes):
        raise ProtocolError(INVALID_REQUEST, "binary frames are not accepted; send JSON text")
    if len(text.encode("utf-8", "surrogatepass")) > MAX_FRAME_BYTES:
        raise ProtocolError(INVALID_REQUEST, f"frame larger than {MAX_FRAME_BYTES} bytes")
    try:
        message = json.loads(text)
    except (ValueError, RecursionError):
        raise ProtocolError(PARSE_ERROR, "frame is not valid JSON") from None
    if not isinstance(message, dict):
        raise ProtocolError(INVALID_REQUEST, "a frame must be one JSON object")
    request_id = message.get("id")
    if request_id is not None and (isinstance(request_id, bool) or not isinstance(request_id, (str, int))):
        raise ProtocolError(INVALID_REQUEST, "id must be a string or an integer")
    if message.get("jsonrpc") != "2.0":
        raise ProtocolError(INVALID_REQUEST, 'jsonrpc must be "2.0"', request_id)
    if "method" in message:
        if not isinstance(message["method"], str) or not message["method"]:
            raise ProtocolError(INVALID_REQUEST, "method must be a non-empty string", request_id)
        params = message.get("params", {})
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise ProtocolError(INVALID_PARAMS, "params must be an object", request_id)
        message["params"] = params
        return message
    if request_id is None:
        raise ProtocolError(INVALID_REQUEST, "a response needs an id", None)
    if ("result" in message) == ("error" in message):
        raise ProtocolError(INVALID_REQUEST, "a response has exactly one of result and error", request_id)
    if "error" in message:
        err = message["error"]
        if not isinstance(err, dict) or not isinstance(err.get("code"), int) or not isinstance(err.get("message"), str):
            raise ProtocolError(INVALID_REQUEST, "error must be {code: int, message: str}", request_id)
    return message


def is_request(message: Message) -> bool:
    return "method" in message and "id" in message and message["id"] is not None


def is_notification(message: Message) -> bool:
    return "method" in message and message.get("id") is None


def is_response(message: Message) -> bool:
    return "method" not in message


def _dump(message: Message) -> str:
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False)
