"""The pool bound of a Fig. 10 quick cell: each system with every engine's KV pool X times the
cost model's (X = 8: memory never binds, so nothing is recomputed or reloaded and a decode step
runs every turn in flight). What is left is the work the trajectories the window admits give:
each decoded token reads its context, each step pays the fixed cost at the concurrency the
trajectories in flight allow. If a system with such a pool still ends later than a target, no
ordering of the real pool reaches it.

    PYTHONPATH=src python results/sim-thunderagent/cell-anatomy/pool_bound.py MODEL BATCH SEEDS SYSTEMS X OUT.jsonl
"""

import json
import logging
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

from venusrl.sim.cost_model import preset
from venusrl.sim.run import simulate
from venusrl.sim.scenarios import MODELS, fig10_cell


def one(job: tuple[str, str, int, int, float]) -> dict:
    system, model, batch, seed, x = job
    logging.disable(logging.INFO)
    base = preset(model, dict(MODELS)[model])
    cost = replace(base, kv_capacity_tokens=int(base.kv_capacity_tokens * x))
    r = simulate(fig10_cell(system, model, batch, seed=seed, cost=cost)).to_dict()
    engine = r["engine"]
    terms = engine["busy_s_by_term"]
    return {"system": system, "model": model, "batch": batch, "seed": seed, "kv_x": x, "t": r["sim_seconds"],
            "steps": r["step_times"], "busy": engine["busy_fraction"], "busy_s": round(sum(terms.values())),
            "terms": terms, "iterations": engine["iterations"], "decode_tokens": engine["decode_tokens"],
            "wall": r["wall_s"]}


if __name__ == "__main__":
    model, batch, seeds, systems, x, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], float(sys.argv[5]), sys.argv[6]
    jobs = [(system, model, batch, int(seed), x) for seed in seeds.split(",") for system in systems.split(",")]
    with ProcessPoolExecutor(2) as pool, open(out, "a") as f:
        for row in pool.map(one, jobs):
            print(json.dumps(row), flush=True)
            f.write(json.dumps(row) + "\n")
