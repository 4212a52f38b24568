"""What every E2B endpoint shares: the controller, the E2B table, the API key, template
lookup, and a thread pool for the controller's blocking calls (its node-agent round trips
must not stall the event loop that streams other sandboxes' output)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from venusrl.sandbox.controller import SandboxController
from venusrl.sandbox.e2b import auth
from venusrl.sandbox.e2b.errors import RestError, sandbox_gone
from venusrl.sandbox.e2b.sandboxes import E2BSandbox, SandboxTable
from venusrl.sandbox.template import Template

T = TypeVar("T")

ENVD_VERSION = "0.5.7"  # the envd whose features are served: stdin close, octet-stream upload, default user


class E2BService:
    def __init__(self, controller: SandboxController, api_key: str, image_store: str | Path | None = None,
                 workers: int = 128) -> None:
        if not api_key:
            raise ValueError("api_key: the E2B service needs a non-empty API key")
        self.controller = controller
        self.api_key = api_key
        self.image_store = image_store
        self.table = SandboxTable()
        self.executor = ThreadPoolExecutor(workers, thread_name_prefix="e2b")

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, functools.partial(fn, *args, **kwargs))

    def template(self, template_id: str) -> Template:
        """An E2B template id is one of our templates by name, or an imported image by name
        (`venusrl sandbox image import`), run as its image template."""
        known = self.controller.templates.get(template_id)
        if known is not None:
            return known
        if self.image_store is not None:
            from venusrl.sandbox.image.store import ImageStore
            from venusrl.sandbox.image.templates import image_template

            if any(record.name == template_id for record in ImageStore(self.image_store).images()):
                return image_template(template_id)
        names = sorted(self.controller.templates)
        raise RestError(404, f"templateID: no template {template_id!r} (templates: {', '.join(names)}; "
                             "or the name of an imported image)")

    def envd_sandbox(self, headers: Mapping[str, str]) -> E2BSandbox:
        """The sandbox an envd request names, once its access token is checked."""
        sandbox_id = auth.sandbox_named(headers)
        record = self.table.get(sandbox_id)
        if record is None:
            raise RestError(502, sandbox_gone(sandbox_id))
        auth.check_access_token(headers, record.token)
        if record.paused:  # its init is frozen: a call would wait for the resume
            raise RestError(409, f"sandbox {sandbox_id!r} is paused; Sandbox.connect resumes it")
        return record

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)

