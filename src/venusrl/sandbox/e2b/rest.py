"""E2B's REST API for the sandbox lifecycle (api.e2b.app), on the SandboxController.

create (POST /sandboxes, /v2/sandboxes), get, list (GET /sandboxes, /v2/sandboxes), kill
(DELETE), set_timeout (POST .../timeout), refresh, pause and resume (the node agent freezes
and thaws the sandbox's cgroup: its memory stays where it is), connect (resumes a paused
sandbox), metrics. Bodies are read by hand so a bad one is a 400 naming the field in E2B's
error shape, never FastAPI's own 422.
"""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from venusrl.sandbox.e2b import auth
from venusrl.sandbox.e2b.errors import RestError, rest_error
from venusrl.sandbox.e2b.sandboxes import DEFAULT_TIMEOUT_S, MAX_TIMEOUT_S, E2BSandbox, iso, utcnow
from venusrl.sandbox.e2b.service import ENVD_VERSION, E2BService
from venusrl.sandbox.errors import SandboxError, SandboxNotFound

log = logging.getLogger(__name__)

CLIENT_ID = "venusrl"
# Create options that ask for something these sandboxes do not do; accepted only when unset
# or at the value that asks for nothing.
UNSERVED = {"autoPause": False, "autoResume": None, "network": None, "mcp": None, "volumeMounts": None,
            "iam": None, "secure": None, "allow_internet_access": False}


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw:
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as err:
        raise RestError(400, f"body: not JSON ({err})") from None
    if not isinstance(body, dict):
        raise RestError(400, f"body: expected a JSON object, got {type(body).__name__}")
    return body


def _timeout(body: dict[str, Any], name: str = "timeout", default: int | None = DEFAULT_TIMEOUT_S) -> int | None:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_TIMEOUT_S:
        raise RestError(400, f"{name}: expected whole seconds in [0, {MAX_TIMEOUT_S}], got {value!r}")
    return value


