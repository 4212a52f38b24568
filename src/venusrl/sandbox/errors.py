"""Errors of the sandbox service. `retryable` tells a caller whether trying again can work
(a node died, capacity is short, the sandbox moved) or cannot (bad input, unknown id)."""

from __future__ import annotations

from typing import Any


class SandboxError(Exception):
    retryable = False

    def to_wire(self) -> dict[str, Any]:
        # A subclass defined elsewhere (ImageError, say) travels as its nearest wire type.
        name = next(c.__name__ for c in type(self).__mro__ if c.__name__ in _TYPES)
        return {"type": name, "message": str(self)}


class InvalidRequest(SandboxError):
    """Bad input; the message names the field."""


class SandboxNotFound(SandboxError):
    """No live sandbox has this id."""


class PathNotFound(InvalidRequest):
    """A file or directory inside a sandbox does not exist."""


class ProcessNotFound(InvalidRequest):
    """No process of a sandbox's process table has this pid (it ended, or never was)."""


class ProtocolError(SandboxError):
    """A peer sent something that is not a valid message."""

    retryable = True


class AuthenticationError(SandboxError):
    """The connection did not present the node agent's token."""


class SandboxUnavailable(SandboxError):
    """The sandbox's node or process went away; it is being (or was) recovered elsewhere."""

    retryable = True


class CapacityError(SandboxError):
    """No node admits the sandbox now (Algorithm 1 refused everywhere)."""

    retryable = True


class AdmissionRefused(CapacityError):
    """This node refuses the sandbox; the controller redirects it."""


class SandboxMigrated(SandboxError):
    """The sandbox moved to another node while this call was in flight."""

    retryable = True


class TemplateError(SandboxError):
    """A template's setup failed; the message says which step."""


_TYPES = {
    cls.__name__: cls
    for cls in (
        SandboxError,
        InvalidRequest,
        SandboxNotFound,
        PathNotFound,
        ProcessNotFound,
        ProtocolError,
        AuthenticationError,
        SandboxUnavailable,
        CapacityError,
        AdmissionRefused,
        SandboxMigrated,
        TemplateError,
    )
}


def error_from_wire(data: dict[str, Any]) -> SandboxError:
    cls = _TYPES.get(str(data.get("type")), SandboxError)
    return cls(str(data.get("message", "unknown error")))
