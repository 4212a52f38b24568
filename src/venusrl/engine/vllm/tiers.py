"""`TrajectoryScheduler`: trajectory-aware residency and residency-aware demotion (paper §4.3)
on vLLM 0.32, as far as its scheduler's extension points reach. It runs inside vLLM's
engine-core process (named by qualname in `scheduler_cls`); what to hold, release and demote is
decided by `kv_holds.HoldBook` (pure), this class applies it to vLLM's block pool.

`engine.cache_policy: lru` keeps vLLM's own behaviour (no holds, no demotion: SGLang/vLLM's
LRU prefix cache, as the baselines run); the class then only counts recomputed tokens and
memory stalls (admission stopped for want of blocks).
`tiers` adds (source lines of vllm 0.32.0, `vllm/v1/`):
- Holds. vLLM hands a finishing or preempted request's blocks back in
  `Scheduler._free_request_blocks` (core/sched/scheduler.py:2766); hashed blocks go to the
  tail of its free queue, the unused tier, where any allocation may take them. Before they go,
  a live trajectory takes one reference on each of its hashed blocks (`BlockPool.touch`,
  core/block_pool.py:752), so they stay out of the free queue; the reference is handed back
  (`BlockPool.free_blocks`, :774, tail blocks first) when the trajectory's next request has
  been allocated (it then references the blocks itself), when the trajectory is released,
  when a later request of it replaces the hold, or when the hold is evicted.
- Eviction by tier. vLLM has no hook where it runs short of blocks:
  `KVCacheManager.allocate_slots` (core/kv_cache_manager.py:371) returns None and the
  scheduler preempts (running pass, scheduler.py:776-848) or stops admitting (waiting pass,
  :1256-1282), and the manager is built inside `Scheduler.__init__`, not configurable. So this
  instance's `allocate_slots` is wrapped: on None, holds are released in tier order (LOW-held,
  then HIGH-held; LRU inside each; never the requester's own) as far as the requester's
  priority allows (`kv_holds.max_hold_tier`), retrying after each; only then does vLLM preempt.
  A failed allocate_slots changes nothing (it returns before touching a block), so retrying
  is exact.
- Demotion. At each `schedule` (an iteration boundary), the HIGH/PROMOTED trajectories' KV
  demand (held blocks and their requests' blocks, shared ones once, plus the rest of each one's
  context, `HoldBook.context_tokens`, not in a block) is set against the pool; HIGH ones are demoted shortest context first until the rest
  fit (`HoldBook.rebalance`). A demoted trajectory's hold is LOW-held and its requests run at
  vLLM priority LOW (a waiting one re-queued, vLLM's queue being a heap on priority); promoted
  back when the demand fits again.

Channels, all vLLM's own and ordered with its requests:
- a request's trajectory: `SamplingParams.extra_args[TRAJECTORY_ARG]` (kept on the engine
  core's `Request.sampling_params`); its priority is vLLM's request priority;
- trajectory start, priority change and release: an abort of a request id made by
  `control_id` (vLLM hands abort ids to `Scheduler.finish_requests` unchanged,
  engine/core.py:554-559; the frontend sends them with `engine_core.abort_requests_async`,
  bypassing its output processor, which knows no such request);
- what the frontend reads back (the demoted set and the counts): the per-step
  `SchedulerStats`, whose dict field `ec_connector_stats` (metrics/stats.py:248) no EC
  connector uses here (refused at start if one is configured), under `STATS_KEY`.

Not reachable: vLLM evicts unused blocks strictly by its free queue's order (the hold only
keeps blocks out of it), so the unused tier is vLLM's LRU; the waiting pass never preempts a
running request for KV (only the running pass does, scheduler.py:776-848), so a waiting HIGH
request short of blocks after every hold it may release waits, as in vLLM. vLLM's own way to
keep a request's KV between turns, streaming-input sessions (`resumable` requests parked in
WAITING_FOR_STREAMING_REQ), keeps a batch place per parked session (scheduler.py:922), and
nothing reclaims a parked session's KV (preemption picks from the running list only), so it
cannot serve trajectories in tool calls by tier.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Hashable, Iterable

from vllm.v1.request import Request, RequestStatus

from venusrl.engine.kv_holds import HoldBook, HoldTier, high_demand, max_hold_tier
from venusrl.engine.vllm.scheduler import PriorityPreemptingScheduler
from venusrl.types import Priority

log = logging.getLogger(__name__)

# vLLM's `additional_config`: {"cache_policy", "demotion", "demotion_order", "work_conservation"}
CONFIG_KEY = "venusrl"
TRAJECTORY_ARG = "venusrl_trajectory"  # `SamplingParams.extra_args` key: the request's trajectory
STATS_KEY = "venusrl"  # `SchedulerStats.ec_connector_stats` key: `TrajectoryScheduler.report`
_CONTROL = "venusrl-ctl|"
_ADMITTING = (RequestStatus.WAITING, RequestStatus.PREEMPTED)


def control_id(op: str, trajectory_id: str, priority: Priority | None = None) -> str:
    """The abort id that carries `op` ("start", "priority" or "release") to the scheduler."""
    return f"{_CONTROL}{op}|{'' if priority is None else int(priority)}|{trajectory_id}"


def trajectory_of(request: Request) -> Hashable | None:
    extra = request.sampling_params.extra_args if request.sampling_params is not None else None
    return None if extra is None else extra.get(TRAJECTORY_ARG)


class TrajectoryScheduler(PriorityPreemptingScheduler):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        config = self.vllm_config.additional_config.get(CONFIG_KEY, {})
        self.holding = config.get("cache_policy", "lru") == "tiers"
        self.demotion = self.holding and config.get("demotion", False)
        self.idle_first = config.get("demotion_order", "shortest") == "idle_first"
        self.work_conservation = config.get("work_conservation", True)  # `EngineConfig.work_conservation`
        if self.holding and len(self.kv_cache_config.kv_cache_groups) != 1:
            raise ValueError("engine.cache_policy: tiers on vLLM holds the blocks of one KV cache group (full "
                             f"attention); this model has {len(self.kv_cache_config.kv_cache_groups)}")
        if self.get_ec_connector() is not None:
            raise ValueError("venusrl's vLLM scheduler reports through SchedulerStats.ec_connector_stats, "
                             "which the configured EC connector uses")
        self.book = HoldBook()
        # iterations whose admission stopped at a waiting request too few blocks could hold, by
        # its priority (`Counters.memory_stalls_by_priority` of our engine, counted the same way)
        self.memory_stalls = dict.fromkeys(Priority, 0)
        self._pool = self.kv_cache_manager.block_pool
        self._allocate_slots = self.kv_cache_manager.allocate_slots
        self.kv_cache_manager.allocate_slots = self._allocate_with_holds

    # ---- requests and control messages ----------------------------------------------------

    def add_request(self, request: Request) -> None:
        key = trajectory_of(request)
        if key is not None:  # a request names its trajectory's current priority (generate's)
            self.book.start(key, Priority(request.priority))
            request.priority = int(self.book.effective(key))  # LOW while demoted
        super().add_request(request)

    def finish_requests(self, request_ids: str | Iterable[str] | None, finished_status: RequestStatus) -> list[Request]:
        if request_ids is not None:
            ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
            controls = [i for i in ids if i.startswith(_CONTROL)]
            for control in controls:
                self._control(control)
            request_ids = [i for i in ids if not i.startswith(_CONTROL)]
        return super().finish_requests(request_ids, finished_status)

    def _control(self, control: str) -> None:
        op, priority, key = control[len(_CONTROL):].split("|", 2)
        if op == "release":
            self._hand_back(self.book.release(key))
        else:  # start or priority: a held trajectory's hold moves tier with it
            self.book.start(key, Priority(int(priority)))

    # ---- holds ----------------------------------------------------------------------------

    def _free_request_blocks(self, request: Request) -> None:
        """A request finishes or is preempted: its live trajectory holds its hashed blocks
        (referenced here before vLLM drops the request's references, so they never pass
        through the free queue), and the hold they replace is handed back."""
        key = trajectory_of(request)
        if key is None or key not in self.book:
            super()._free_request_blocks(request)
            return
        self.book.computed(key, request.num_computed_tokens)
        if not self.holding:
            super()._free_request_blocks(request)
            return
        blocks = [b for b in self.kv_cache_manager.get_blocks(request.request_id).blocks[0]
                  if b.block_hash is not None and not b.is_null]
        self._pool.touch(blocks)
        old = self.book.keep(key, tuple(b.block_id for b in blocks), len(blocks) * self.block_size)
        super()._free_request_blocks(request)
        self._hand_back(old)

    def _hand_back(self, block_ids: tuple[int, ...]) -> None:
        """Drop one reference per block (the hold's), the sequence's tail first, so vLLM's free
        queue evicts the tail before the shared prefix."""
        if block_ids:
            self._pool.free_blocks(self._pool.blocks[i] for i in reversed(block_ids))

    def _allocate_with_holds(self, request: Request, *args, **kwargs):
        """vLLM's `allocate_slots`, with holds released in tier order while it finds too few
        free blocks; an admitted request's own trajectory hold ends (its blocks are now the
        request's) and its recomputed tokens are counted."""
        blocks = self._allocate_slots(request, *args, **kwargs)
        key = trajectory_of(request)
        if blocks is None and self.holding:
            # the iteration's only work, on an engine that conserves work (`Step.eviction_tier`)
            alone = self.work_conservation and all(other is request for other in self.running)
            for victim in self.book.victims(max_hold_tier(Priority(request.priority), alone), exclude=key):
                self._hand_back(self.book.evict(victim))
                blocks = self._allocate_slots(request, *args, **kwargs)
                if blocks is not None:
                    break
        if blocks is None and request.status in _ADMITTING:  # the waiting pass breaks (scheduler.py:1275-1282)
            self.memory_stalls[Priority(request.priority)] += 1
        if blocks is not None and key in self.book and request.status in _ADMITTING:
            if request.num_computed_tokens == 0:  # a prefix-cache lookup was made for it
                self.book.admitted(key, request.num_tokens, kwargs.get("num_new_computed_tokens", 0))
            self._hand_back(self.book.take(key))
        return blocks

    def reset_prefix_cache(self, *args, **kwargs) -> bool:
        """Weights changed (or a caller resets the cache): every hold ends first, since vLLM
        resets only with no block referenced (core/block_pool.py:838), and the requests it
        preempts to reset are not held."""
        self._hand_back(self.book.clear())
        holding, self.holding = self.holding, False
        try:
            return super().reset_prefix_cache(*args, **kwargs)
        finally:
            self.holding = holding

    # ---- demotion -------------------------------------------------------------------------

    def schedule(self, *args, **kwargs):
        if self.demotion:
            self._rebalance()
        return super().schedule(*args, **kwargs)

    def _rebalance(self) -> None:
        """Demote or promote from this boundary's HIGH demand (see the module docstring)."""
        contexts: dict[Hashable, int] = {}
        paths: dict[Hashable, set[int]] = {}
        for key, trajectory in self.book.trajectories.items():
            if trajectory.priority != Priority.LOW:
                contexts[key], paths[key] = self.book.context_tokens(key), set(self.book.held(key)[0])
        active = set()
        for request in self.requests.values():
            key = trajectory_of(request)
            if key in contexts and not request.is_finished():
                active.add(key)
                paths[key].update(self.kv_cache_manager.get_block_ids(request.request_id)[0])
                contexts[key] = max(contexts[key], request.num_tokens)
        capacity = (self._pool.num_gpu_blocks - 1) * self.block_size  # the null block holds no KV
        if sum(contexts.values()) <= capacity:  # fits even counting shared blocks once per trajectory
            demand, exclusive = sum(contexts.values()), contexts
        else:
            uncached = {key: max(0, contexts[key] - len(paths[key]) * self.block_size) for key in contexts}
            demand, exclusive = high_demand(paths, uncached, self.block_size)
        changed = self.book.rebalance(contexts, exclusive, demand, capacity, active if self.idle_first else None)
        if changed:
            self._requeue(changed)
            log.info("demoted %d trajectories, promoted %d (HIGH demand %d of %d KV tokens)",
                     sum(self.book.trajectories[k].demoted for k in changed),
                     sum(not self.book.trajectories[k].demoted for k in changed), demand, capacity)

    def _requeue(self, keys: Collection[Hashable]) -> None:
        """The requests of `keys` take their trajectory's effective priority; waiting ones are
        re-queued under it (vLLM's waiting queues are heaps on priority)."""
        moved = {r: int(self.book.effective(trajectory_of(r))) for r in self.requests.values()
                 if trajectory_of(r) in keys and not r.is_finished()}
        for queue in (self.waiting, self.kv_holding_waiting):
            queued = [r for r in queue if r in moved]
            queue.remove_requests(queued)
            for request in queued:
                request.priority = moved[request]
                queue.add_request(request)
        for request, priority in moved.items():
            request.priority = priority

    # ---- reporting ------------------------------------------------------------------------

    def report(self) -> dict:
        book = self.book
        return {"demoted": sorted(str(k) for k in book.demoted()), "recomputed_tokens": book.recomputed_tokens,
                "demotions": book.demotions, "promotions": book.promotions,
                "held_tokens": {"low_ref": book.held_tokens[HoldTier.LOW], "high_ref": book.held_tokens[HoldTier.HIGH]},
                "evicted_tokens": {"low_ref": book.evicted_tokens[HoldTier.LOW],
                                   "high_ref": book.evicted_tokens[HoldTier.HIGH]},
                "memory_stalls": {p.name.lower(): n for p, n in self.memory_stalls.items()}}

    def make_stats(self, *args, **kwargs):
        stats = super().make_stats(*args, **kwargs)
        if stats is not None:
            stats.ec_connector_stats = {STATS_KEY: self.report()}
        return stats