def _strings(body: dict[str, Any], name: str) -> dict[str, str]:
    value = body.get(name) or {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise RestError(400, f"{name}: expected an object of strings, got {value!r}")
    return value


def _sandbox_json(record: E2BSandbox, token: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"templateID": record.template_id, "sandboxID": record.sandbox_id, "alias": record.template,
                           "clientID": CLIENT_ID, "envdVersion": ENVD_VERSION, "domain": None}
    if token:
        out["envdAccessToken"] = record.token
    return out


def _detail_json(record: E2BSandbox, token: bool) -> dict[str, Any]:
    return {**_sandbox_json(record, token), "startedAt": iso(record.started_at), "endAt": iso(record.end_at),
            "cpuCount": 1, "memoryMB": 0, "diskSizeMB": 0, "metadata": record.metadata,
            "state": "paused" if record.paused else "running"}


def build_router(service: E2BService) -> APIRouter:
    router = APIRouter()
    controller = service.controller

    def record_of(sandbox_id: str) -> E2BSandbox:
        record = service.table.get(sandbox_id)
        if record is None:
            raise RestError(404, f"sandbox {sandbox_id!r} not found")
        return record

    async def create(request: Request) -> JSONResponse:
        auth.check_api_key(request.headers, service.api_key)
        body = await _body(request)
        template_id = body.get("templateID")
        if not isinstance(template_id, str) or not template_id:
            raise RestError(400, f"templateID: expected a template id, got {template_id!r}")
        for name, neutral in UNSERVED.items():
            if body.get(name) not in (None, neutral):
                raise RestError(400, f"{name}: not served by venusrl sandboxes (they have no network, "
                                     "no volumes and no auto-pause); leave it unset")
        timeout = _timeout(body)
        metadata, env_vars = _strings(body, "metadata"), _strings(body, "envVars")
        template = service.template(template_id)
        try:
            sandbox_id = await service.call(controller.create, template)
        except SandboxError as err:
            raise rest_error(err) from None
        now = utcnow()
        record = E2BSandbox(sandbox_id, template_id, template.name, auth.new_access_token(), now, now,
                            metadata, env_vars)
        record.extend(now, timeout)
        service.table.add(record)
        log.info("e2b: sandbox %s created from template %s (timeout %ds)", sandbox_id, template_id, timeout)
        return JSONResponse(_sandbox_json(record, token=True), status_code=201)

    async def list_sandboxes(request: Request) -> JSONResponse:
        auth.check_api_key(request.headers, service.api_key)
        states = set(request.query_params.getlist("state")) or {"running", "paused"}
        states = {s for part in states for s in part.split(",")}
        if not states <= {"running", "paused"}:
            raise RestError(400, f"state: expected running or paused, got {sorted(states)}")
        wanted: dict[str, str] = {}
        for pair in filter(None, request.query_params.get("metadata", "").split("&")):
            key, sep, value = pair.partition("=")
            if not sep:
                raise RestError(400, f"metadata: expected key=value pairs joined by '&', got {pair!r}")
            wanted[key] = value
        records = [r for r in service.table.all()
                   if ("paused" if r.paused else "running") in states
                   and all(r.metadata.get(k) == v for k, v in wanted.items())]
        return JSONResponse([_detail_json(r, token=False) for r in records])

    async def get(sandbox_id: str, request: Request) -> JSONResponse:
        auth.check_api_key(request.headers, service.api_key)
        return JSONResponse(_detail_json(record_of(sandbox_id), token=True))

    async def kill(sandbox_id: str, request: Request) -> Response:
        auth.check_api_key(request.headers, service.api_key)
        record_of(sandbox_id)
        await kill_sandbox(service, sandbox_id, "killed")
        return Response(status_code=204)

    async def set_timeout(sandbox_id: str, request: Request) -> Response:
        auth.check_api_key(request.headers, service.api_key)
        body = await _body(request)
        if "timeout" not in body:
            raise RestError(400, "timeout: required (whole seconds from now)")
        timeout = _timeout(body)
        record_of(sandbox_id).extend(utcnow(), timeout)  # type: ignore[arg-type]
        return Response(status_code=204)

    async def refresh(sandbox_id: str, request: Request) -> Response:
        auth.check_api_key(request.headers, service.api_key)
        duration = _timeout(await _body(request), "duration", DEFAULT_TIMEOUT_S)
        record = record_of(sandbox_id)
        record.end_at = max(record.end_at, utcnow() + timedelta(seconds=duration))  # type: ignore[arg-type]
        return Response(status_code=204)

    async def pause(sandbox_id: str, request: Request) -> Response:
        auth.check_api_key(request.headers, service.api_key)
        await _body(request)
        record = record_of(sandbox_id)
        if record.paused:
            raise RestError(409, f"sandbox {sandbox_id!r} is already paused")
        await _lifecycle(service, controller.pause, sandbox_id)
        record.paused = True
        log.info("e2b: sandbox %s paused", sandbox_id)
        return Response(status_code=204)

    async def resume(sandbox_id: str, request: Request) -> JSONResponse:
        auth.check_api_key(request.headers, service.api_key)
        timeout = _timeout(await _body(request))
        record = record_of(sandbox_id)
        if not record.paused:
            raise RestError(409, f"sandbox {sandbox_id!r} is already running")
        await _resume(service, record, timeout)
        return JSONResponse(_sandbox_json(record, token=True), status_code=201)

    async def connect(sandbox_id: str, request: Request) -> JSONResponse:
        """Running: extend its life to at least `timeout` from now (200). Paused: resume (201)."""
        auth.check_api_key(request.headers, service.api_key)
        timeout = _timeout(await _body(request))
        record = record_of(sandbox_id)
        if record.paused:
            await _resume(service, record, timeout)
            return JSONResponse(_sandbox_json(record, token=True), status_code=201)
        now = utcnow()
        if record.end_at < now + timedelta(seconds=timeout):  # type: ignore[arg-type]
            record.extend(now, timeout)  # type: ignore[arg-type]
        return JSONResponse(_sandbox_json(record, token=True), status_code=200)

    async def metrics(sandbox_id: str, request: Request) -> JSONResponse:
        auth.check_api_key(request.headers, service.api_key)
        record_of(sandbox_id)
        found = await _lifecycle(service, controller.metrics, sandbox_id)
        now = utcnow()
        return JSONResponse([{"timestamp": iso(now), "timestampUnix": int(now.timestamp()), "cpuCount": 1,
                              "cpuUsedPct": 0.0, "memUsed": found["cgroup_bytes"], "memTotal": found["memory_limit"],
                              "memCache": 0, "diskUsed": found.get("disk_used_bytes", 0),
                              "diskTotal": found.get("disk_quota_bytes", 0)}])

    for path in ("/sandboxes", "/v2/sandboxes"):
        router.add_api_route(path, create, methods=["POST"])
        router.add_api_route(path, list_sandboxes, methods=["GET"])
    router.add_api_route("/sandboxes/{sandbox_id}", get, methods=["GET"])
    router.add_api_route("/sandboxes/{sandbox_id}", kill, methods=["DELETE"])
    router.add_api_route("/sandboxes/{sandbox_id}/timeout", set_timeout, methods=["POST"])
    router.add_api_route("/sandboxes/{sandbox_id}/refreshes", refresh, methods=["POST"])
    router.add_api_route("/sandboxes/{sandbox_id}/pause", pause, methods=["POST"])
    router.add_api_route("/sandboxes/{sandbox_id}/resume", resume, methods=["POST"])
    router.add_api_route("/sandboxes/{sandbox_id}/connect", connect, methods=["POST"])
    router.add_api_route("/v2/sandboxes/{sandbox_id}/connect", connect, methods=["POST"])
    router.add_api_route("/sandboxes/{sandbox_id}/metrics", metrics, methods=["GET"])
    return router


async def _lifecycle(service: E2BService, op: Any, sandbox_id: str) -> Any:
    try:
        return await service.call(op, sandbox_id)
    except SandboxError as err:
        raise rest_error(err) from None


async def _resume(service: E2BService, record: E2BSandbox, timeout: int | None) -> None:
    await _lifecycle(service, service.controller.resume, record.sandbox_id)
    record.paused = False
    record.extend(utcnow(), timeout or DEFAULT_TIMEOUT_S)
    log.info("e2b: sandbox %s resumed", record.sandbox_id)


async def kill_sandbox(service: E2BService, sandbox_id: str, why: str) -> None:
    """Forget the sandbox first, so its token stops working before its processes die; a kill
    that fails puts it back (reachable, and killed again by a retry or its expiry) and is
    E2B's error, not a 500."""
    record = service.table.pop(sandbox_id)
    if record is None:
        return
    try:
        await service.call(service.controller.kill, sandbox_id)
    except SandboxNotFound:
        pass
    except SandboxError as err:
        service.table.add(record)
        raise rest_error(err) from None
    log.info("e2b: sandbox %s %s", sandbox_id, why)
