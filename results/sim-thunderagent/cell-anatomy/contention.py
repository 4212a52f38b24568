"""How much contention costs the trajectory that ends each training step.

    PYTHONPATH=src python results/sim-thunderagent/cell-anatomy/contention.py PRESET MODEL BATCH SEED

Runs one Fig. 10 quick cell and, for every engine iteration, charges its seconds to each
trajectory in the batch ("engine") beside what the same tokens would take on the engine alone
("solo": the cost model's iteration with that trajectory's item only). For each step it prints
the group that ended it and that group's slowest trajectory: engine and solo seconds, the
other items its batches held and the LOW share of their context (each request's priority when
its iteration ran).
"""

from __future__ import annotations

import collections
import logging
import sys

from venusrl.engine.step_log import computes_prefill
from venusrl.sim import engine as sim_engine
from venusrl.sim import worker as sim_worker
from venusrl.sim.run import simulate
from venusrl.sim.scenarios import fig10_cell
from venusrl.types import Priority

engine_s: collections.Counter[int] = collections.Counter()
solo_s: collections.Counter[int] = collections.Counter()
iterations: collections.Counter[int] = collections.Counter()
items_beside: collections.Counter[int] = collections.Counter()
low_items: collections.Counter[int] = collections.Counter()
low_context: collections.Counter[int] = collections.Counter()
all_context: collections.Counter[int] = collections.Counter()
group_of: dict[int, int] = {}
workers: list[sim_worker.SimWorker] = []


def record_worker(original):
    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        workers.append(self)
    return init


def charge(original):
    def seconds(self, batch):
        step_s = original(self, batch)
        requests = self.scheduler.requests
        items = [(item, requests[item.request_id]) for item in batch.items if item.request_id in requests]
        low = [item for item, request in items if request.priority == Priority.LOW]
        context = sum(len(item.context_slots) for item, _ in items)
        for item, request in items:
            tid = int(request.trajectory_key)
            live = workers[0].live.get(tid)
            if live is not None:
                group_of[tid] = live.group_id
            prefill = len(item.token_ids) if computes_prefill(item) else 0
            chunks = [(item.positions[0], prefill)] if prefill else []
            solo_s[tid] += self.cost.iteration_seconds(self.quantum, prefill, [] if prefill else [len(item.context_slots)],
                                                       0, chunks)
            engine_s[tid] += step_s
            iterations[tid] += 1
            items_beside[tid] += len(items) - 1
            own_low = request.priority == Priority.LOW
            low_items[tid] += len(low) - own_low
            low_context[tid] += sum(len(i.context_slots) for i in low) - own_low * len(item.context_slots)
            all_context[tid] += context - len(item.context_slots)
        return step_s
    return seconds


def main(preset: str, model: str, batch: int, seed: int) -> None:
    logging.disable(logging.INFO)
    sim_worker.SimWorker.__init__ = record_worker(sim_worker.SimWorker.__init__)
    sim_engine.SimEngine._seconds = charge(sim_engine.SimEngine._seconds)
    result = simulate(fig10_cell(preset, model, batch, seed=seed)).to_dict()
    steps, ready = [0.0, *result["step_times"]], result["groups_ready"]
    print(f"{preset} {model} batch {batch} seed {seed}: {result['sim_seconds']:,.0f} s")
    members = collections.defaultdict(list)
    for tid, group in group_of.items():
        members[group].append(tid)
    for k in range(result["steps"]):
        group, admitted, at = max(ready[k * batch:(k + 1) * batch], key=lambda g: g[2])
        slowest = max(members[group], key=lambda t: engine_s[t])
        n = max(1, iterations[slowest])
        print(f"step {k + 1}: +{steps[k + 1] - steps[k]:,.0f} s, ended by group {group} (admitted {admitted:,.0f} s, "
              f"latency {at - admitted:,.0f} s); its slowest trajectory: engine {engine_s[slowest]:,.0f} s, "
              f"solo {solo_s[slowest]:,.0f} s, {items_beside[slowest] / n:.1f} items beside it "
              f"({low_items[slowest] / n:.1f} LOW), LOW share of their context "
              f"{low_context[slowest] / max(1, all_context[slowest]):.2f}")
    total, alone = sum(engine_s.values()), sum(solo_s.values())
    print(f"all trajectories: engine {total:,.0f} s, solo {alone:,.0f} s ({total / alone:.2f}x)")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
