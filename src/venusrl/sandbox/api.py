"""The Sandbox API in E2B's shape, sync and async, over a SandboxController.

    sandbox = Sandbox.create(controller, template="base", group_id="g1")
    result = sandbox.run("cd /tmp && export X=1")     # cwd and exports persist
    sandbox.files.write("notes.txt", "hi"); sandbox.files.read("notes.txt")
    sandbox.pause(); sandbox.resume(); sandbox.metrics(); sandbox.kill()

Relative paths are relative to /workspace, the sandbox's writable layer.
"""

from __future__ import annotations

import asyncio
import base64
from dataclasses import dataclass
from typing import Any

from venusrl.sandbox.controller import SandboxController
from venusrl.sandbox.template import Template


@dataclass(frozen=True)
class CommandResult:
    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool
    duration_s: float
    cwd: str


class Files:
    def __init__(self, sandbox: Sandbox) -> None:
        self._sandbox = sandbox

    def read(self, path: str, format: str = "text") -> str | bytes:
        raw = base64.b64decode(self._sandbox.controller.read(self._sandbox.sandbox_id, path)["data"])
        return raw if format == "bytes" else raw.decode()

    def write(self, path: str, data: str | bytes) -> str:
        raw = data.encode() if isinstance(data, str) else data
        return self._sandbox.controller.write(self._sandbox.sandbox_id, path, base64.b64encode(raw).decode())["path"]

    def list(self, path: str = ".") -> list[dict[str, Any]]:
        return self._sandbox.controller.list(self._sandbox.sandbox_id, path)


class Sandbox:
    def __init__(self, controller: SandboxController, sandbox_id: str) -> None:
        self.controller = controller
        self.sandbox_id = sandbox_id
        self.files = Files(self)

    @classmethod
    def create(cls, controller: SandboxController, template: str | Template = "base",
               group_id: str | None = None, memory_limit: int | None = None) -> Sandbox:
        return cls(controller, controller.create(template, group_id=group_id, memory_limit=memory_limit))

    def run(self, cmd: str, timeout: float = 60.0, cwd: str | None = None, env: dict[str, str] | None = None) -> CommandResult:
        r = self.controller.run(self.sandbox_id, cmd, timeout=timeout, cwd=cwd, env=env)
        return CommandResult(r["exit_code"], r["stdout"], r["stderr"], r["timed_out"], r["duration_s"], r["cwd"])

    def pause(self) -> None:
        self.controller.pause(self.sandbox_id)

    def resume(self) -> None:
        self.controller.resume(self.sandbox_id)

    def kill(self) -> None:
        self.controller.kill(self.sandbox_id)

    def metrics(self) -> dict[str, Any]:
        return self.controller.metrics(self.sandbox_id)


class AsyncSandbox:
    """The same API for asyncio callers; each call runs in a worker thread."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sync = sandbox
        self.sandbox_id = sandbox.sandbox_id

    @classmethod
    async def create(cls, controller: SandboxController, template: str | Template = "base",
                     group_id: str | None = None, memory_limit: int | None = None) -> AsyncSandbox:
        return cls(await asyncio.to_thread(Sandbox.create, controller, template, group_id, memory_limit))

    async def run(self, cmd: str, timeout: float = 60.0, cwd: str | None = None, env: dict[str, str] | None = None) -> CommandResult:
        return await asyncio.to_thread(self.sync.run, cmd, timeout, cwd, env)

    async def read(self, path: str, format: str = "text") -> str | bytes:
        return await asyncio.to_thread(self.sync.files.read, path, format)

    async def write(self, path: str, data: str | bytes) -> str:
        return await asyncio.to_thread(self.sync.files.write, path, data)

    async def list(self, path: str = ".") -> list[dict[str, Any]]:
        return await asyncio.to_thread(self.sync.files.list, path)

    async def pause(self) -> None:
        await asyncio.to_thread(self.sync.pause)

    async def resume(self) -> None:
        await asyncio.to_thread(self.sync.resume)

    async def kill(self) -> None:
        await asyncio.to_thread(self.sync.kill)

    async def metrics(self) -> dict[str, Any]:
        return await asyncio.to_thread(self.sync.metrics)
