"""Priority-aware batch formation (paper §4.3): who gets KV and compute this iteration.

Two passes over one `Step`, in this order:

1. `schedule_running` gives every running request its next tokens (a decode token or the
   next prefill chunk), PROMOTED and HIGH first. When memory runs short the request evicts
   what its priority may evict, then requests after it in that order are retracted, LOW
   before HIGH, latest first (decode retraction takes LOW first).
2. `admit_waiting` admits waiting requests, PROMOTED and HIGH before LOW (a linear
   partition of the queue, not a sort), while the prefill token budget, the running bound
   and memory allow. A HIGH request that finds no slot or memory preempts running LOW
   requests; the first request that still does not fit stops admission (no overtaking, so a
   large request is not starved by small ones behind it), counted as a memory stall at its
   priority.

Work conservation (`EngineConfig.work_conservation`, on unless the caller guarantees progress):
a request that is the iteration's only work may evict every unlocked tier (`Step.eviction_tier`),
so an engine never idles to keep KV for trajectories that are not running.

Invariants: a request is granted KV only through `KVBook.grow`, which checks the pages its
priority (or being the only work) may evict before taking any (admission never over-commits the budget); prefill
tokens handed out never exceed ``max_prefill_tokens`` (decode tokens are not counted); at
most ``max_running_requests`` run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from venusrl.engine.batch import Batch, ScheduledRequest
from venusrl.engine.config import EngineConfig
from venusrl.engine.kv_book import KVBook
from venusrl.engine.radix_cache import Tier, max_evictable_tier
from venusrl.engine.request import Request, RequestStatus
from venusrl.engine.request_queue import RequestQueue
from venusrl.engine.scheduler_stats import count_admission
from venusrl.engine.stats import Counters
from venusrl.types import Priority


def by_priority(requests: Sequence[Request]) -> list[Request]:
    """PROMOTED, then HIGH, then LOW; queue order inside each (a linear partition, not a sort)."""
    buckets: tuple[list[Request], ...] = ([], [], [])
    for request in requests:
        buckets[request.priority].append(request)
    return buckets[0] + buckets[1] + buckets[2]


@dataclass(slots=True)
class Step:
    """One iteration's batch as it is formed, and the state forming it changes."""

    config: EngineConfig
    kv: KVBook
    queue: RequestQueue
    counters: Counters
    batch: Batch
    items: dict[str, ScheduledRequest] = field(default_factory=dict)

    def eviction_tier(self, request: Request) -> Tier:
        """What ``request`` may evict for its memory now: its priority's tiers, or every
        unlocked tier when it is the iteration's only work (nothing scheduled yet, no other
        request running) and the engine conserves work (`EngineConfig.work_conservation`).
        Keeping HIGH KV for trajectories that are not running is worth only what it saves
        them later; an engine that idles for it deadlocks unless its caller hands the slot of
        a stalled LOW holder to the urgent turns queued behind it (the owners' next turns may
        wait on the very slot this request holds), as venus's rollout worker does."""
        alone = (self.config.work_conservation and not self.items
                 and all(other is request for other in self.queue.running))
        return Tier.HIGH_REF if alone else max_evictable_tier(request.priority)

    def schedule(self, request: Request, count: int) -> None:
        """Compute ``count`` more tokens of ``request`` (its slots already allocated)."""
        start = request.num_computed
        end = start + count
        self.items[request.request_id] = ScheduledRequest(
            request_id=request.request_id, token_ids=request.token_range(start, end),
            positions=list(range(start, end)), new_slots=request.kv_slots[start:end],
            context_slots=request.kv_slots[:end], sample=end == request.seq_len,
            sampling=request.sampling, num_generated=len(request.output_ids),
        )  # fmt: skip

    def retract(self, request: Request) -> None:
        """Send a running request back to waiting; its computed KV goes back to the tree under
        its trajectory (low_ref for LOW), so resuming is a cache hit while memory lasts."""
        self.kv.release(request)
        self.items.pop(request.request_id, None)
        self.queue.requeue(request)
        request.num_retractions += 1
        self.counters.retractions += 1
        self.batch.retracted.append(request.request_id)

    def end_for_length(self, request: Request) -> None:
        """A lone request that outgrew the pool ends with what it has."""
        self.kv.release(request)
        self.batch.finished.append(self.queue.end(request, RequestStatus.FINISHED, "length"))


def schedule_running(step: Step, budget: int) -> int:
    """Give every running request its next tokens, HIGH first. When memory runs short:
    evict the tiers it may evict, then retract requests after it in the order (LOW
    before HIGH, latest first). Returns the prefill token budget left."""
    order = by_priority(step.queue.running)
    end = len(order)  # order[end:] were retracted as victims
    for index, request in enumerate(order):
        if index >= end:
            break
        pending = request.pending_tokens
        count = 1 if pending == 1 else min(pending, step.config.chunked_prefill_size, budget)
        if count == 0:
            continue
        while not step.kv.grow(request, count, step.eviction_tier(request)):
            if end > index + 1:
                end -= 1
                step.retract(order[end])
            elif len(step.queue.running) == 1 and step.kv.outgrew_pool(request, count):
                step.end_for_length(request)
                break
            else:
                step.retract(request)
                break
        else:
            if pending > 1:
                budget -= count
            step.schedule(request, count)
    return budget


def admit_waiting(step: Step, budget: int) -> None:
    """Admit waiting requests, PROMOTED and HIGH before LOW, while the token budget, the
    running bound and memory allow. A HIGH request that finds no slot or memory preempts
    running LOW requests; the first request that still does not fit stops admission."""
    for request in by_priority(step.queue.waiting):
        if budget <= 0:
            return
        urgent = request.priority != Priority.LOW
        while len(step.queue.running) >= step.config.max_running_requests:
            if not (urgent and preempt_low(step)):
                return
        admitted = admit(step, request, budget)
        while admitted is None and urgent and preempt_low(step):
            admitted = admit(step, request, budget)
        if admitted is None:
            step.counters.memory_stalls_by_priority[request.priority] += 1
            return
        budget -= admitted
        step.schedule(request, admitted)


def admit(step: Step, request: Request, budget: int) -> int | None:
    """Attach the request's cached KV and its first chunk's slots and start it running;
    returns the chunk size, or None (nothing changed) when memory does not allow it."""
    attached = step.kv.attach(request, min(step.config.chunked_prefill_size, budget), step.eviction_tier(request))
    if attached is None:
        return None
    count, loaded = attached
    trajectory = step.kv.cache.trajectories.get(request.trajectory_key)
    declared = trajectory.priority if trajectory is not None else request.priority
    count_admission(step.counters, request.seq_len, request.num_computed, loaded,
                    step.kv.computed_before(request), declared)  # fmt: skip
    step.queue.start_running(request)
    return count


def preempt_low(step: Step) -> bool:
    """Retract the most recently admitted running LOW request, if any."""
    for request in reversed(step.queue.running):
        if request.priority == Priority.LOW:
            step.retract(request)
            step.counters.preemptions += 1
            return True
    return False
