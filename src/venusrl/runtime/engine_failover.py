"""Losing a rollout engine mid-run (its process, node or link gone) costs time, not turns.

`EngineFailover` stands between the rollout worker and the run's engines: the worker (and
its core) keep the engine indices they started with, each served by a `FailoverEngine`
client. While engine i lives, client i is engine i. Once engine i is lost, client i (and any
other client it served) is served by the live engine serving the fewest clients, so the
core's slots and placements stay valid and no scheduling code learns of the loss.

A turn in flight on a lost engine is not failed: `FailoverEngine.generate` keeps every token
the lost engine delivered (ids, log-probs, weight versions: what the trainer reads), re-issues
the turn on its new engine from the prompt plus those tokens (the survivor recomputes that
prefix, less what it has cached), and the caller sees one stream. Tokens the lost engine
sampled but never delivered are sampled again; nothing is delivered twice, since a lost
engine's connection is dropped before its turns move (a link that comes back brings no late
output).

An engine is lost when:
- a call or stream on it ends with `EngineStopped` and a health probe then gets no live
  answer within `probe_timeout_s` (a killed process or node refuses at once);
- the watchdog's periodic liveness probe of an engine in another process (a `ping` its
  process answers, not its engine thread) gets no answer within `probe_timeout_s` (a cut
  link: nothing errs, everything hangs); its connection is then dropped, failing what
  waits on it.
So a link cut is detected within `watch_interval_s + probe_timeout_s`.

With a `replace` callback (the Ray runtime: a new engine actor wherever the cluster has room
for one, e.g. the lost node once it is back), a lost engine's replacement is started at
once; when ready it is `pending` until the next weight push has reached it (it starts from
the base model), then `admit` makes it serve its client again. No restart of the run.

Invariant: `serving[i]` is never a lost engine while any engine lives; once none does, every
call raises `AllEnginesLost` (the run stops; `venusrl train` resumes from its checkpoint).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from venusrl.engine.async_engine import EngineStopped
from venusrl.engine.client import EngineClient, KVAddress
from venusrl.engine.engine import RequestOutput
from venusrl.types import Priority, SamplingParams

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 10.0  # health waits for the engine thread's current step; ping answers at once
WATCH_INTERVAL_S = 5.0
REPLACE_RETRY_S = 5.0


class AllEnginesLost(EngineStopped):
    """No engine is left to serve the run."""


@dataclass(slots=True)
class EngineLoss:
    engine: int
    reason: str
    turns_resumed: int = 0
    tokens_recomputed: int = 0
    # the longest one of its resumed turns went without a token: from its last token there (or
    # its submission) to its first on the survivor; detection included (a cut link's whole wait)
    recovery_s: float = 0.0


Replace = Callable[[int], Awaitable[EngineClient]]  # lost engine index -> its replacement, started


class EngineFailover:
    def __init__(self, engines: list[EngineClient], probe_timeout_s: float = PROBE_TIMEOUT_S,
                 watch_interval_s: float = WATCH_INTERVAL_S, replace: Replace | None = None) -> None:
        self.engines = engines  # updated in place when a replacement is admitted
        self.probe_timeout_s, self.watch_interval_s = probe_timeout_s, watch_interval_s
        self.replace = replace
        self.serving = list(range(len(engines)))  # client index -> engine index
        self.losses: dict[int, EngineLoss] = {}  # lost engine index -> its loss, until a replacement is admitted
        self.records: list[EngineLoss] = []  # every loss of the run
        self.pending: dict[int, EngineClient] = {}  # lost engine index -> its replacement, before its first push
        self.replaced = 0
        self.clients = [FailoverEngine(self, index) for index in range(len(engines))]
        self.closing = False  # the run is ending: an engine stopping is expected
        self.all_lost = asyncio.Event()
        self._probes: dict[int, asyncio.Task] = {}
        self._replacing: dict[int, asyncio.Task] = {}

    def live(self) -> list[int]:
        return [i for i in range(len(self.engines)) if i not in self.losses]

    def engine_for(self, client: int) -> tuple[int, EngineClient]:
        if not self.live():
            raise AllEnginesLost(f"every engine is lost ({self._reasons()})")
        index = self.serving[client]
        return index, self.engines[index]

    async def check(self, index: int, error: Exception) -> None:
        """A call on engine `index` failed with `error` (EngineStopped): probe it, and lose it
        when it does not answer alive. Concurrent failures share one probe."""
        if self.closing:
            raise error
        if index in self.losses:
            return
        probe = self._probes.get(index)
        if probe is None:
            probe = self._probes[index] = asyncio.create_task(self._probe(self.engines[index]))
            probe.add_done_callback(lambda _: self._probes.pop(index, None))
        alive, why = await asyncio.shield(probe)
        if not alive:
            self.lose(index, f"{error}; probe: {why}")

    async def answers(self, engine: EngineClient) -> bool:
        """Whether `engine`'s process answers within `probe_timeout_s`."""
        return (await self._probe(engine, liveness=True))[0]

    async def _probe(self, engine: EngineClient, liveness: bool = False) -> tuple[bool, str]:
        """(alive, why): the engine's health (its engine thread runs), or with `liveness` only
        that its process answers (`ping`, where the client has it: a long weight load on
        the engine thread is no loss; else its health)."""
        ping = getattr(engine, "ping", None) if liveness else None
        try:
            if ping is not None:
                await asyncio.wait_for(ping(), self.probe_timeout_s)
                return True, "alive"
            health = await asyncio.wait_for(engine.health(), self.probe_timeout_s)
        except asyncio.TimeoutError:
            return False, f"no answer within {self.probe_timeout_s:g} s"
        except Exception as err:  # an unreachable engine: whatever its client raises
            return False, f"{type(err).__name__}: {err}"
        return health.alive, health.error or "alive"

    def lose(self, index: int, reason: str) -> None:
        """Engine `index` is gone: its connection is dropped (nothing late comes back from
        it) and the clients it served move to the live engines serving the fewest."""
        if index in self.losses:
            return
        self.losses[index] = EngineLoss(index, reason)
        self.records.append(self.losses[index])
        disconnect = getattr(self.engines[index], "disconnect", None)
        if disconnect is not None:
            disconnect(f"engine {index} lost")
        live, moved_to = self.live(), set()
        for client, engine in enumerate(self.serving):
            if engine == index and live:
                self.serving[client] = min(live, key=self.serving.count)
                moved_to.add(self.serving[client])
        if not live:
            self.all_lost.set()
        log.info("engine %d lost (%s); its clients are served by engine(s) %s", index, reason,
                 sorted(moved_to) or "none")
        if self.replace is not None and not self.closing:
            self._replacing[index] = asyncio.get_running_loop().create_task(self._replacement(index))

    async def _replacement(self, index: int) -> None:
        """Start engine `index`'s replacement (it may wait for room in the cluster); pending
        once it answers. A failed start is tried again every REPLACE_RETRY_S until the run
        ends: Ray can place it on the lost node itself before it has declared that node dead."""
        try:
            while True:
                try:
                    engine = await self.replace(index)
                    break
                except Exception as err:
                    log.info("engine %d: replacement failed (%s: %s); trying again in %g s", index,
                             type(err).__name__, str(err).splitlines()[0] if str(err) else "", REPLACE_RETRY_S)
                    await asyncio.sleep(REPLACE_RETRY_S)
        finally:
            self._replacing.pop(index, None)
        self.pending[index] = engine
        log.info("engine %d: replacement %s ready; it serves from the next weight push", index,
                 getattr(engine, "name", type(engine).__name__))

    def admit(self, index: int) -> None:
        """Engine `index`'s replacement took the current weights: it serves client `index`
        again (clients moved elsewhere at the loss move back; turns running there finish there)."""
        self.engines[index] = self.pending.pop(index)
        del self.losses[index]
        self.serving[index] = index
        self.replaced += 1
        log.info("engine %d replaced: %s serves again", index, getattr(self.engines[index], "name", "the new engine"))

    def drop_pending(self, index: int, why: str) -> EngineClient:
        """A replacement that failed before its admission: engine `index` stays lost."""
        log.warning("engine %d: replacement dropped (%s); the others serve on", index, why)
        return self.pending.pop(index)

    def stop_replacing(self) -> None:
        for task in self._replacing.values():
            task.cancel()

    def resumed(self, lost: int, tokens: int, waited_s: float) -> None:
        loss = self.losses.get(lost)
        # None: it answered the probe alive (a dropped connection, not a loss), or, rarely, its
        # replacement was admitted before this turn's first token elsewhere (then not counted)
        if loss is None:
            return
        loss.turns_resumed += 1
        loss.tokens_recomputed += tokens
        loss.recovery_s = max(loss.recovery_s, waited_s)

    async def watch(self) -> None:
        """Ping each live engine in another process every `watch_interval_s`; lose one that
        does not answer. An engine in this process has no link to lose: it is not pinged."""
        while True:
            await asyncio.sleep(self.watch_interval_s)
            for index in self.live():
                if not hasattr(self.engines[index], "ping"):
                    continue
                alive, why = await self._probe(self.engines[index], liveness=True)
                if not alive and not self.closing:
                    self.lose(index, f"watchdog: {why}")

    def stats(self) -> dict[str, float]:
        losses = self.records
        return {"engines_lost": len(losses), "engines_replaced": self.replaced,
                "turns_resumed": sum(loss.turns_resumed for loss in losses),
                "tokens_recomputed": sum(loss.tokens_recomputed for loss in losses),
                "engine_recovery_s": round(max((loss.recovery_s for loss in losses), default=0.0), 3)}

    def _reasons(self) -> str:
        return "; ".join(f"engine {loss.engine}: {loss.reason}" for loss in self.records)


