"""Newline-delimited JSON messages, used on every sandbox-side socket.

Node agents additionally require a shared token as the first message of a connection, so
nothing else on the host can drive them. Errors travel as `{"ok": false, "error": {...}}`
and are rebuilt into the matching `SandboxError` subclass on the caller's side.
"""

from __future__ import annotations

import hmac
import json
from typing import Any, BinaryIO

from venusrl.sandbox.errors import ProtocolError, SandboxError, error_from_wire

MAX_MESSAGE_BYTES = 256 << 20  # files travel base64-encoded inside messages


def send(stream: BinaryIO, message: dict[str, Any]) -> None:
    stream.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")
    stream.flush()


def receive(stream: BinaryIO) -> dict[str, Any] | None:
    """The next message, or None at end of stream."""
    line = stream.readline(MAX_MESSAGE_BYTES + 1)
    if not line:
        return None
    if len(line) > MAX_MESSAGE_BYTES or not line.endswith(b"\n"):
        raise ProtocolError(f"message longer than {MAX_MESSAGE_BYTES} bytes or cut off")
    try:
        message = json.loads(line)
    except json.JSONDecodeError as err:
        raise ProtocolError(f"message is not JSON: {err}") from None
    if not isinstance(message, dict):
        raise ProtocolError(f"message must be a JSON object, got {type(message).__name__}")
    return message


def reply_ok(result: Any) -> dict[str, Any]:
    return {"ok": True, "result": result}


def reply_error(err: SandboxError) -> dict[str, Any]:
    return {"ok": False, "error": err.to_wire()}


def unwrap(message: dict[str, Any] | None, what: str) -> Any:
    """The result of a reply, or the error it carries raised as a SandboxError."""
    if message is None:
        raise ProtocolError(f"{what}: connection closed before a reply")
    if message.get("ok"):
        return message.get("result")
    raise error_from_wire(message.get("error") or {})


def token_matches(given: Any, expected: str) -> bool:
    return isinstance(given, str) and hmac.compare_digest(given.encode(), expected.encode())
