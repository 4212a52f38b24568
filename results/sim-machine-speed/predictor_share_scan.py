"""The fit of the simulated predictor's trajectory share (`sim.run.PREDICTOR_TRAJECTORY_SHARE`):
venus's rounds of a recording's calibration run replayed as the validation replays them (its
cost model, predictor Spearman, move latency and controller terms), once per share, strict
and at each round's machine speed, against the priorities its engines were sent (logged
`set_priority` calls), its preemptions and its time to the last step.

    nice -n 19 python results/sim-machine-speed/predictor_share_scan.py \
        results/sim-turn-latency/measured-3 0,0.25,0.5,0.75,0.9,1 calibration \
        results/sim-machine-speed/predictor-share-scan-measured-3.json

The third argument names the runs of the measured dir to replay (the fit uses `calibration`
only; the validation runs stay out of sample)."""

from __future__ import annotations

import dataclasses
import gzip
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from venusrl.bench import sim_validation as v
from venusrl.bench.controller_terms import fit as fit_terms
from venusrl.sim.cost_model import CostModel


def main(directory: Path, shares: list[float], names: list[str], out_path: Path) -> None:
    torch.set_num_threads(1)

    def load(name: str) -> dict:
        return json.load(gzip.open(directory / f"{name}.json.gz"))

    calibration = load("calibration")
    case = v.case_of(calibration)
    rho, move = v.measured_spearman(calibration), v.measured_move_latency(calibration)
    terms = fit_terms(calibration, v.MODES)
    fitted = calibration["step_cost_model"]
    cost = CostModel(fitted["fixed_s"], fitted["token_s"], fitted["kv_token_s"], 0.0, case.kv_tokens_per_engine)
    simulate = v.simulate
    out = []
    for name in names:
        run = calibration if name == "calibration" else load(name)
        run_case = v.case_of(run)
        trainer_s = run["trainer"]["step_s"][str(run_case.headline_factor)]
        rounds = run["venus"]["rounds"]
        measured = {"priority_changes": [v._set_priority_calls(r) for r in rounds],
                    "preemptions": [r["preemptions"] for r in rounds],
                    "last_step_s": [round(r["time_to_last_step_s"], 3) for r in rounds]}
        out.append({"run": name, "measured": {k: statistics.median(x) for k, x in measured.items()},
                    "per_round": measured})
        for share in shares:
            v.simulate = lambda spec, s=share: simulate(dataclasses.replace(spec, predictor_trajectory_share=s))
            for at_speed in (False, True):
                with tempfile.TemporaryDirectory() as tmp:
                    sims = [v.simulate_round(run_case, cost, r["trace"], "venus", Path(tmp) / "trace.jsonl", trainer_s,
                                             rho, move, terms, v.machine_speed(r, cost) if at_speed else 1.0)
                            for r in rounds]
                simulated = {"priority_changes": [s.worker["priority_changes"] for s in sims],
                             "preemptions": [s.worker["preemptions"] for s in sims],
                             "last_step_s": [round(s.sim_seconds, 3) for s in sims]}
                real, sim = statistics.median(measured["last_step_s"]), statistics.median(simulated["last_step_s"])
                out.append({"run": name, "share": share, "at_machine_speed": at_speed,
                            "simulated": {k: statistics.median(x) for k, x in simulated.items()},
                            "error_pct": round(100 * (sim - real) / real, 1), "per_round": simulated})
                print(json.dumps(out[-1]), flush=True)
            v.simulate = simulate
    out_path.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]), [float(x) for x in sys.argv[2].split(",")], sys.argv[3].split(","), Path(sys.argv[4]))
