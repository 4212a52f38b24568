"""vLLM's per-step scheduler and iteration stats, folded into our `EngineStats` and our step
log. vLLM hands them to stat loggers in the frontend process (`AsyncLLM(stat_loggers=...)`);
this one keeps running totals, the latest snapshot and every step vLLM timed.

A step (vLLM's `SchedulerIterationDetails`, sent with `enable_logging_iteration_details`) as a
`StepSample`: `seconds` is vLLM's `elapsed_ms`, timed in its engine core from after the batch
was dispatched to the worker process (the CPU build always runs its worker in a process of its
own, platforms/cpu.py) until the sampled tokens came back: the forward and sampling, not the
scheduling. `prefill_tokens`: tokens of requests with no output yet (new requests and
continuations, vLLM's "context" requests); `decode_seqs`: the other requests, one token each
(vLLM counts a preempted request recomputing its context there too); `kv_tokens`: the KV
blocks in use after the step (vLLM's `kv_cache_usage` x capacity, whole blocks, prefills
included), as vLLM reports no context lengths per step. `ended_s`: when this process got the
step's stats (the step ended just before, in another process; one host-wide monotonic clock).

Our scheduler class's own figures (vllm/tiers.py: the demoted trajectories, recomputed tokens,
demotions, holds per tier and holds evicted) ride on the same per-step stats
(`TrajectoryScheduler.report`); the latest is kept.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from vllm.config import CacheConfig, VllmConfig
from vllm.v1.metrics.loggers import StatLoggerBase
from vllm.v1.metrics.stats import IterationStats, SchedulerStats

from venusrl.engine.stats import EngineStats
from venusrl.engine.step_log import StepLog, StepSample
from venusrl.engine.vllm.tiers import STATS_KEY


def usable_kv_tokens(cache: CacheConfig) -> int:
    """KV tokens vLLM's block pool can hold: its blocks but the null block it keeps aside."""
    return max(0, (cache.num_gpu_blocks or 0) - 1) * cache.block_size


@dataclass(slots=True)
class _Totals:
    prompt_tokens: int = 0  # prefix-cache queries: prompt tokens of every scheduled (re)admission
    cached_tokens: int = 0  # of those, served by the prefix cache
    preemptions: int = 0
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0  # fraction of KV blocks in use (held blocks included)
    tiers: dict[str, Any] = field(default_factory=dict)  # the scheduler's latest report (vllm/tiers.py)


class StatsCollector:
    def __init__(self) -> None:
        self.totals = _Totals()
        self.steps = StepLog()

    def factory(self, vllm_config: VllmConfig, engine_index: int = 0) -> StatLoggerBase:
        return _Logger(self.totals, self.steps, vllm_config.cache_config)

    @property
    def demoted(self) -> frozenset[str]:
        """The trajectories the scheduler had demoted at its latest step."""
        return frozenset(self.totals.tiers.get("demoted", ()))

    def engine_stats(self, kv_capacity_tokens: int, high_pressure: float, live_trajectories: int,
                     weight_version: int) -> EngineStats:
        t, tiers = self.totals, self.totals.tiers
        used = round(t.kv_usage * kv_capacity_tokens)
        held = tiers.get("held_tokens", {})
        return EngineStats(
            prompt_tokens=t.prompt_tokens, cached_tokens=t.cached_tokens,
            hit_rate=t.cached_tokens / t.prompt_tokens if t.prompt_tokens else 0.0,
            hit_rate_by_priority={},  # vLLM counts cache hits per step, not per request priority
            recomputed_tokens=tiers.get("recomputed_tokens", 0), retractions=t.preemptions, preemptions=t.preemptions,
            demotions=tiers.get("demotions", 0), promotions=tiers.get("promotions", 0),
            # holds released for room; vLLM's own LRU evictions of unused blocks are not counted
            evicted_tokens=tiers.get("evicted_tokens", {}),
            # used: every referenced block, held ones (low_ref, high_ref) included
            kv_tokens={"used": used, "free": kv_capacity_tokens - used, **held},
            demoted_trajectories=len(tiers.get("demoted", ())),
            kv_capacity_tokens=kv_capacity_tokens, high_pressure=high_pressure, live_trajectories=live_trajectories,
            running=t.running, waiting=t.waiting, weight_version=weight_version,
            memory_stalls=tiers.get("memory_stalls", {}),
        )


class _Logger(StatLoggerBase):
    def __init__(self, totals: _Totals, steps: StepLog, cache: CacheConfig) -> None:
        self.totals, self.steps, self.cache = totals, steps, cache  # its block count is set once KV is allocated

    def record(self, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats | None,
               mm_cache_stats=None, engine_idx: int = 0) -> None:
        t = self.totals
        if scheduler_stats is not None:
            t.running = scheduler_stats.num_running_reqs
            t.waiting = scheduler_stats.num_waiting_reqs + scheduler_stats.num_skipped_waiting_reqs
            t.kv_usage = scheduler_stats.kv_cache_usage
            t.tiers = (scheduler_stats.ec_connector_stats or {}).get(STATS_KEY, t.tiers)
            t.prompt_tokens += scheduler_stats.prefix_cache_stats.queries
            t.cached_tokens += scheduler_stats.prefix_cache_stats.hits
            step = scheduler_stats.iteration_details
            if step is not None and not step.is_dummy:
                self.steps.add(StepSample(step.num_ctx_tokens, step.num_generation_requests,
                                          round(scheduler_stats.kv_cache_usage * usable_kv_tokens(self.cache)),
                                          step.elapsed_ms / 1000, time.monotonic()))
        if iteration_stats is not None:
            t.preemptions += iteration_stats.num_preempted_reqs

    def log_engine_initialized(self) -> None:
        pass
