"""Why isolation moves little in a run's first step: every turn asking beside a predicted step
ender, by step, and what decode balance found for it.

    PYTHONPATH=src python results/sim-thunderagent/cell-anatomy/isolation_asks.py MODEL BATCH SEED

Runs venus on one Fig. 10 quick cell and wraps `RolloutCore._balance`: for each ask beside an
ender (isolating, the turn not an ender itself) it records the simulated time and whether the
turn moved, and if not, which of decode balance's conditions stopped it (a free slot with no
ender beside it; a lighter engine among those; KV room there; a move that pays). Prints counts
per training step (the step the ask fell in, by the run's step times).
"""

from __future__ import annotations

import bisect
import collections
import logging
import sys

from venusrl.rollout import core as rollout_core
from venusrl.sim.run import simulate
from venusrl.sim.scenarios import fig10_cell

asks: list[tuple[float, str]] = []
clock = [lambda: 0.0]


def recording(original):
    def _balance(self, trajectory_id, engine):
        already = trajectory_id in self._balanced  # moved once this turn: balance does not look
        enders = self.step_enders()
        beside = trajectory_id not in enders and not enders.isdisjoint(self.slots[engine].holders)
        outcome = None
        if beside and self.decode_balance and not already:  # decode balance's conditions, in its order
            context = self.context_tokens(trajectory_id)
            eligible = [i for i, s in enumerate(self.slots) if s.idle and enders.isdisjoint(s.holders)]
            target = rollout_core.lighter_engine(self.decode_loads, engine, context, eligible)
            if not [i for i in eligible if i != engine]:
                outcome = "no free slot"
            elif target is None:
                outcome = "no lighter engine with a free slot"
            elif not self._has_room(target, context):
                outcome = "no KV room on it"
            elif not self._balance_pays(self.decode_loads[engine], self.decode_loads[target], context):
                outcome = "does not pay"
            else:
                outcome = "moved"
        move = original(self, trajectory_id, engine)
        if outcome is not None:
            assert (move is not None) == (outcome == "moved"), (outcome, move)
            asks.append((clock[0](), outcome))
        return move
    return _balance


def main(model: str, batch: int, seed: int) -> None:
    logging.disable(logging.INFO)
    rollout_core.RolloutCore._balance = recording(rollout_core.RolloutCore._balance)
    from venusrl.sim import worker as sim_worker

    place = sim_worker.SimWorker.__post_init__

    def post_init(self):
        place(self)
        clock[0] = lambda: self.loop.now

    sim_worker.SimWorker.__post_init__ = post_init
    result = simulate(fig10_cell("venus", model, batch, settings={}, seed=seed))
    steps = list(result.step_times)
    print(f"venus {model} batch {batch} seed {seed}: {result.sim_seconds:,.0f} s, steps at {[round(s) for s in steps]}")
    by_step: dict[int, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for at, outcome in asks:
        by_step[bisect.bisect_left(steps, at) + 1][outcome] += 1
    for step in sorted(by_step):
        print(f"step {step}: {dict(by_step[step])}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
