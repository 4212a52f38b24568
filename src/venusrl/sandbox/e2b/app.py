"""The E2B-compatible sandbox service: one FastAPI app that answers both the REST API
(`E2B_API_URL`) and envd (`E2B_SANDBOX_URL`; requests name their sandbox in the
`E2b-Sandbox-Id` header the SDK sends), over the SandboxController's node agents.

    E2B_API_URL=http://127.0.0.1:49999 E2B_SANDBOX_URL=http://127.0.0.1:49999 E2B_API_KEY=... python agent.py

A sandbox past its timeout is killed by the reaper loop, as E2B does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from venusrl.sandbox.e2b import envd_filesystem, envd_process, rest
from venusrl.sandbox.e2b.errors import RestError, rest_response
from venusrl.sandbox.e2b.sandboxes import utcnow
from venusrl.sandbox.e2b.service import E2BService

log = logging.getLogger(__name__)

REAP_INTERVAL_S = 1.0


def build_app(service: E2BService) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        reaper = asyncio.get_running_loop().create_task(_reap_expired(service))
        try:
            yield
        finally:
            reaper.cancel()

    app = FastAPI(title="venusrl E2B-compatible sandboxes", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.include_router(rest.build_router(service))
    app.include_router(envd_process.build_router(service))
    app.include_router(envd_filesystem.build_router(service))

    @app.exception_handler(RestError)
    async def _rest_error(_request: Request, err: RestError) -> JSONResponse:
        return rest_response(err)

    return app


async def _reap_expired(service: E2BService) -> None:
    while True:
        await asyncio.sleep(REAP_INTERVAL_S)
        for sandbox_id in service.table.expired(utcnow()):
            try:
                await rest.kill_sandbox(service, sandbox_id, "reached its timeout")
            except Exception:  # noqa: BLE001 - one failed kill must not stop the reaper
                log.exception("e2b: could not kill expired sandbox %s", sandbox_id)


class E2BServer:
    """The service on a uvicorn server in a thread (tests, benchmarks, `venusrl sandbox
    serve --e2b`); `url` is what E2B_API_URL and E2B_SANDBOX_URL are set to."""

    def __init__(self, service: E2BService, host: str = "127.0.0.1", port: int = 0) -> None:
        self.service = service
        # IPPROTO_TCP named explicitly: asyncio sets TCP_NODELAY only on sockets that say so,
        # and without it every response waits ~40 ms for the client's delayed ACK.
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))
        self.host, self.port = self._socket.getsockname()[:2]
        self.url = f"http://{self.host}:{self.port}"
        config = uvicorn.Config(build_app(service), log_level="warning", access_log=False, lifespan="on",
                                timeout_graceful_shutdown=2)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]},
                                        name="e2b-server", daemon=True)

    def start(self) -> E2BServer:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the E2B service did not start on {self.url}")
            time.sleep(0.01)
        log.info("e2b: serving on %s", self.url)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._socket.close()
        self.service.close()

    def __enter__(self) -> E2BServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @contextlib.contextmanager
    def sdk_environment(self) -> Iterator[None]:
        """Within the block, the e2b SDK of this process talks to this service, configured as
        a user would configure it: E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY."""
        names = ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY")
        saved = {name: os.environ.get(name) for name in names}
        os.environ.update(E2B_API_URL=self.url, E2B_SANDBOX_URL=self.url, E2B_API_KEY=self.service.api_key)
        try:
            yield
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
