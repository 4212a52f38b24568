"""Drives an `Engine` from one background thread for asyncio callers (the HTTP server,
rollout workers). Every engine call runs on that thread, between steps, so the engine
itself stays single-threaded; results come back through futures and per-request queues."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from venusrl.engine.engine import Engine, RequestOutput
from venusrl.types import Priority, SamplingParams

log = logging.getLogger(__name__)
T = TypeVar("T")


class EngineStopped(RuntimeError):
    """The engine thread has stopped (shut down or crashed); the request cannot proceed."""


class AsyncEngine:
    def __init__(self, engine: Engine):
        self.engine = engine
        self._commands: queue.Queue[tuple[Callable[[], Any], Future]] = queue.Queue()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._stopping = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="venusrl-engine", daemon=True)
        self._thread.start()

    def call(self, fn: Callable[[Engine], T]) -> Future[T]:
        """Run `fn(engine)` on the engine thread at the next iteration boundary."""
        future: Future[T] = Future()
        if self._error is not None or self._stopping.is_set():
            future.set_exception(EngineStopped(f"engine is not running ({self._error})"))
            return future
        self._commands.put((lambda: fn(self.engine), future))
        return future

    async def acall(self, fn: Callable[[Engine], T]) -> T:
        return await asyncio.wrap_future(self.call(fn))

    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        priority: Priority | None = None,
        trajectory_id: str | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Yields one output per step that produced tokens, the last with `finished` set.
        Leaving the iteration early (a client disconnect) aborts the request and frees its KV."""
        stream: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()

        def add(engine: Engine) -> str:
            request_id = engine.add_request(prompt_ids, sampling, priority, trajectory_id)
            self._streams[request_id] = (loop, stream)
            return request_id

        request_id = await self.acall(add)
        finished = False
        try:
            while not finished:
                item = await stream.get()
                if isinstance(item, BaseException):
                    raise EngineStopped(f"engine stopped while {request_id} was running") from item
                finished = item.finished
                yield item
        finally:
            if not finished:
                self.call(lambda engine: self._abort_if_live(engine, request_id))

    def abort(self, request_id: str) -> Future[RequestOutput | None]:
        """Abort a request from outside its stream (an operator, a fault): the stream's
        consumer receives the partial output, finished with reason "abort". None when the
        request had already finished."""

        def abort(engine: Engine) -> RequestOutput | None:
            if request_id not in engine.request_ids():
                return None
            output = engine.abort(request_id)
            self._deliver(output)
            log.info("request %s aborted from outside its stream", request_id)
            return output

        return self.call(abort)

    async def shutdown(self) -> None:
        self._stopping.set()
        self._commands.put((lambda: None, Future()))
        await asyncio.to_thread(self._thread.join)

    def _abort_if_live(self, engine: Engine, request_id: str) -> None:
        if self._streams.pop(request_id, None) is not None:
            engine.abort(request_id)
            log.info("request %s aborted by its caller", request_id)

    def _loop(self) -> None:
        try:
            # the last step did nothing (its waiting requests cannot be admitted) and no call
            # has arrived since: wait for one instead of spinning a core on empty steps
            idle = False
            while not self._stopping.is_set():
                if self._run_commands(block=not self.engine.has_work or idle):
                    idle = False
                if self.engine.has_work and not idle:
                    for output in self.engine.step():
                        self._deliver(output)
                    idle = self.engine.last_step_idle
        except BaseException as err:  # the thread must report, not vanish
            log.exception("engine loop crashed")
            self._error = err
        finally:
            self._fail_everything(self._error or EngineStopped("engine shut down"))

    def _run_commands(self, block: bool) -> bool:
        """Run the queued calls; whether there were any."""
        try:
            fn, future = self._commands.get(timeout=0.5) if block else self._commands.get_nowait()
        except queue.Empty:
            return False
        while True:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except Exception as err:  # delivered to the caller, the loop goes on
                    future.set_exception(err)
            try:
                fn, future = self._commands.get_nowait()
            except queue.Empty:
                return True

    def _deliver(self, output: RequestOutput) -> None:
        target = self._streams.get(output.request_id)
        if target is None:
            return
        if output.finished:
            del self._streams[output.request_id]
        loop, stream = target
        loop.call_soon_threadsafe(stream.put_nowait, output)

    def _fail_everything(self, error: BaseException) -> None:
        for loop, stream in self._streams.values():
            loop.call_soon_threadsafe(stream.put_nowait, error)
        self._streams.clear()
        while True:
            try:
                _, future = self._commands.get_nowait()
            except queue.Empty:
                return
            if future.set_running_or_notify_cancel():
                future.set_exception(EngineStopped(str(error)))
