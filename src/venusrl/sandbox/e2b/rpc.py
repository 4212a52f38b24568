"""Connect endpoints on FastAPI: each RPC is a POST whose handler gets the authenticated
sandbox and the decoded request message. Every failure leaves as a Connect error: a unary
call's as its HTTP status and JSON body, a stream's in its end-of-stream envelope (HTTP
200, as the protocol has it), so the SDK raises its own exception for it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from venusrl.sandbox.e2b import connect
from venusrl.sandbox.e2b.connect import ConnectError
from venusrl.sandbox.e2b.errors import RestError, connect_error
from venusrl.sandbox.e2b.sandboxes import E2BSandbox
from venusrl.sandbox.e2b.service import E2BService
from venusrl.sandbox.errors import SandboxError

Unary = Callable[[E2BSandbox, dict[str, Any]], Awaitable[dict[str, Any]]]
ServerStream = Callable[[E2BSandbox, dict[str, Any], Request], Awaitable[AsyncIterator[bytes]]]

_REST_TO_CONNECT = {400: "invalid_argument", 401: "unauthenticated", 404: "not_found", 409: "failed_precondition",
                    502: "unavailable"}


def as_connect_error(err: Exception, sandbox_id: str) -> ConnectError:
    if isinstance(err, ConnectError):
        return err
    if isinstance(err, RestError):
        return ConnectError(_REST_TO_CONNECT.get(err.status, "internal"), err.message)
    assert isinstance(err, SandboxError)
    return connect_error(err, sandbox_id)


def unary(service: E2BService, handler: Unary) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        sandbox_id = request.headers.get("e2b-sandbox-id", "")
        try:
            record = service.envd_sandbox(request.headers)
            message = connect.parse_unary(await request.body())
            return JSONResponse(await handler(record, message))
        except (ConnectError, RestError, SandboxError) as err:
            error = as_connect_error(err, sandbox_id)
            return JSONResponse(error.to_json(), status_code=connect.HTTP_STATUS[error.code])

    return endpoint


def server_stream(service: E2BService, handler: ServerStream) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        sandbox_id = request.headers.get("e2b-sandbox-id", "")
        try:
            record = service.envd_sandbox(request.headers)
            message = connect.parse_stream_request(await request.body())
            body = await handler(record, message, request)
        except (ConnectError, RestError, SandboxError) as err:
            body = _single(connect.end_of_stream(as_connect_error(err, sandbox_id)))
        return StreamingResponse(body, media_type=connect.STREAM_CONTENT_TYPE)

    return endpoint


def unimplemented(service: E2BService, what: str, stream: bool = False) -> Callable[[Request], Awaitable[Response]]:
    async def handler(_record: E2BSandbox, _message: dict[str, Any], *_request: Request) -> Any:
        raise ConnectError("unimplemented", f"{what}: not served by venusrl sandboxes")

    return server_stream(service, handler) if stream else unary(service, handler)


async def _single(chunk: bytes) -> AsyncIterator[bytes]:
    yield chunk
