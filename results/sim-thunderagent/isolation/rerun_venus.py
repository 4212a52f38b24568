"""Fig. 10's quick table (2 seeds x 3 perturbations) with venus rerun at this commit and every
other system's runs taken from ../perturbations/fig10_quick_c1_p3.json: isolation changes only
runs with decode balance on, and the baselines run without moves (NO_MOVES, sim/systems.py),
so their runs are those of `venusrl simulate --scenario paper-fig10 --quick --seeds 2
--perturbations 3` at this commit (checked: see README.md). Writes fig10_quick_c1_p3.json and
.md here; one progress line per run on stderr.

    PYTHONPATH=src python results/sim-thunderagent/isolation/rerun_venus.py
"""

import json
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

from venusrl.cli.simulate import INVERTED, _run
from venusrl.sim.report import markdown, rows
from venusrl.sim.scenarios import PAPER_FIG10, SCENARIOS
from venusrl.sim.workload import WorkloadConfig

HERE = Path(__file__).parent
SEEDS, PERTURBATIONS = 2, 3


def main() -> None:
    committed = json.loads((HERE.parent / "perturbations" / "fig10_quick_c1_p3.json").read_text())
    cases = list(SCENARIOS["paper-fig10"](True, WorkloadConfig(), None))
    assert [c.label for c in cases] == [c["label"] for c in committed["cases"]]
    jobs = [(i, replace(spec, seed=seed, perturbation=k)) for i, case in enumerate(cases)
            for seed in range(SEEDS) for k in range(PERTURBATIONS) for spec in case.specs if spec.system.name == "venus"]
    fresh: dict[tuple[int, int, int], dict] = {}
    with ProcessPoolExecutor(2) as pool:
        for (i, spec), run in zip(jobs, pool.map(_run, [spec for _, spec in jobs]), strict=True):
            fresh[i, spec.seed, spec.perturbation] = run
            print(f"{len(fresh)}/{len(jobs)} venus {cases[i].label} seed={spec.seed} perturbation={spec.perturbation}: "
                  f"{run['sim_seconds']:,.0f} s simulated in {run['wall_s']:.0f} s", file=sys.stderr, flush=True)
    out_cases = [{"label": case["label"],
                  "runs": [fresh[i, r["seed"], r["perturbation"]] if r["name"] == "venus" else r for r in case["runs"]]}
                 for i, case in enumerate(committed["cases"])]
    inverted = "paper-fig10" in INVERTED  # speedups read venus / system, as the CLI writes them
    table = rows(out_cases, committed["reference"], invert=inverted)
    md = markdown(table, committed["reference"], None, invert=inverted)
    result = {**committed, "table": table, "cases": out_cases, "paper": PAPER_FIG10, "markdown": md}
    (HERE / "fig10_quick_c1_p3.json").write_text(json.dumps(result, indent=2) + "\n")
    (HERE / "fig10_quick_c1_p3.md").write_text(md)


if __name__ == "__main__":
    main()
