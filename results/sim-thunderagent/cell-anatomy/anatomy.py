"""Where one Fig. 10 quick cell's time goes, system by system: the engines' busy time by cost
term and each step's groups (when admitted, how long each took).

    PYTHONPATH=src python results/sim-thunderagent/cell-anatomy/anatomy.py run MODEL BATCH SEED SYSTEMS OUT.jsonl [gpus=N]
    python results/sim-thunderagent/cell-anatomy/anatomy.py table OUT.jsonl

SYSTEMS: comma-separated presets (venus, thunderagent, slime, ...). gpus=N runs the cell on N
generation GPUs (the no-contention bound: as many engines as trajectories in flight).
"""

from __future__ import annotations

import json
import logging
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from venusrl.sim.run import simulate
from venusrl.sim.scenarios import QUICK, fig10_cell


def one(args: tuple[str, str, int, int, int | None]) -> dict:
    system, model, batch, seed, gpus = args
    logging.disable(logging.INFO)
    fields = {"seed": seed} | ({"generation_gpus": gpus} if gpus else {})
    result = simulate(fig10_cell(system, model, batch, **fields)).to_dict()
    return {"model": model, "batch": batch, "seed": seed, "gpus": gpus or 16, **result}


def run(model: str, batch: int, seed: int, systems: str, out: Path, *options: str) -> None:
    gpus = next((int(o.split("=", 1)[1]) for o in options if o.startswith("gpus=")), None)
    jobs = [(system, model, batch, seed, gpus) for system in systems.split(",")]
    with ProcessPoolExecutor(2) as pool, out.open("a") as f:
        for row in pool.map(one, jobs):
            f.write(json.dumps(row) + "\n")
            print(row["name"], model, batch, seed, row["gpus"], round(row["sim_seconds"]), flush=True)


def table(path: Path) -> None:
    for line in path.read_text().splitlines():
        r = json.loads(line)
        engine, batch = r["engine"], r["batch"]
        terms = engine["busy_s_by_term"]
        busy = sum(terms.values())
        print(f"\n### {r['name']}, {r['model']} batch {batch} seed {r['seed']}, {r['gpus']} GPUs: "
              f"{r['sim_seconds']:,.0f} s to step {r['steps']}, engines busy {engine['busy_fraction']:.3f}")
        print("busy time by term: " + ", ".join(f"{k} {v / busy:.1%}" for k, v in terms.items() if v / busy >= 0.0005)
              + f"; {engine['decode_tokens'] / max(1, engine['iterations']) / QUICK.quantum:.1f} sequences a decode step")
        ready, steps = r["groups_ready"], [0.0, *r["step_times"]]
        for k in range(r["steps"]):
            groups = ready[k * batch:(k + 1) * batch]
            fresh = [at - admitted for _, admitted, at in groups if admitted >= steps[k] - 1e-6]
            carried = [(admitted, at - admitted) for _, admitted, at in groups if admitted < steps[k] - 1e-6]
            last = max(groups, key=lambda g: g[2])
            print(f"step {k + 1}: +{steps[k + 1] - steps[k]:,.0f} s (ends {steps[k + 1]:,.0f}); "
                  f"{len(fresh)} groups admitted at its start, latencies {sorted(round(x) for x in fresh)}; "
                  f"{len(carried)} carried over, admitted at {sorted({round(a) for a, _ in carried})}; "
                  f"its last group ({last[0]}) admitted at {last[1]:,.0f}, ready at {last[2]:,.0f}")


if __name__ == "__main__":
    if sys.argv[1] == "run":
        run(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], Path(sys.argv[6]), *sys.argv[7:])
    else:
        table(Path(sys.argv[2]))
