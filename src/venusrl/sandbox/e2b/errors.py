"""The sandbox service's errors in E2B's shapes: the REST API answers `{"code": status,
"message"}` with that HTTP status; envd answers Connect codes (connect.py). The SDK turns
them into its own exceptions: 404 and not_found into NotFoundException (a sandbox's
`... was not found` into SandboxNotRunningException), deadline_exceeded into
TimeoutException, 401 into AuthenticationException, the rest into SandboxException."""

from __future__ import annotations

from fastapi.responses import JSONResponse

from venusrl.sandbox.e2b.connect import ConnectError
from venusrl.sandbox.errors import (
    AuthenticationError,
    CapacityError,
    InvalidRequest,
    PathNotFound,
    ProcessNotFound,
    SandboxError,
    SandboxNotFound,
    SandboxUnavailable,
)


class RestError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def rest_response(err: RestError) -> JSONResponse:
    return JSONResponse({"code": err.status, "message": err.message}, status_code=err.status)


def sandbox_gone(sandbox_id: str) -> str:
    # The phrase the SDK recognises as "the sandbox is not running" (e2b.exceptions).
    return f"sandbox {sandbox_id!r} was not found"


# Most specific first: PathNotFound and ProcessNotFound are InvalidRequests.
_MAPPING: list[tuple[type[SandboxError], int, str]] = [
    (PathNotFound, 404, "not_found"),
    (ProcessNotFound, 404, "not_found"),
    (SandboxNotFound, 404, "not_found"),
    (InvalidRequest, 400, "invalid_argument"),
    (AuthenticationError, 401, "unauthenticated"),
    (CapacityError, 503, "resource_exhausted"),
    (SandboxUnavailable, 502, "unavailable"),
    (SandboxError, 500, "internal"),
]


def rest_error(err: SandboxError) -> RestError:
    status = next(s for cls, s, _ in _MAPPING if isinstance(err, cls))
    return RestError(status, str(err))


def connect_error(err: SandboxError, sandbox_id: str) -> ConnectError:
    code = next(c for cls, _, c in _MAPPING if isinstance(err, cls))
    if isinstance(err, SandboxNotFound):
        return ConnectError("not_found", sandbox_gone(sandbox_id))
    return ConnectError(code, str(err))
