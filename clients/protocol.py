"""The tunnel's wire protocol: frame shapes, method names, close codes, limits.

Shared by the platform's consumers and by the clients, so it lives here (the clients must stay
self-contained) and the server imports it from ``clients.protocol``. Standard library only;
keep it importable on Python 3.9.

Every WebSocket text frame is one JSON-RPC 2.0 message:
  request       {"jsonrpc": "2.0", "id": <str|int>, "method": str, "params": {...}}
  notification  {"jsonrpc": "2.0", "method": str, "params": {...}}
  result        {"jsonrpc": "2.0", "id": ..., "result": ...}
  error         {"jsonrpc": "2.0", "id": ..., "error": {"code": int, "message": str, "data": {...}}}
Binary frames carry device-web data only, between a platform and a device that both do them (see
"Binary data frames" below); ``parse`` refuses a binary frame.
"""

import json
from typing import Any, Dict, Optional, Tuple, Union

PROTOCOL_VERSION = 1
TUNNEL_PATH = "/ws/device"

# Limits. A frame larger than this is refused by both sides.
MAX_FRAME_BYTES = 4 * 1024 * 1024
DEFAULT_HEARTBEAT_SEC = 20
# Outbox sequence numbers (ack, ackedSeq) are 64-bit signed integers in the database: a larger one is refused.
MAX_SEQ = 2 ** 63 - 1
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
CLOSE_RATE_LIMITED = 4429  # too many invalid tokens from this address: retry later (backoff)
FINAL_CLOSE_CODES = frozenset({CLOSE_UNAUTHORIZED, CLOSE_REVOKED})

