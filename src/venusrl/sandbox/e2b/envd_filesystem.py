"""envd's `filesystem.Filesystem` service and its `/files` HTTP endpoint: read and write
files (multipart or octet-stream uploads, as the SDK sends them), stat, list to a depth,
make directories, move, remove, and `/health`. Every operation runs in the sandbox's own
mount namespace through its init (sandbox/fs_ops.py), as the sandbox's own user.
Relative paths are relative to /workspace (E2B's are to the user's home)."""

from __future__ import annotations

import base64
import gzip
import zlib
from datetime import datetime, timezone
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from venusrl.sandbox.e2b import rpc
from venusrl.sandbox.e2b.connect import ConnectError, field
from venusrl.sandbox.e2b.errors import RestError, rest_error, rest_response
from venusrl.sandbox.e2b.multipart import parse_multipart
from venusrl.sandbox.e2b.sandboxes import E2BSandbox
from venusrl.sandbox.e2b.service import E2BService
from venusrl.sandbox.errors import SandboxError

MAX_UPLOAD_BYTES = 256 << 20  # one file through the node agent's JSON protocol (protocol.MAX_MESSAGE_BYTES)
FILE_TYPES = {"file": "FILE_TYPE_FILE", "dir": "FILE_TYPE_DIRECTORY"}


def entry_json(entry: dict[str, Any]) -> dict[str, Any]:
    out = {"name": entry["name"], "type": FILE_TYPES[entry["type"]], "path": entry["path"], "size": str(entry["size"]),
           "mode": entry["mode"], "permissions": entry["permissions"], "owner": entry["owner"], "group": entry["group"],
           "modifiedTime": datetime.fromtimestamp(entry["mtime"], timezone.utc).isoformat().replace("+00:00", "Z")}
    if entry["symlink_target"] is not None:
        out["symlinkTarget"] = entry["symlink_target"]
    return out


def _path(message: dict[str, Any], name: str = "path") -> str:
    value = field(message, name, str, None)
    if not value:
        raise ConnectError("invalid_argument", f"{name}: required")
    return value


def build_router(service: E2BService) -> APIRouter:
    router = APIRouter()
    controller = service.controller

    async def envd(record: E2BSandbox, op: str, **fields: Any) -> Any:
        return await service.call(controller.envd, record.sandbox_id, op, **fields)

    async def stat(record: E2BSandbox, message: dict[str, Any]) -> dict[str, Any]:
        return {"entry": entry_json(await envd(record, "stat", path=_path(message)))}

    async def list_dir(record: E2BSandbox, message: dict[str, Any]) -> dict[str, Any]:
        depth = field(message, "depth", int, 1) or 1
        found = await envd(record, "entries", path=_path(message), depth=depth)
        return {"entries": [entry_json(e) for e in found]}

    async def make_dir(record: E2BSandbox, message: dict[str, Any]) -> dict[str, Any]:
        path = _path(message)
        if not await envd(record, "make_dir", path=path):
            raise ConnectError("already_exists", f"path: {path} already exists")
        return {"entry": entry_json(await envd(record, "stat", path=path))}

    async def move(record: E2BSandbox, message: dict[str, Any]) -> dict[str, Any]:
        moved = await envd(record, "move", path=_path(message, "source"), destination=_path(message, "destination"))
        return {"entry": entry_json(moved)}

    async def remove(record: E2BSandbox, message: dict[str, Any]) -> dict[str, Any]:
        await envd(record, "remove", path=_path(message))
        return {}

    async def read_file(request: Request) -> Response:
        try:
            record = service.envd_sandbox(request.headers)
            path = _query_path(request)
            data = base64.b64decode((await envd(record, "read", path=path))["data"])
        except RestError as err:
            return rest_response(err)
        except SandboxError as err:
            return rest_response(rest_error(err))
        return Response(data, media_type="application/octet-stream")

    async def write_file(request: Request) -> Response:
        try:
            record = service.envd_sandbox(request.headers)
            files = await _uploads(request)
            written = []
            for path, data in files:
                result = await envd(record, "write", path=path, data=base64.b64encode(data).decode())
                written.append({"name": result["path"].rsplit("/", 1)[-1], "type": "file", "path": result["path"]})
        except RestError as err:
            return rest_response(err)
        except SandboxError as err:
            return rest_response(rest_error(err))
        return JSONResponse(written)

    async def health(request: Request) -> Response:
        try:
            service.envd_sandbox(request.headers)
        except RestError as err:
            return rest_response(err)
        return Response(status_code=204)

    base = "/filesystem.Filesystem"
    for name, handler in (("Stat", stat), ("ListDir", list_dir), ("MakeDir", make_dir), ("Move", move),
                          ("Remove", remove)):
        router.add_api_route(f"{base}/{name}", rpc.unary(service, handler), methods=["POST"])
    for name in ("WatchDir", "CreateWatcher", "GetWatcherEvents", "RemoveWatcher"):
        handler = rpc.unimplemented(service, f"{name} (directory watch)", stream=name == "WatchDir")
        router.add_api_route(f"{base}/{name}", handler, methods=["POST"])
    router.add_api_route("/files", read_file, methods=["GET"])
    router.add_api_route("/files", write_file, methods=["POST"])
    router.add_api_route("/health", health, methods=["GET"])
    return router


def _query_path(request: Request) -> str:
    path = request.query_params.get("path")
    if not path:
        raise RestError(400, "path: query parameter required")
    return path


async def _uploads(request: Request) -> list[tuple[str, bytes]]:
    """(path, bytes) of each uploaded file: an octet-stream body (maybe gzip-encoded) to
    `?path=`, or multipart/form-data parts named by their filename (or `?path=` for one)."""
    body = await request.body()
    if len(body) > MAX_UPLOAD_BYTES:
        raise RestError(413, f"body: over {MAX_UPLOAD_BYTES} bytes")
    content_type = request.headers.get("content-type", "")
    if content_type.startswith("application/octet-stream"):
        if request.headers.get("content-encoding", "").lower() == "gzip":
            try:
                body = gzip.decompress(body)
            except (OSError, EOFError, zlib.error) as err:
                raise RestError(400, f"body: not gzip ({err})") from None
        return [(_query_path(request), body)]
    if content_type.startswith("multipart/form-data"):
        parts = parse_multipart(body, content_type)
        single = request.query_params.get("path")
        if single and len(parts) == 1:
            return [(single, parts[0][1])]
        for name, _ in parts:
            if not name:
                raise RestError(400, "file: each multipart part needs a filename (the file's path)")
        return parts
    raise RestError(400, f"Content-Type: expected application/octet-stream or multipart/form-data, got {content_type!r}")
