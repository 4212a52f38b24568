"""Drives an `Engine` from one background thread for asyncio callers (the HTTP server,
rollout workers). Every engine call runs on that thread, between steps, so the engine
itself stays single-threaded; results come back through futures and per-request queues.

A crash inside a step (an exception no single request owns: the forward, the scheduler) does
not end the service: the thread rebuilds the engine over the same weights (`Engine.rebuilt`)
and re-issues every in-flight request from its partial output, so callers see one stream
that carries on. A second crash in a row may be a request's doing (an input the forward
cannot take): the requests of that crash's batch are held and re-issued one at a time, each
a probe until it has run one step, and a crash with a probe in its batch fails that probe
alone. `EngineConfig.max_restarts` crashes in a row (no step completed between them) and
the engine is dead: every request fails with `EngineStopped` and `alive` is False (the HTTP
server's /health answers 503, so a supervisor restarts the process)."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, TypeVar

import torch

from venusrl.engine.client import (
    EngineClient,
    EngineHealth,
    EngineInfo,
    PrefixKV,
    copy_prefix,
)
from venusrl.engine.engine import Engine, RequestOutput
from venusrl.engine.kv_pool import HostKV
from venusrl.engine.stats import EngineLoad, EngineStats
from venusrl.engine.step_log import StepLogSlice
from venusrl.types import Priority, SamplingParams

log = logging.getLogger(__name__)
T = TypeVar("T")


class EngineStopped(RuntimeError):
    """The engine thread has stopped (shut down or crashed); the request cannot proceed."""


class RequestFailed(RuntimeError):
    """This request failed inside a step (its sampling); the engine serves on."""


@dataclass(slots=True, eq=False)
class _Stream:
    """One request's consumer and what is needed to re-issue it on a rebuilt engine."""

    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    prompt_ids: list[int]
    sampling: SamplingParams
    priority: Priority | None
    trajectory_id: str | None
    delivered: RequestOutput | None = None  # the newest output its consumer was given
    prefix: RequestOutput | None = None  # the output before the last re-issue, prepended to later ones