CLOSE_REASONS = {
    CLOSE_PROTOCOL_ABUSE: "too many malformed frames",
    CLOSE_UNAUTHORIZED: "the device token is not valid; pair this device again",
    CLOSE_REVOKED: "this device was revoked by its owner; pair it again to reconnect",
    CLOSE_HEARTBEAT_TIMEOUT: "no heartbeat",
    CLOSE_REPLACED: "replaced by a newer connection of the same device",
    CLOSE_RATE_LIMITED: "too many invalid device tokens from this address; try again later",
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


def _not_json_number(text: str) -> float:
    raise ValueError(f"{text} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):  # 1e400: the database and JSON.parse refuse it too
        raise ValueError(f"{text} is out of range")
    return value


def loads(text: Union[str, bytes]) -> Any:
    """JSON as the standard has it: NaN, Infinity and numbers past a double are refused (ValueError), not
    passed on to code (and databases) that cannot take them, as Python's json.loads would."""
    return json.loads(text, parse_constant=_not_json_number, parse_float=_finite)


def parse(text: Union[str, bytes]) -> Message:
    """Parse one frame. Raises ProtocolError with the JSON-RPC code to answer with."""
    if isinstance(text, bytes):
        raise ProtocolError(INVALID_REQUEST, "binary frames are not accepted; send JSON text")
    if len(text.encode("utf-8", "surrogatepass")) > MAX_FRAME_BYTES:
        raise ProtocolError(INVALID_REQUEST, f"frame larger than {MAX_FRAME_BYTES} bytes")
    try:
        message = loads(text)
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


# --- device web: HTTP and WebSocket streams through the tunnel ----------------------------------
# /d/<device>/<port>/<path> on the platform reaches 127.0.0.1:<port> on a bridge that declared the port
# in hello. Every stream frame is a notification whose params carry "stream" (a random id the platform
# picks); names and values of headers are [[name, value], ...] latin-1 strings.
#   platform -> device  web.open    {stream, port, method, path, query, headers, body: bool}
#   device -> platform  web.response {stream, status, reason, headers}
#   both ways           web.data    {stream, seq, data: base64}   seq counts 0, 1, 2 ... per direction
#                       web.end     {stream}                        the body is complete
#                       web.reset   {stream, reason, detail}        abort the stream (see WEB_RESET_* below)
#                       web.credit  {stream, bytes}                 the receiver consumed this much
#   WebSocket: platform -> device web.ws_open {stream, port, path, query, headers, subprotocols};
#   device -> platform web.ws_accept {stream, subprotocol}; both ways web.ws_frame {stream, seq, text}
#   or {stream, seq, data: base64} and web.ws_close {stream, code, reason}.
# Binary data frames (capability WEB_BINARY_CAPABILITY). A device that lists it in hello takes and sends
# the body bytes of web.data and the binary messages of web.ws_frame as WebSocket *binary* frames instead of
# base64 in JSON text: no base64, no JSON, no UTF-8 check of a text frame, on either end. Layout:
#   kind (1 byte: WEB_BIN_DATA | WEB_BIN_WS) | n = len(stream) (1 byte) | stream (n ASCII bytes)
#   | seq (4 bytes, big-endian) | payload (the raw bytes)
# Each stream decides at web.open / web.ws_open: the platform adds "binary": true only for a device that
# declared the capability, and then both ends of that stream use binary frames for its data, chunks up to
# WEB_BIN_CHUNK_BYTES and a window of WEB_BIN_WINDOW_BYTES. A stream opened without the flag (an older
# platform), or by a device without the capability (an older bridge), stays on the text frames and the
# smaller window below: both generations keep working together, no version bump. A binary stream's small
# response may also come whole in its web.response (WEB_INLINE_BODY_BYTES).
# Slow start (capability WEB_SLOW_START_CAPABILITY). For a device that declared it, the platform's web.open of
# an HTTP stream adds "first_credit": web_first_credit(window), and then:
#   - the device's credit for the response body starts at first_credit, not at the window;
#   - its web.response may carry, as "body" (base64) without "end", the first body bytes it already holds (at
#     most WEB_FIRST_BODY_BYTES; a response framed by Content-Length or by the connection's close only). They
#     cost credit as one data frame, and the web.data after them still count seq from 0;
#   - the platform writes the head (with those bytes) to the browser, then grants the rest of the window in one
#     web.credit.
# Until credit comes back, the device reads ahead from the local server at most WEB_SLOW_START_READ_AHEAD (before
# the response head is read, at most WEB_MAX_HEAD_BYTES more, for the head; a longer head resets the stream). So the
# head goes to the browser while the two processes of a big download are not yet flooding each other with its
# body, one CPU-bound core each. First bytes that the first credit would not cover stay out of the head. A
# device without the capability (an older bridge) gets no first_credit and starts with the whole window; a
# platform that sends none (an older one) gets the old behaviour.
# Flow control: each side may have at most WEB_WINDOW_BYTES of a stream's data in flight; a frame
# costs web_frame_cost(len(payload)) and the receiver returns credit as it hands data on. A slow
# reader therefore stalls only its own stream, and no stream has more than WEB_WINDOW_BYTES /
# WEB_MIN_FRAME_COST frames queued anywhere (the channel layer drops or refuses past its capacity).
WEB_OPEN = "web.open"
WEB_RESPONSE = "web.response"
WEB_DATA = "web.data"
WEB_END = "web.end"
WEB_RESET = "web.reset"
WEB_CREDIT = "web.credit"
WEB_WS_OPEN = "web.ws_open"
WEB_WS_ACCEPT = "web.ws_accept"
WEB_WS_FRAME = "web.ws_frame"
WEB_WS_CLOSE = "web.ws_close"

WEB_PORT_MIN = 20000
WEB_PORT_MAX = 20999
WEB_CHUNK_BYTES = 256 * 1024  # raw bytes per web.data (base64 makes the frame ~350 KB)
WEB_WINDOW_BYTES = 2 * 1024 * 1024
WEB_MIN_FRAME_COST = WEB_WINDOW_BYTES // 64  # so a stream of tiny frames (SSE) has at most 64 in flight
# Larger WebSocket messages close the socket (4009). At most half the window (a receiver returns credit
# in quarter-window batches, so a sender waiting for room for one more frame always gets it), and small
# enough that its base64 frame stays under daphne's default WebSocket message limit (1 MiB).
WEB_WS_MAX_MESSAGE = 512 * 1024
WEB_BINARY_CAPABILITY = "web.binary"
WEB_SLOW_START_CAPABILITY = "web.slow_start"
# The most body bytes a slow-start web.response carries. 4 KiB rather than 32: the smaller head frame reaches the
# browser sooner (bench/deviceweb.py --config embedded --runs 15, first byte of a 100 MB download, four pairs
# interleaved with 32 KiB: p50 7.00-7.95 ms, mean 7.57, against 7.85-8.03, mean 7.92), downloads the same.
WEB_FIRST_BODY_BYTES = 4 * 1024
WEB_SLOW_START_READ_AHEAD = 64 * 1024  # until the first grant, the device reads ahead at most this much
WEB_BIN_DATA = 1  # web.data {stream, seq, data}
WEB_BIN_WS = 2  # web.ws_frame {stream, seq, data} (a binary WebSocket message; text ones stay JSON)
WEB_BIN_CHUNK_BYTES = 1024 * 1024  # raw bytes per binary web.data (a frame is this + at most 106 bytes)
WEB_BIN_WINDOW_BYTES = 8 * 1024 * 1024  # a binary stream's window, each way
# On a binary stream, a response whose whole body is at most this long comes as one frame:
# web.response {stream, status, reason, headers, end: true, body: base64} (no web.data, no web.end).
WEB_INLINE_BODY_BYTES = 64 * 1024
WEB_MAX_HEAD_BYTES = 64 * 1024  # request or response line + headers
WEB_MAX_HEADERS = 100

# web.reset reasons (the platform shows them on a plain page when the response had not started)
WEB_RESET_PORT_NOT_EXPOSED = "port_not_exposed"  # the device does not serve this port
WEB_RESET_UNREACHABLE = "upstream_unreachable"  # nothing listens on 127.0.0.1:<port>
WEB_RESET_UPSTREAM_ERROR = "upstream_error"  # the local server broke the HTTP protocol or the connection
WEB_RESET_BAD_REQUEST = "bad_request"  # a malformed web.open
WEB_RESET_FLOW = "flow_control"  # more data than credit, or a seq gap (a frame was lost)
WEB_RESET_TIMEOUT = "timeout"
WEB_RESET_CANCELLED = "cancelled"  # the browser went away


def web_port_allowed(port: Any) -> bool:
    return isinstance(port, int) and not isinstance(port, bool) and WEB_PORT_MIN <= port <= WEB_PORT_MAX


def web_frame_cost(size: int, window: int = WEB_WINDOW_BYTES) -> int:
    """Credit one data or WebSocket frame of ``size`` payload bytes uses on a stream with ``window`` (same
    rule on both sides): at least 1/64 of the window, so at most 64 frames of a stream are in flight."""
    return max(int(size), window // 64)


def web_first_credit(window: int) -> int:
    """A slow-start stream's first credit (see above): two frames' minimum cost, e.g. the head's bytes and one
    more data frame."""
    return 2 * (window // 64)


def web_window(binary: bool) -> int:
    """A stream's flow-control window, each way (binary streams get the larger one)."""
    return WEB_BIN_WINDOW_BYTES if binary else WEB_WINDOW_BYTES


def web_chunk(binary: bool) -> int:
    """The largest data payload one frame of a stream carries."""
    return WEB_BIN_CHUNK_BYTES if binary else WEB_CHUNK_BYTES


WEB_BIN_MAX_HEAD = 2 + 255 + 4  # the longest head of a binary data frame (its bytes before the payload)


def web_binary_head(kind: int, stream: str, seq: int) -> bytes:
    """The bytes of a binary data frame before its payload (layout above)."""
    sid = stream.encode("ascii")
    if not 0 < len(sid) < 256 or not 0 <= seq < 2 ** 32:
        raise ValueError("a stream id of 1-255 ASCII bytes and a seq below 2**32")
    return b"".join((bytes((kind, len(sid))), sid, seq.to_bytes(4, "big")))


def web_binary(kind: int, stream: str, seq: int, payload: Union[bytes, bytearray, memoryview]) -> bytes:
    """One binary data frame (layout above)."""
    return b"".join((web_binary_head(kind, stream, seq), payload))


def parse_web_binary(frame: Union[bytes, bytearray, memoryview]) -> Tuple[int, str, int, bytes]:
    """(kind, stream, seq, payload) of a binary data frame; ProtocolError(INVALID_REQUEST) when malformed."""
    if len(frame) > MAX_FRAME_BYTES:
        raise ProtocolError(INVALID_REQUEST, f"frame larger than {MAX_FRAME_BYTES} bytes")
    if len(frame) < 7 or frame[0] not in (WEB_BIN_DATA, WEB_BIN_WS) or not frame[1] or len(frame) < 6 + frame[1]:
        raise ProtocolError(INVALID_REQUEST, "binary frames are web data frames only (see clients/protocol.py)")
    end = 2 + frame[1]
    try:
        stream = bytes(frame[2:end]).decode("ascii")
    except UnicodeDecodeError:
        raise ProtocolError(INVALID_REQUEST, "a binary frame's stream id must be ASCII") from None
    return frame[0], stream, int.from_bytes(frame[end:end + 4], "big"), bytes(frame[end + 4:])
