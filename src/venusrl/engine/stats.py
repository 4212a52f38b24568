"""Engine statistics (pure): cache hits, recomputation, evictions and KV use per tier, and
the load that placement and orchestration read from them (`EngineLoad`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(slots=True)
class Counters:
    """Running totals the scheduler adds to as it admits and evicts."""

    prompt_tokens: int = 0  # tokens of every admitted sequence (re-admissions count again)
    cached_tokens: int = 0  # of those, found in the radix cache (device, or host and loaded back)
    host_loaded_tokens: int = 0  # of the cached ones, loaded back from the host tier
    recomputed_tokens: int = 0  # prefilled again although computed before for the same trajectory
    retractions: int = 0
    preemptions: int = 0  # retractions of a running LOW request for a waiting HIGH one
    demotions: int = 0
    promotions: int = 0
    dropped_at_weight_update_tokens: int = 0  # cached KV forgotten because new weights made it stale
    # by the trajectory's declared priority (PROMOTED, HIGH, LOW): the critical path's hit rate
    prompt_tokens_by_priority: list[int] = field(default_factory=lambda: [0, 0, 0])
    cached_tokens_by_priority: list[int] = field(default_factory=lambda: [0, 0, 0])
    # iterations whose admission stopped at a waiting request the KV it may evict could not
    # hold, by that request's priority: how often the pool, not the batch bound, limits the batch
    memory_stalls_by_priority: list[int] = field(default_factory=lambda: [0, 0, 0])


@dataclass(slots=True, frozen=True)
class EngineStats:
    prompt_tokens: int
    cached_tokens: int
    hit_rate: float
    hit_rate_by_priority: dict[str, float]
    recomputed_tokens: int
    retractions: int
    preemptions: int
    demotions: int
    promotions: int
    evicted_tokens: dict[str, int]  # per tier: unused / low_ref / high_ref (weight-update drops included)
    kv_tokens: dict[str, int] = field(default_factory=dict)  # free / running / per tier
    kv_capacity_tokens: int = 0
    dropped_at_weight_update_tokens: int = 0  # of the evicted, those dropped because weights changed
    host_loaded_tokens: int = 0  # cache hits served from the host tier
    host_saved_tokens: int = 0  # evicted KV copied to the host tier
    host_kv_tokens: int = 0  # host tier in use
    high_pressure: float = 0.0  # HIGH/PROMOTED KV demand over capacity
    demoted_trajectories: int = 0
    live_trajectories: int = 0  # caller trajectories not yet released (explicitly or by idle TTL)
    running: int = 0
    waiting: int = 0
    weight_version: int = 0  # set by the engine (the scheduler does not know weights)
    # per priority (promoted / high / low): iterations whose admission stopped for memory
    # (`Counters.memory_stalls_by_priority`; on vLLM, `TrajectoryScheduler.memory_stalls`)
    memory_stalls: dict[str, int] = field(default_factory=dict)
    # set by the engine from its loop (`StepLog.record_wait`): seconds waited with no request,
    # and with requests it could not admit
    idle_no_request_s: float = 0.0
    idle_stalled_s: float = 0.0
    calls_s: float = 0.0  # seconds its loop ran callers' calls between steps (`StepLog.record_calls`)

    def to_dict(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def summed_memory_stalls(stats: Iterable[EngineStats]) -> dict[str, int]:
    """Memory stalls by priority summed over engines."""
    total: dict[str, int] = {}
    for one in stats:
        for priority, stalls in one.memory_stalls.items():
            total[priority] = total.get(priority, 0) + stalls
    return total


@dataclass(slots=True, frozen=True)
class EngineLoad:
    """What placement and orchestration read: the HIGH/PROMOTED KV demand over capacity, the
    capacity, the trajectories the engine has demoted (residency-aware demotion: they
    cannot get KV while HIGH work fills the pool), and the running total of iterations whose
    admission stopped for memory (None where the engine does not say: one of an older release
    over the wire)."""

    high_pressure: float
    kv_capacity_tokens: int
    demoted: frozenset[str]
    memory_stalls: int | None

    @classmethod
    def from_stats(cls, stats: EngineStats, demoted: frozenset[str]) -> EngineLoad:
        """An engine's load from its stats: the memory stalls of every priority summed (our
        engine, the simulator's and vLLM's `TrajectoryScheduler` count them the same way)."""
        return cls(stats.high_pressure, stats.kv_capacity_tokens, demoted, sum(stats.memory_stalls.values()))