class AsyncEngine:
    """The in-process `EngineClient`: the engine on a thread of this process."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.restarts = 0
        self.iterations = 0  # engine-loop iterations (a step, or a wait for calls), for observers
        self._progress = threading.Condition()
        self._commands: queue.Queue[tuple[Callable[[], Any], Future]] = queue.Queue()
        self._streams: dict[str, _Stream] = {}
        self._held: list[str] = []  # suspects of repeated crashes, not yet re-issued
        # items for stream queues, by consumer loop, handed over once per iteration (`_flush`):
        # one cross-thread hop per loop per step, not one per request and token
        self._outbox: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, Any]]] = {}
        self._probe: str | None = None  # the suspect re-issued last, until it has run one step
        # the engine's demoted trajectories as of its latest iteration or call, republished by
        # the engine thread when they change (a reference swap: read from any thread)
        self._demoted: frozenset[str] = frozenset()
        self._demoted_read: tuple[object, int] | None = None  # (the engine's cache, its demoted_changes) then
        self._demoted_watchers: list[Callable[[], None]] = []
        self._stopping = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="venusrl-engine", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._error is None and self._thread.is_alive()

    @property
    def demoted(self) -> frozenset[str]:
        """The trajectories the engine has demoted, as of its latest iteration or call (safe
        from any thread)."""
        return self._demoted

    def watch_demoted(self, watcher: Callable[[], None]) -> Callable[[], None]:
        """Call `watcher()` on the engine thread each time `demoted` changes (whether or not
        that iteration produced outputs: a stalled engine demotes too); returns the call that
        stops it. The wire server pushes the set to its clients so."""
        self._demoted_watchers.append(watcher)

        def unwatch() -> None:
            if watcher in self._demoted_watchers:
                self._demoted_watchers.remove(watcher)

        return unwatch

    @property
    def kv_address(self) -> None:
        return None  # in the caller's process: KV moves by export and import

    def info(self) -> EngineInfo:
        engine = self.engine
        args = engine.runner.model.args
        return EngineInfo(args.vocab_size, args.max_position_embeddings, engine.config.kv_capacity_tokens,
                          engine.config.page_size, tuple(engine.eos_token_ids))

    @property
    def error(self) -> BaseException | None:
        """Why the engine died, or None."""
        return self._error

    def call(self, fn: Callable[[Engine], T]) -> Future[T]:
        """Run `fn(engine)` on the engine thread at the next iteration boundary. For code in
        this process that owns the engine (tests, tools); callers of an engine go through the
        `EngineClient` methods below, which work on a remote engine too."""
        future: Future[T] = Future()
        if self._error is not None or self._stopping.is_set():
            future.set_exception(EngineStopped(f"engine is not running ({self._error})"))
            return future
        self._commands.put((lambda: fn(self.engine), future))
        return future

    async def acall(self, fn: Callable[[Engine], T]) -> T:
        return await asyncio.wrap_future(self.call(fn))

    def _submit(self, method: Callable[..., T], *args: Any) -> Future[T]:
        """Queue `method(engine, *args)` for the engine thread: an `Engine` method, or one of
        this class's `_on_engine_*` steps, applied to the engine of that moment (a crash may
        rebuild it in between). The typed methods below are built on this alone."""
        return self.call(partial(_apply, method, args))

    async def _run(self, method: Callable[..., T], *args: Any) -> T:
        return await asyncio.wrap_future(self._submit(method, *args))

    def wait_iterations(self, count: int, timeout: float) -> bool:
        """Block until the engine loop has run `count` more iterations (or stopped); False on
        timeout."""
        with self._progress:
            target = self.iterations + count
            return self._progress.wait_for(
                lambda: self.iterations >= target or self._error is not None or self._stopping.is_set(), timeout)

    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        priority: Priority | None = None,
        trajectory_id: str | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Yields one output per step that produced tokens, the last with `finished` set.
        Leaving the iteration early (a client disconnect) aborts the request and frees its KV.
        Raises `RequestFailed` when this request fails alone, `EngineStopped` when the engine
        died."""
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue(), list(prompt_ids), sampling, priority,
                         trajectory_id)

        request_id = await self._run(self._on_engine_add, stream)
        finished = False
        try:
            while not finished:
                item = await stream.queue.get()
                if isinstance(item, RequestFailed):
                    raise item
                if isinstance(item, BaseException):
                    raise EngineStopped(f"engine stopped while {request_id} was running") from item
                finished = item.finished
                if item.finish_reason == "error":
                    raise RequestFailed(f"request {request_id} failed: {item.error}")
                yield item
        finally:
            if not finished:
                self._submit(self._abort_if_live, request_id)

    async def abort(self, request_id: str) -> RequestOutput | None:
        """Abort a request from outside its stream (an operator, a fault): the stream's
        consumer receives the partial output, finished with reason "abort". None when the
        request had already finished."""
        return await self._run(self._on_engine_abort, request_id)

    # ---- EngineClient: trajectories, KV, weights, observability ----------------------------

    def set_priority(self, trajectory_id: str, priority: Priority) -> None:
        self._submit(Engine.set_priority, trajectory_id, priority)  # queued in call order

    async def start_trajectory(self, trajectory_id: str, priority: Priority) -> None:
        await self._run(Engine.start_trajectory, trajectory_id, priority)

    async def release_trajectory(self, trajectory_id: str) -> bool:
        return await self._run(Engine.release_trajectory, trajectory_id)

    async def demoted_trajectories(self) -> frozenset[str]:
        return self._demoted  # published after every iteration and call: no wait for the engine thread

    async def load(self) -> EngineLoad:
        return await self._run(self._on_engine_load)

    async def stats(self) -> EngineStats:
        return await self._run(Engine.typed_stats)

    async def steps_since(self, index: int) -> StepLogSlice:
        return await self._run(Engine.steps_since, index)

    async def export_prefix(self, token_ids: list[int]) -> PrefixKV:
        tokens, kv = await self._run(Engine.export_prefix, list(token_ids))
        return PrefixKV(tokens, kv)

    async def import_prefix(self, token_ids: list[int], kv: HostKV, trajectory_id: str | None = None) -> int:
        return await self._run(Engine.import_prefix, list(token_ids), kv, trajectory_id)

    async def send_prefix(self, token_ids: list[int], target: EngineClient, trajectory_id: str | None = None) -> int:
        return await copy_prefix(self, target, token_ids, trajectory_id)

    async def update_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        await self._run(Engine.update_weights, state_dict, version)

    async def weight_digest(self) -> str:
        """The served weights' fingerprint, taken between two steps (never mid-update)."""
        return await self._run(Engine.weight_digest)

    async def health(self) -> EngineHealth:
        if not self.alive:
            return EngineHealth(False, self.engine.weight_version, self.restarts, str(self._error or "stopped"))
        version = await self._run(self._on_engine_version)
        return EngineHealth(True, version, self.restarts)

    async def shutdown(self) -> None:
        self._stopping.set()
        self._commands.put((lambda: None, Future()))
        await asyncio.to_thread(self._thread.join)

    # ---- steps run on the engine thread (through `_submit`) --------------------------------

    def _on_engine_add(self, engine: Engine, stream: _Stream) -> str:
        request_id = engine.add_request(stream.prompt_ids, stream.sampling, stream.priority, stream.trajectory_id)
        self._streams[request_id] = stream
        return request_id

    def _on_engine_abort(self, engine: Engine, request_id: str) -> RequestOutput | None:
        if request_id in self._held:
            return self._abort_held(request_id)
        if request_id not in engine.request_ids():
            return None
        output = self._deliver(engine.abort(request_id))
        log.info("request %s aborted from outside its stream", request_id)
        return output

    def _on_engine_load(self, engine: Engine) -> EngineLoad:
        stats = engine.scheduler.stats()
        return EngineLoad.from_stats(stats, self._demoted)

    @staticmethod
    def _on_engine_version(engine: Engine) -> int:
        return engine.weight_version


    def _abort_if_live(self, engine: Engine, request_id: str) -> None:

        if self._streams.pop(request_id, None) is not None:
            if request_id in self._held:
                self._held.remove(request_id)
            else:
                engine.abort(request_id)
            log.info("request %s aborted by its caller", request_id)

    def _abort_held(self, request_id: str) -> RequestOutput | None:
        """A held request is in no engine: its abort is its last delivered output."""
        self._held.remove(request_id)
        stream = self._streams[request_id]
        if stream.delivered is None:
            del self._streams[request_id]
            self._post(stream, RequestFailed(f"request {request_id} aborted"))
            return None
        return self._deliver(replace(stream.delivered, new_token_ids=[], new_logprobs=[], finished=True,
                                     finish_reason="abort"))

    def _loop(self) -> None:
        crashes = 0  # in a row, with no step completed between them
        # the last step did nothing (its waiting requests cannot be admitted) and no call
        # has arrived since: wait for one instead of spinning a core on empty steps
        idle = False
        try:
            while not self._stopping.is_set():
                try:
                    if self._probe not in self._streams:
                        self._probe = None  # ended (finished, aborted, failed): the next one may go
                    if self._probe is None and self._held:
                        self._probe_next()
                        idle = False
                    had_request = self.engine.has_work
                    waits = not had_request or idle  # for a call: nothing to step until one comes
                    waited_from = time.monotonic()
                    calls_s = self._run_commands(block=waits)
                    if calls_s is not None:
                        idle = False
                    if waits:  # the calls' own time is theirs, not the wait's
                        self.engine.step_log.record_wait(time.monotonic() - waited_from - (calls_s or 0.0),
                                                         had_request)
                    self._flush()  # what the calls delivered (an abort's output) goes before the step
                    self.engine.release_idle_trajectories()
                    if self.engine.has_work and not idle:
                        for output in self.engine.step():
                            self._deliver(output)
                        idle, crashes = self.engine.last_step_idle, 0
                        if self._probe in self.engine.batch_ids:
                            self._probe = None  # it ran a step: cleared
                    self._publish_demoted()
                except Exception:
                    crashes += 1
                    if crashes > self.engine.config.max_restarts:
                        raise
                    log.exception("engine crashed (%d in a row); rebuilding it", crashes)
                    self._restart(crashes)
                    idle = False
                self._flush()
                with self._progress:
                    self.iterations += 1
                    self._progress.notify_all()
        except BaseException as err:  # the thread must report, not vanish
            log.exception("engine loop crashed for good")
            self._error = err
        finally:
            self._fail_everything(self._error or EngineStopped("engine shut down"))
            with self._progress:
                self._progress.notify_all()

    def _restart(self, crashes: int) -> None:
        """Rebuild the engine; re-issue its requests, but for a probe in the crash's batch
        (failed alone) and, from the second crash in a row, the rest of that batch (held)."""
        crashed = set(self.engine.batch_ids)
        failed = self._probe if self._probe in crashed else None
        if failed is not None:
            self._probe = None
        elif crashes >= 2:
            self._held += [rid for rid in self.engine.batch_ids if rid in self._streams and rid != self._probe]
        self.engine = self.engine.rebuilt()
        self.restarts += 1
        for request_id, stream in list(self._streams.items()):
            if request_id == failed:
                del self._streams[request_id]
                log.warning("request %s failed alone: the engine crashed with it in the batch", request_id)
                self._post(stream, RequestFailed(
                    f"request {request_id} failed: the engine crashed on it (it was re-issued alone)"))
            elif request_id not in self._held:
                self._reissue(request_id, stream)
        log.info("engine rebuilt: %d requests re-issued, %d held to re-issue one at a time",
                 len(self._streams) - len(self._held), len(self._held))

    def _probe_next(self) -> None:
        request_id = self._held.pop(0)
        self._probe = request_id
        self._reissue(request_id, self._streams[request_id])

    def _reissue(self, request_id: str, stream: _Stream) -> None:
        """Add the request again, its prompt extended by what it had produced; its later
        outputs are stitched onto that prefix (`_deliver`)."""
        done = stream.delivered
        produced = done.output_ids if done is not None else []
        remaining = stream.sampling.max_new_tokens - len(produced)
        if remaining <= 0:
            self._deliver(replace(done, new_token_ids=[], new_logprobs=[], finished=True, finish_reason="length"))
            return
        seed = stream.sampling.seed
        sampling = replace(stream.sampling, max_new_tokens=remaining,
                           seed=None if seed is None else seed + len(produced))  # the same seeds per position
        # a caller trajectory's priority was carried over by `rebuilt`; an implicit one is the request's
        priority = stream.priority if stream.trajectory_id is None else None
        try:
            self.engine.add_request(stream.prompt_ids + produced, sampling, priority, stream.trajectory_id,
                                    request_id=request_id)
        except ValueError as err:  # the longer prompt no longer fits: this request fails alone
            del self._streams[request_id]
            self._post(stream, RequestFailed(str(err)))
            return
        stream.prefix = done

    def _run_commands(self, block: bool) -> float | None:
        """Run the queued calls; the seconds they took (recorded in the step log), or None
        when there were none."""
        try:
            fn, future = self._commands.get(timeout=0.5) if block else self._commands.get_nowait()
        except queue.Empty:
            return None
        started = time.monotonic()
        while True:
            if future.set_running_or_notify_cancel():
                try:
                    result = fn()
                except Exception as err:  # delivered to the caller, the loop goes on
                    future.set_exception(err)
                else:  # what the call changed is published before its caller hears back
                    self._publish_demoted()
                    future.set_result(result)
            try:
                fn, future = self._commands.get_nowait()
            except queue.Empty:
                seconds = time.monotonic() - started
                self.engine.step_log.record_calls(seconds)
                return seconds

    def _publish_demoted(self) -> None:
        """Republish the demoted set if it changed: read again only when the cache's change
        count moved, or the cache is another one (the engine was rebuilt)."""
        cache = self.engine.scheduler.cache
        read = self._demoted_read
        if read is not None and read[0] is cache and read[1] == cache.demoted_changes:
            return
        self._demoted_read = (cache, cache.demoted_changes)
        demoted = frozenset(str(key) for key in self.engine.scheduler.demoted_trajectories())
        if demoted != self._demoted:
            self._demoted = demoted
            for watcher in list(self._demoted_watchers):
                try:
                    watcher()
                except Exception:  # a watcher's failure (its loop closed) is not the engine's
                    log.exception("a watcher of the demoted set failed")

    def _deliver(self, output: RequestOutput) -> RequestOutput:
        """Hand an output to its stream (stitched onto the output before a re-issue); returns
        what the consumer got."""
        stream = self._streams.get(output.request_id)
        if stream is None:
            return output
        if stream.prefix is not None:
            output = _stitched(stream.prefix, output)
        stream.delivered = output
        if output.finished:
            del self._streams[output.request_id]
        self._post(stream, output)
        return output

    def _post(self, stream: _Stream, item: Any) -> None:
        self._outbox.setdefault(stream.loop, []).append((stream.queue, item))

    def _flush(self) -> None:
        outbox, self._outbox = self._outbox, {}
        for loop, items in outbox.items():
            try:
                loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:  # the consumers' loop is closed: nobody is left to read
                log.debug("%d stream items dropped: their event loop is closed", len(items))

    def _fail_everything(self, error: BaseException) -> None:
        for stream in self._streams.values():
            self._post(stream, error)
        self._streams.clear()
        self._flush()
        while True:
            try:
                _, future = self._commands.get_nowait()
            except queue.Empty:
                return
            if future.set_running_or_notify_cancel():
                future.set_exception(EngineStopped(str(error)))


def _put_all(items: list[tuple[asyncio.Queue, Any]]) -> None:
    for queue_, item in items:
        queue_.put_nowait(item)


def _stitched(prefix: RequestOutput, output: RequestOutput) -> RequestOutput:
    """`output` of a re-issued request as its consumer sees it: the prompt it first sent, and
    everything produced before the re-issue ahead of what came after."""
    return replace(output, prompt_len=prefix.prompt_len, output_ids=prefix.output_ids + output.output_ids,
                   logprobs=prefix.logprobs + output.logprobs,
                   weight_versions=prefix.weight_versions + output.weight_versions)


def _apply(method: Callable[..., T], args: tuple, engine: Engine) -> T:
    return method(engine, *args)
