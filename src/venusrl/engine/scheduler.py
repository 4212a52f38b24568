"""Priority-aware continuous-batching scheduler (pure: KV slots are integers).

Contract for a runner (or the simulator's cost model), strictly alternating:

1. ``batch = scheduler.schedule()`` applies queued trajectory changes (start, release,
   priority) and demotion at this iteration boundary, then forms one mixed batch. For each
   ``batch.items`` entry (``ScheduledRequest``) the runner writes the KV of ``token_ids`` (at
   ``positions``) into ``new_slots`` and attends over ``context_slots`` causally. Items with
   ``sample`` set need one sampled token (use ``sampling``). ``batch.retracted`` requests went
   back to waiting; ``batch.finished`` ended while scheduling; ``batch.aborted`` were aborted
   since the last batch: the runner drops any per-request state it keeps for all three.
2. ``finished = scheduler.on_batch_done(batch, sampled, stopped)`` with ``sampled`` mapping
   request id to the token drawn for each item with ``sample`` set, and ``stopped`` the ids
   whose text hit a stop string (the runner checks strings, the scheduler checks stop token
   ids and ``max_new_tokens``). Returns the requests that finished, with their output.

Slots given out in a batch stay valid until ``on_batch_done``: nothing is reallocated in
between, even when a request of the batch is aborted meanwhile.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Mapping, Sequence

from venusrl.engine import demotion
from venusrl.engine.admission import Step, admit_waiting, schedule_running
from venusrl.engine.batch import Batch, KVCopy
from venusrl.engine.config import EngineConfig
from venusrl.engine.host_tier import HostTier
from venusrl.engine.kv_book import KVBook
from venusrl.engine.kv_slots import PageAllocator
from venusrl.engine.radix_cache import RadixCache
from venusrl.engine.request import MAX_TRAJECTORY_ID_CHARS, PartialOutput, Request, RequestStatus
from venusrl.engine.request_queue import RequestQueue
from venusrl.engine.scheduler_stats import check_integrity, engine_stats
from venusrl.engine.stats import Counters, EngineStats
from venusrl.types import Priority, SamplingParams


def check_trajectory_id(trajectory_id: str) -> None:
    if not isinstance(trajectory_id, str) or not 0 < len(trajectory_id) <= MAX_TRAJECTORY_ID_CHARS:
        shown = trajectory_id[:40] + "..." if isinstance(trajectory_id, str) else repr(trajectory_id)
        raise ValueError(f"trajectory_id must be a string of 1 to {MAX_TRAJECTORY_ID_CHARS} characters, got {shown!r}")


def finish_reason(request: Request, token: int, hit_stop_string: bool) -> str | None:
    if token in request.sampling.stop_token_ids or hit_stop_string:
        return "stop"
    if len(request.output_ids) >= request.sampling.max_new_tokens:
        return "length"
    return None


class Scheduler:
    """The iteration loop over its parts: `KVBook` (pages, tree, host tier, prefix imports),
    `RequestQueue` (waiting and running requests), `demotion` (at each boundary),
    `admission` (batch formation) and `scheduler_stats` (counters, invariants)."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.kv = KVBook(config)
        self.queue = RequestQueue(self.kv.cache)
        self.counters = Counters()
        self._in_flight = False
        self._aborted: list[str] = []
        self._idle_since: dict[str, float] = {}  # caller trajectories seen with no request, since when

    @property
    def allocator(self) -> PageAllocator:
        return self.kv.allocator

    @property
    def cache(self) -> RadixCache:
        return self.kv.cache

    @property
    def host(self) -> HostTier | None:
        return self.kv.host

    @property
    def requests(self) -> dict[str, Request]:
        return self.queue.requests

    @property
    def waiting(self) -> list[Request]:
        return self.queue.waiting

    @property
    def running(self) -> list[Request]:
        return self.queue.running

    @property
    def has_work(self) -> bool:
        return self.queue.has_work

    # ---- one iteration -------------------------------------------------------------------

    def schedule(self) -> Batch:
        if self._in_flight or self.kv.reservation_open:
            raise RuntimeError(
                "schedule() called with a batch in flight or a prefix reservation open"
            )
        # the boundary: one snapshot of trajectories, demotion and priorities for this batch
        self.apply_trajectory_changes()
        demotion.rebalance(self.config, self.cache, self.requests.values(), self.counters)
        self._refresh_priorities()
        step = Step(self.config, self.kv, self.queue, self.counters, Batch(aborted=self._aborted))
        self._aborted = []
        budget = schedule_running(step, self.config.max_prefill_tokens)
        admit_waiting(step, budget)
        batch = step.batch
        batch.items = list(step.items.values())
        batch.kv_copies = self.take_kv_copies()
        self._in_flight = bool(batch.items)
        return batch

    def _refresh_priorities(self) -> None:
        """Each request runs at its trajectory's effective priority (declared, LOW while
        demoted); a released trajectory's requests keep their last one."""
        for request in self.requests.values():
            trajectory = self.cache.trajectories.get(request.trajectory_key)
            if trajectory is not None:
                request.priority = trajectory.effective

    def on_batch_done(
        self, batch: Batch, sampled: Mapping[str, int], stopped: Collection[str] = ()
    ) -> list[PartialOutput]:
        self._in_flight = False
        finished = []
        for item in batch.items:
            request = self.requests.get(item.request_id)
            if request is None or request.status is not RequestStatus.RUNNING:
                continue  # aborted while the batch ran
            request.num_computed += len(item.token_ids)
            if not item.sample:
                self.kv.cache_computed_prefix(request)
                continue
            token = sampled[item.request_id]
            request.output_ids.append(token)
            reason = finish_reason(request, token, item.request_id in stopped)
            if reason is not None:
                self.kv.release(request)
                finished.append(self.queue.end(request, RequestStatus.FINISHED, reason))
            elif len(item.token_ids) > 1:
                self.kv.cache_computed_prefix(request)
        return finished

    def take_kv_copies(self) -> list[KVCopy]:
        """The device <-> host copies owed so far, in order; the caller makes them before any
        other write to the pool (``schedule`` hands them out with the batch)."""
        return self.kv.take_copies()

    # ---- caller API ----------------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt_ids: Sequence[int],
        sampling: SamplingParams,
        priority: Priority | None = None,
        trajectory_id: str | None = None,
    ) -> Request:
        """Queue a request. Its trajectory (an implicit one per request when ``trajectory_id``
        is None) is started with ``priority`` (LOW when None), or set to it if already live
        (kept when None). The request runs at its trajectory's effective priority."""
        if request_id in self.requests:
            raise ValueError(f"duplicate request id {request_id!r}")
        if not prompt_ids:
            raise ValueError("empty prompt")
        if len(prompt_ids) > self.allocator.capacity_tokens - self.allocator.page_size:
            raise ValueError(f"prompt of {len(prompt_ids)} tokens exceeds the KV pool")
        if trajectory_id is not None:
            check_trajectory_id(trajectory_id)
        key = trajectory_id if trajectory_id is not None else ("request", request_id)
        self.cache.queue_start(key, priority)
        declared = Priority.LOW if priority is None else Priority(priority)
        return self.queue.add(request_id, prompt_ids, sampling, key, trajectory_id, declared)

    def start_trajectory(self, trajectory_id: str, priority: Priority) -> None:
        check_trajectory_id(trajectory_id)
        self.cache.queue_start(trajectory_id, priority)

    def knows_trajectory(self, trajectory_id: str) -> bool:
        """Live, or started since the last boundary."""
        return trajectory_id in self.cache.trajectories or self.cache.is_pending_start(trajectory_id)

    def release_idle(self, now: float, ttl: float) -> list[str]:
        """Queue the release of caller trajectories that have had no request here for ``ttl``
        (a client that never released them: their records and low_ref pins would stay
        forever). A trajectory's idle time starts at the first call that sees it idle, so
        the precision is the caller's calling interval. Returns the released ids."""
        busy = {request.trajectory_key for request in self.requests.values()}
        expired = []
        for key in self.cache.trajectories:
            if not isinstance(key, str):
                continue  # an implicit per-request trajectory ends with its request
            if key in busy:
                self._idle_since.pop(key, None)
            elif now - self._idle_since.setdefault(key, now) >= ttl:
                expired.append(key)
        for key in expired:
            self.cache.queue_release(key)
        return expired

    def apply_trajectory_changes(self) -> None:
        """Apply queued trajectory starts, releases and priority changes now (``schedule``
        does it at every boundary; between steps it is a boundary too)."""
        if self._in_flight:
            raise RuntimeError("trajectory changes applied while a batch is in flight")
        for key in self.cache.apply_pending():
            self.kv.forget_trajectory(key)
            self._idle_since.pop(key, None)

    def release_trajectory(self, trajectory_id: str) -> None:
        check_trajectory_id(trajectory_id)
        self.cache.queue_release(trajectory_id)

    def set_priority(self, trajectory_id: str, priority: Priority) -> None:
        self.cache.queue_set_priority(trajectory_id, priority)

    def abort(self, request_id: str) -> PartialOutput:
        """Remove a request; its computed KV stays cached so a resumed request hits it."""
        request = self.requests[request_id]
        if request.status is RequestStatus.RUNNING:
            self.kv.release(request)
        self._aborted.append(request_id)
        return self.queue.end(request, RequestStatus.ABORTED, "abort")

    def demoted_trajectories(self) -> set[Hashable]:
        """Trajectories residency-aware demotion has made LOW (they get no KV from HIGH work)."""
        return {key for key, trajectory in self.cache.trajectories.items() if trajectory.demoted}

    def drop_all_kv(self) -> int:
        """Forget every computed token, as new weights make them stale: running requests go
        back to waiting (their outputs so far kept) and will prefill again, and the whole
        tree is evicted. Returns the tokens dropped. Only between batches."""
        if self._in_flight:
            raise RuntimeError("drop_all_kv() called while a batch is in flight")
        for request in reversed(self.running):
            self.kv.release(request)
        self.queue.requeue_all_running()
        for request in self.queue.waiting:
            request.prior_computed = 0  # computed with the old weights: its next prefill is not a recompute
        dropped = self.kv.drop_all()
        self.counters.dropped_at_weight_update_tokens += dropped
        return dropped

    # ---- prefix KV transfer (migration between engines) ---------------------------------

    def cached_prefix_slots(self, token_ids: Sequence[int]) -> list[int]:
        """Slots of the longest cached page-aligned prefix of ``token_ids``, for export."""
        return self.kv.cached_prefix_slots(token_ids)

    def reserve_prefix(self, token_ids: Sequence[int]) -> tuple[list[int], int]:
        """Reserve slots to import the KV of ``token_ids`` (whole pages only). Returns the new
        slots, for ``token_ids[offset : offset + len(slots)]``, and ``offset``, the tokens
        already cached here. Evicts only unused and low_ref KV and reserves as many pages as
        that allows. The caller loads the KV into the slots, then calls ``commit_prefix``."""
        if self._in_flight or self.kv.reservation_open:
            raise RuntimeError("reserve_prefix needs an idle scheduler and no open reservation")
        return self.kv.reserve_prefix(token_ids)

    def commit_prefix(
        self,
        token_ids: Sequence[int],
        new_slots: list[int],
        offset: int,
        trajectory_id: str | None = None,
    ) -> int:
        """Insert the reserved, now loaded, slots into the cache; returns the tokens cached.
        With ``trajectory_id``, the trajectory references the prefix from the next boundary."""
        tokens = self.kv.commit_prefix(token_ids, new_slots, offset)
        if trajectory_id is not None:
            self.cache.queue_anchor(trajectory_id, tokens)
        return offset + len(new_slots)

    # ---- observability -------------------------------------------------------------------

    def stats(self) -> EngineStats:
        pressure = demotion.high_pressure(self.cache, self.requests.values())
        return engine_stats(self.counters, self.kv, self.queue, pressure)

    def check_integrity(self) -> None:
        """The invariants of `scheduler_stats.check_integrity` (pages, locks, queues, clocks)."""
        check_integrity(self.kv, self.queue, self._idle_since.keys())
