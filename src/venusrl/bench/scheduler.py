"""`venusrl bench scheduler`: cost of one DataCoordinator event at 10,000 in-flight
trajectories (1,250 groups of 8 by default).

A driver plays a multi-turn workload against the coordinator: every trajectory runs a few
turns with tool calls between them and gets a prediction after each turn; whenever B groups
are ready the trainer steps. Only the coordinator calls are timed.
"""

from __future__ import annotations

import math
import random
import time
from itertools import count
from pathlib import Path
from typing import Any

import numpy as np
import typer

from venusrl.bench.report import emit
from venusrl.coordinator import CoordinatorConfig, DataCoordinator, make_rule
from venusrl.coordinator.policies import RULES
from venusrl.types import Prompt, TrajectoryStatus

P99_TARGET_MS = 1.0


def batch_for_window(groups: int, async_factor: float) -> int:
    """The largest B whose window ceil(async_factor x B) fits in `groups`."""
    batch = int(groups / async_factor)
    while math.ceil(async_factor * (batch + 1)) <= groups:
        batch += 1
    while math.ceil(async_factor * batch) > groups:
        batch -= 1
    return batch


class Driver:
    """The outside world: trajectory plans, tool calls in progress, the trainer."""

    def __init__(self, coordinator: DataCoordinator, rng: random.Random) -> None:
        self.c = coordinator
        self.rng = rng
        self.plan: dict[int, list[int]] = {}  # trajectory id -> tokens of each remaining turn
        self.live: list[int] = []
        self.position: dict[int, int] = {}

    def true_remaining(self, trajectory) -> float:
        return float(sum(self.plan.get(trajectory.id, ())))

    def apply(self, out) -> None:
        for t in out.start:
            self.plan[t.id] = [self.rng.randint(20, 400) for _ in range(self.rng.randint(1, 6))]
            self._add(t.id)
        for tid in out.discarded:
            self._remove(tid)

    def _add(self, tid: int) -> None:
        self.position[tid] = len(self.live)
        self.live.append(tid)

    def _remove(self, tid: int) -> None:
        index = self.position.pop(tid, None)
        if index is None:
            return
        last = self.live.pop()
        if last != tid:
            self.live[index] = last
            self.position[last] = index
        self.plan.pop(tid, None)

    def next_event(self, now: float):
        """A coordinator call for a random live trajectory (or the trainer), not yet made."""
        c = self.c
        if c.ready_waiting >= c.config.batch_groups:
            return "weight_version", lambda: c.on_weight_version(c.weight_version + 1, now)
        tid = self.live[self.rng.randrange(len(self.live))]
        t = c.trajectory(tid)
        plan = self.plan[tid]
        if t.status is TrajectoryStatus.WAITING and not plan:
            self._remove(tid)
            return "done", lambda: c.on_trajectory_done(tid, now, 1.0)
        if t.status is TrajectoryStatus.WAITING:
            return "turn_start", lambda: c.on_turn_start(tid, now, (1, 2, 3))
        if t.status is TrajectoryStatus.GENERATING:
            n = plan.pop(0)
            tokens, logprobs = [7] * n, [-0.1] * n
            return "turn_end", lambda: c.on_turn_end(tid, now, tokens, logprobs, c.weight_version, bool(plan))
        # In a tool call: the prediction (made during the call) arrives, then the result.
        if t.predicted_at_generated != t.generated_tokens or t.predicted_remaining is None:
            guess = sum(plan) * self.rng.uniform(0.7, 1.3)
            return "prediction", lambda: c.on_prediction(tid, now, guess, t.generated_tokens)
        return "tool_result", lambda: c.on_tool_result(tid, now, error=self.rng.random() < 0.1)


def run_policy(policy: str, groups: int, group_size: int, events: int, seed: int) -> dict[str, Any]:
    async_factor = 1.5
    batch = batch_for_window(groups, async_factor)
    config = CoordinatorConfig(group_size=group_size, batch_groups=batch, async_factor=async_factor, policy=policy)
    rng = random.Random(seed)
    prompts = (Prompt(f"p{i}", ({"role": "user", "content": "task"},)) for i in count())
    driver: Driver
    rule = make_rule(policy, true_remaining=lambda t: driver.true_remaining(t)) if policy == "oracle" else None
    coordinator = DataCoordinator(config, prompts, rule=rule)
    driver = Driver(coordinator, rng)
    start = time.perf_counter_ns()
    driver.apply(coordinator.start(0.0))
    start_ms = (time.perf_counter_ns() - start) / 1e6
    initial_live = len(driver.live)
    latencies = np.empty(events, dtype=np.float64)
    kinds: list[str] = []
    live_sum = 0
    for i in range(events):
        kind, call = driver.next_event(now=i * 1e-3)
        begin = time.perf_counter_ns()
        out = call()
        latencies[i] = (time.perf_counter_ns() - begin) / 1e6
        driver.apply(out)
        kinds.append(kind)
        live_sum += len(driver.live)
    per_kind = {}
    kinds_arr = np.asarray(kinds)
    for kind in sorted(set(kinds)):
        sample = latencies[kinds_arr == kind]
        per_kind[kind] = {"count": int(sample.size), "p50_ms": float(np.percentile(sample, 50)),
                          "p99_ms": float(np.percentile(sample, 99)), "max_ms": float(sample.max())}
    return {
        "policy": policy,
        "groups_in_flight": coordinator.window,
        "batch_groups": batch,
        "initial_trajectories": initial_live,
        "mean_live_trajectories": live_sum / events,
        "start_ms": start_ms,
        "events": events,
        "events_per_s": events / (latencies.sum() / 1e3),
        "event_p50_ms": float(np.percentile(latencies, 50)),
        "event_p99_ms": float(np.percentile(latencies, 99)),
        "event_max_ms": float(latencies.max()),
        "policy_versions": coordinator.policy.version,
        "weight_versions": coordinator.weight_version,
        "per_event": per_kind,
    }


def run(groups: int, group_size: int, events: int, policies: list[str], seed: int) -> dict[str, Any]:
    results = {p: run_policy(p, groups, group_size, events, seed) for p in policies}
    worst = max(r["event_p99_ms"] for r in results.values())
    return {"benchmark": "scheduler", "groups": groups, "group_size": group_size,
            "target": {"event_p99_ms": P99_TARGET_MS, "met": worst <= P99_TARGET_MS}, "policies": results}


def main(
    quick: bool, json_out: Path | None, groups: int, group_size: int, events: int | None, policies: str, seed: int
) -> None:
    names = [p.strip() for p in policies.split(",") if p.strip()]
    unknown = [p for p in names if p not in RULES]
    if unknown or not names:
        raise typer.BadParameter(f"unknown policies {unknown} (known: {', '.join(RULES)})", param_hint="--policies")
    emit(run(groups, group_size, events or (20_000 if quick else 200_000), names, seed), json_out)
