"""The Connect protocol as the E2B SDK speaks it to envd: JSON encoding, HTTP/1.1.

Unary calls are a POST of `application/json` answered by one JSON object, or on failure by
an HTTP error status and `{"code", "message"}`. A server-streaming call's request and
response bodies are envelopes: one flags byte, a 4-byte big-endian length, the JSON
message; the response ends with an end-of-stream envelope (flags 0x02) that carries the
error, if any, as `{"error": {"code", "message"}}`. The SDK decodes with
`ignore_unknown_fields`, so fields it does not know are harmless and only the ones it
reads matter (protobuf's JSON mapping: lowerCamelCase names, bytes in base64, 64-bit
integers as strings, enums by name).
"""

from __future__ import annotations

import json
import struct
from typing import Any

END_STREAM = 0x02
COMPRESSED = 0x01
STREAM_CONTENT_TYPE = "application/connect+json"
UNARY_CONTENT_TYPE = "application/json"
MAX_MESSAGE_BYTES = 16 << 20

# Connect code -> HTTP status of a unary error (connectrpc.com/docs/protocol#error-codes).
HTTP_STATUS = {
    "canceled": 499, "unknown": 500, "invalid_argument": 400, "deadline_exceeded": 504,
    "not_found": 404, "already_exists": 409, "permission_denied": 403, "resource_exhausted": 429,
    "failed_precondition": 400, "aborted": 409, "out_of_range": 400, "unimplemented": 501,
    "internal": 500, "unavailable": 503, "data_loss": 500, "unauthenticated": 401,
}


class ConnectError(Exception):
    """An RPC's failure with its Connect code; the message names the field when the
    request is at fault."""

    def __init__(self, code: str, message: str) -> None:
        assert code in HTTP_STATUS, code
        super().__init__(message)
        self.code = code
        self.message = message

    def to_json(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


def envelope(message: dict[str, Any], flags: int = 0) -> bytes:
    data = json.dumps(message, separators=(",", ":")).encode()
    return struct.pack(">BI", flags, len(data)) + data


def end_of_stream(error: ConnectError | None = None) -> bytes:
    return envelope({"error": error.to_json()} if error is not None else {}, END_STREAM)


def parse_unary(body: bytes) -> dict[str, Any]:
    return _json_object(body)


def parse_stream_request(body: bytes) -> dict[str, Any]:
    """The single request message of a server-streaming call."""
    if len(body) < 5:
        raise ConnectError("invalid_argument", "body: a streaming request must be one 5-byte-prefixed envelope")
    flags, length = struct.unpack(">BI", body[:5])
    if flags & COMPRESSED:
        raise ConnectError("invalid_argument", "body: compressed envelopes are not accepted (send identity)")
    if length != len(body) - 5:
        raise ConnectError("invalid_argument", f"body: envelope says {length} bytes, {len(body) - 5} follow")
    return _json_object(body[5:])


def _json_object(data: bytes) -> dict[str, Any]:
    if len(data) > MAX_MESSAGE_BYTES:
        raise ConnectError("resource_exhausted", f"body: message over {MAX_MESSAGE_BYTES} bytes")
    try:
        message = json.loads(data or b"{}")
    except (ValueError, UnicodeDecodeError) as err:
        raise ConnectError("invalid_argument", f"body: not JSON ({err})") from None
    if not isinstance(message, dict):
        raise ConnectError("invalid_argument", f"body: expected a JSON object, got {type(message).__name__}")
    return message


# -- protobuf JSON mapping of the fields the services read ---------------------------------
def field(message: dict[str, Any], name: str, kind: type, default: Any = None, where: str = "") -> Any:
    """`message[name]` checked to be `kind` (an int field may come as a decimal string, as
    protobuf's JSON mapping allows); a wrong type is invalid_argument naming the field."""
    value = message.get(name, default)
    if value is None or value is default:
        return default
    if kind is int and isinstance(value, str) and decimal(value.removeprefix("-")):
        value = int(value)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ConnectError("invalid_argument", f"{where}{name}: expected {kind.__name__}, got {value!r}")
    return value


def selected_pid(message: dict[str, Any]) -> int:
    """A ProcessSelector: `{"pid": N}` (a `tag` selector is not served)."""
    selector = field(message, "process", dict, None)
    if selector is None:
        raise ConnectError("invalid_argument", "process: a process selector is required")
    if "tag" in selector and "pid" not in selector:
        raise ConnectError("unimplemented", "process.tag: selecting a process by tag is not served; use its pid")
    pid = field(selector, "pid", int, None, "process.")
    if pid is None or pid <= 0:
        raise ConnectError("invalid_argument", f"process.pid: expected a positive pid, got {selector.get('pid')!r}")
    return pid


def timeout_ms(header: str | None) -> float | None:
    """Connect-Timeout-Ms as seconds; None when absent."""
    if header is None:
        return None
    if not decimal(header) or len(header) > 10:
        raise ConnectError("invalid_argument", f"Connect-Timeout-Ms: expected up to 10 digits, got {header!r}")
    return int(header) / 1000.0


def decimal(text: str) -> bool:
    """ASCII digits only: str.isdigit also takes '²' or '¹', which int() refuses."""
    return text.isascii() and text.isdigit()
