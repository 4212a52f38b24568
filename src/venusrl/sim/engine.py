"""A simulated rollout engine: the real `venusrl.engine.scheduler.Scheduler` (and through it
the real radix cache, page allocator and demotion) driven like `Engine.step` drives it, with
the cost model in place of the model runner.

Each iteration: queued weight updates and KV imports are applied at the boundary, then
`schedule()` forms the batch, the cost model says how long it runs, and when that time has
passed `on_batch_done()` gets one fresh token id per sampled item (a token stands for a unit
of `quantum` real tokens; ids are unique, so the radix cache shares exactly the prefixes a
real run would: a group's prompt and a trajectory's own history). Finished requests go to the
owner's callback.

The host tier is the scheduler's own (`engine/host_tier.py`: bounded, LRU, dropped with the
device cache at a weight update under `recompute`, as SGLang's HiRadixCache.reset drops its
host pool): the batch's host-to-device copies are priced as reloads, its computed chunks as
prefill over their prefix.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from venusrl.engine.batch import Batch
from venusrl.engine.config import EngineConfig
from venusrl.engine.request import PartialOutput
from venusrl.engine.scheduler import Scheduler
from venusrl.engine.stats import EngineLoad
from venusrl.engine.step_log import batch_shape, computes_prefill
from venusrl.sim.cost_model import ITERATION_TERMS, CostModel
from venusrl.sim.events import EventLoop
from venusrl.types import Priority, SamplingParams

log = logging.getLogger(__name__)


@dataclass(slots=True)
class EngineTotals:
    """busy_s = weight_sync_s + the sum of term_s (the cost model's ITERATION_TERMS)."""

    iterations: int = 0
    busy_s: float = 0.0
    weight_sync_s: float = 0.0
    term_s: list[float] = field(default_factory=lambda: [0.0] * len(ITERATION_TERMS))
    prefill_units: int = 0
    reload_units: int = 0
    decode_units: int = 0
    weight_updates: int = 0
    imports: int = 0


@dataclass(slots=True)
class SimEngine:
    index: int
    loop: EventLoop
    config: EngineConfig  # in units of `quantum` tokens
    cost: CostModel
    quantum: int
    token_ids: itertools.count  # shared by the whole simulation
    on_finished: Callable[[int, PartialOutput], None]  # (engine index, output)
    weight_sync_s: float = 0.0
    scheduler: Scheduler = field(init=False)
    weight_version: int = 0
    totals: EngineTotals = field(default_factory=EngineTotals)
    _pending_version: int | None = None
    _imports: list[tuple[list[int], str, Priority]] = field(default_factory=list)
    _running: bool = False  # an iteration is in flight or scheduled
    _calls_s: float = 0.0  # the rollout side's calls made since the last step, to run before the next

    def __post_init__(self) -> None:
        self.scheduler = Scheduler(self.config)

    # ---- the rollout worker's calls (the same as on the real Engine) ----------------------

    def add_request(self, request_id: str, prompt_ids: list[int], max_new_units: int,
                    priority: Priority, trajectory_id: str) -> None:
        self.scheduler.add_request(request_id, prompt_ids, SamplingParams(max_new_tokens=max_new_units),
                                   priority, trajectory_id)
        self._call()
        self._wake()

    def abort(self, request_id: str) -> PartialOutput:
        self._call()
        return self.scheduler.abort(request_id)

    # A queued trajectory change can free or unlock KV that a waiting request needs, so each
    # wakes an idle engine (the real engine steps while it has work).
    def start_trajectory(self, trajectory_id: str, priority: Priority) -> None:
        self.scheduler.start_trajectory(trajectory_id, priority)
        self._call()
        self._wake_if_waiting()

    def release_trajectory(self, trajectory_id: str) -> None:
        self.scheduler.release_trajectory(trajectory_id)
        self._call()
        self._wake_if_waiting()

    def set_priority(self, trajectory_id: str, priority: Priority) -> None:
        self.scheduler.set_priority(trajectory_id, priority)
        self._call()
        self._wake_if_waiting()

    def update_weights(self, version: int) -> None:
        self._pending_version = version
        self._call()
        self._wake()

    def queue_import(self, token_ids: list[int], trajectory_id: str, priority: Priority) -> None:
        """Adopt a migrated trajectory with the KV of `token_ids` (already copied over)."""
        self._imports.append((token_ids, trajectory_id, priority))
        self._call()
        self._wake()

    def demoted_trajectories(self) -> frozenset[str]:
        """Trajectories residency-aware demotion has made LOW (ThunderAgent's paused programs)."""
        self._call()
        return self._demoted()

    def load(self) -> EngineLoad:
        self._call()
        stats = self.scheduler.stats()
        return EngineLoad.from_stats(stats, self._demoted())

    def cached_prefix_units(self, token_ids: list[int]) -> int:
        """The prefix of `token_ids` cached here: what a move sends from this engine."""
        self._call()
        return len(self.scheduler.cached_prefix_slots(token_ids))

    def _demoted(self) -> frozenset[str]:
        return frozenset(map(str, self.scheduler.demoted_trajectories()))

    # ---- iterations ------------------------------------------------------------------------

    def _wake_if_waiting(self) -> None:
        if self.scheduler.waiting:
            self._wake()

    def _call(self) -> None:
        """A call from the rollout side runs on the engine's loop between its steps
        (`CostModel.call_s`): while the engine steps it delays the next step; an idle engine
        runs it while idle, unless the call wakes it (`_wake`)."""
        if self._running:
            self._calls_s += self.cost.call_s

    def _wake(self) -> None:
        if not self._running:
            self._running = True
            self._calls_s = self.cost.call_s  # the call that woke it runs before its first step
            self.loop.after(0.0, self._iterate)

    def _iterate(self) -> None:
        if self._calls_s > 0:  # the calls made since the last step run first (not busy: not a step)
            calls, self._calls_s = self._calls_s, 0.0
            self.loop.after(calls, self._iterate)
            return
        stall = self._apply_boundary()
        batch = self.scheduler.schedule()
        for output in batch.finished:  # a lone request outgrew the pool
            self.on_finished(self.index, output)
        if not batch.items:
            self._running = False
            if stall:
                self.totals.busy_s += stall
                self.totals.weight_sync_s += stall
            return
        seconds = stall + self._seconds(batch)
        self.totals.iterations += 1
        self.totals.busy_s += seconds
        self.totals.weight_sync_s += stall
        handover = self.cost.handover_seconds(self.quantum, sum(item.sample for item in batch.items))
        self.loop.after(seconds, lambda: self._complete(batch, handover))

    def _apply_boundary(self) -> float:
        stall = 0.0
        if self._pending_version is not None:
            self.weight_version, self._pending_version = self._pending_version, None
            if self.config.kv_after_weight_update == "recompute":
                dropped = self.scheduler.drop_all_kv()
                log.debug("engine %d: weights v%d, %d cached units dropped", self.index, self.weight_version, dropped)
            self.totals.weight_updates += 1
            stall = self.weight_sync_s
        for token_ids, trajectory_id, priority in self._imports:
            self.scheduler.start_trajectory(trajectory_id, priority)
            slots, offset = self.scheduler.reserve_prefix(token_ids)
            self.scheduler.commit_prefix(token_ids, slots, offset, trajectory_id)
            self.totals.imports += 1
        self._imports.clear()
        return stall

    def _seconds(self, batch: Batch) -> float:
        """Computed chunks start past their cached and loaded prefix (`positions[0]`); the
        host-to-device copies are the loads. Device-to-host saves are not priced: HiCache
        writes them back asynchronously, overlapped with the forward passes."""
        prefill, contexts = batch_shape(batch.items)
        chunks = [(item.positions[0], len(item.token_ids)) for item in batch.items if computes_prefill(item)]
        loads = [len(copy.host_slots) for copy in batch.kv_copies if not copy.to_host]
        self.totals.prefill_units += prefill
        self.totals.reload_units += sum(loads)
        self.totals.decode_units += len(contexts)
        terms = self.cost.iteration_terms(self.quantum, prefill, contexts, sum(loads), chunks, len(loads))
        self.totals.term_s = [total + term for total, term in zip(self.totals.term_s, terms, strict=True)]
        return sum(terms)

    def _complete(self, batch: Batch, handover_s: float) -> None:
        """The step's outputs go out as it ends; the next iteration starts once they are
        handed over (`CostModel.handover_seconds`: not busy, as the engine's own step log
        does not count it)."""
        requests = self.scheduler.requests
        sampled = {}
        for item in batch.items:
            request = requests.get(item.request_id)
            if request is None:
                continue  # aborted while the batch ran
            if item.sample:
                sampled[item.request_id] = next(self.token_ids)
        for output in self.scheduler.on_batch_done(batch, sampled):
            self.on_finished(self.index, output)
        if handover_s > 0:
            self.loop.after(handover_s, self._iterate)
        else:
            self._iterate()