class FailoverEngine:
    """Client `index` of an `EngineFailover`: the `EngineClient` of whichever engine serves it."""

    def __init__(self, failover: EngineFailover, index: int) -> None:
        self.failover, self.index = failover, index
        self.name = f"engine client {index}"

    async def _call(self, method: str, *args: Any) -> Any:
        """The call on the serving engine; once more on its successor when that engine is lost."""
        engine_index, engine = self.failover.engine_for(self.index)
        try:
            return await getattr(engine, method)(*args)
        except EngineStopped as err:
            await self.failover.check(engine_index, err)
            retry_index, retry = self.failover.engine_for(self.index)
            if retry_index == engine_index:
                raise
            return await getattr(retry, method)(*args)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, priority: Priority | None = None,
                       trajectory_id: str | None = None) -> AsyncIterator[RequestOutput]:
        kept = RequestOutput("", trajectory_id, len(prompt_ids), [], [], [], [], [])  # delivered by lost engines
        lost: tuple[int, float] | None = None  # (lost engine, the turn's last token there) until it generates again
        while True:
            engine_index, engine = self.failover.engine_for(self.index)
            left = sampling.max_new_tokens - len(kept.output_ids)
            if left <= 0:  # every token came before the loss, the end did not
                yield replace(kept, new_token_ids=[], new_logprobs=[], finished=True, finish_reason="length")
                return
            context = list(prompt_ids) + kept.output_ids
            latest: RequestOutput | None = None
            last_token_at = time.monotonic()
            try:
                async for output in engine.generate(context, replace(sampling, max_new_tokens=left), priority,
                                                    trajectory_id):
                    if lost is not None:
                        self.failover.resumed(lost[0], len(context), time.monotonic() - lost[1])
                        log.info("trajectory %s: turn resumed on engine %d from %d recorded tokens (%d generated "
                                 "before the loss)", trajectory_id, engine_index, len(context), len(kept.output_ids))
                        lost = None
                    latest, last_token_at = output, time.monotonic()
                    yield _joined(kept, output) if kept.output_ids else output
                return
            except EngineStopped as err:
                await self.failover.check(engine_index, err)
                if latest is not None:
                    kept = _joined(kept, latest)
                lost = lost or (engine_index, last_token_at)

    def set_priority(self, trajectory_id: str, priority: Priority) -> None:
        with contextlib.suppress(AllEnginesLost):
            self.failover.engine_for(self.index)[1].set_priority(trajectory_id, priority)

    async def abort(self, request_id: str) -> RequestOutput | None:
        return await self._call("abort", request_id)

    async def start_trajectory(self, trajectory_id: str, priority: Priority) -> None:
        await self._call("start_trajectory", trajectory_id, priority)

    async def release_trajectory(self, trajectory_id: str) -> bool:
        return await self._call("release_trajectory", trajectory_id)

    async def demoted_trajectories(self) -> frozenset[str]:
        return await self._call("demoted_trajectories")

    async def load(self) -> Any:
        return await self._call("load")

    async def stats(self) -> Any:
        return await self._call("stats")

    async def steps_since(self, index: int) -> Any:
        return await self._call("steps_since", index)

    async def export_prefix(self, token_ids: list[int]) -> Any:
        return await self._call("export_prefix", token_ids)

    async def import_prefix(self, token_ids: list[int], kv: Any, trajectory_id: str | None = None) -> int:
        return await self._call("import_prefix", token_ids, kv, trajectory_id)

    async def send_prefix(self, token_ids: list[int], target: EngineClient, trajectory_id: str | None = None) -> int:
        return await self._call("send_prefix", token_ids, target, trajectory_id)

    @property
    def kv_address(self) -> KVAddress | None:
        return self.failover.engine_for(self.index)[1].kv_address

    def info(self) -> Any:
        return self.failover.engines[self.index].info()

    async def update_weights(self, state_dict: dict, version: int) -> None:
        await self._call("update_weights", state_dict, version)

    async def health(self) -> Any:
        return await self._call("health")

    async def shutdown(self) -> None:
        """The engines are shut down by their owner (`RolloutService.close`), once each."""


def _joined(kept: RequestOutput, output: RequestOutput) -> RequestOutput:
    """`output` of a turn re-issued after `kept` was delivered: its totals prefixed by kept's."""
    return replace(output, prompt_len=kept.prompt_len, output_ids=kept.output_ids + output.output_ids,
                   logprobs=kept.logprobs + output.logprobs, weight_versions=kept.weight_versions + output.weight_versions)
