"""`venusrl simulate`: run a named scenario of the cluster simulator."""

from __future__ import annotations

import json
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import Progress

from venusrl.bench.report import emit
from venusrl.sim.report import markdown, plot, rows
from venusrl.sim.run import SimSpec
from venusrl.sim.run import simulate as run_spec
from venusrl.sim.scenarios import PAPER_FIG10, PAPER_TABLE1, SCENARIOS
from venusrl.sim.workload import WorkloadConfig, load_workload

REFERENCES = {"paper-fig10": "venus", "paper-table1": "baseline", "scale": "venus", "sensitivity": "venus",
              "coarsening": "venus"}
INVERTED = ("paper-fig10", "sensitivity", "coarsening")  # tables of venus's speedup over each other system


def _run(spec: SimSpec) -> dict[str, Any]:
    return run_spec(spec).to_dict() | {"seed": spec.seed, "perturbation": spec.perturbation}


def _finished_line(done: int, total: int, label: dict[str, object], result: dict[str, Any]) -> str:
    """One line per finished run, so a run under nohup or CI (no live bar) shows its progress."""
    cell = " ".join(f"{key}={value}" for key, value in label.items())
    perturbation = f" perturbation={result['perturbation']}" if result.get("perturbation") else ""
    return (f"{done}/{total} {result['name']} {cell} seed={result['seed']}{perturbation}: "
            f"{result['sim_seconds']:,.0f} s simulated to step {result['steps']} in {result['wall_s']:.1f} s "
            f"({result['events_per_s']:,} events/s)")


def run_scenario(name: str, quick: bool, workload: WorkloadConfig, extra_policy: str | None = None,
                 jobs: int = 1, seeds: int = 1, perturbations: int = 1) -> dict[str, Any]:
    """Every case of the scenario under every system, each under seeds 0..seeds-1 (the
    workload, the predictor's noise) and perturbations 0..perturbations-1 (the order of
    near-simultaneous events, `SimSpec.perturbation`); the table gives medians of speedups
    paired within each seed and perturbation."""
    if name not in SCENARIOS:
        raise typer.BadParameter(f"unknown scenario {name!r} (known: {', '.join(SCENARIOS)})")
    if name == "scale" and seeds * perturbations > 1:
        raise typer.BadParameter("scale is one long run: --seeds and --perturbations must be 1")
    cases = [replace(case, specs=tuple(replace(spec, seed=seed, perturbation=k) for seed in range(seeds)
                                       for k in range(perturbations) for spec in case.specs))
             for case in SCENARIOS[name](quick, workload, extra_policy)]
    specs = [spec for case in cases for spec in case.specs]
    labels = [case.label for case in cases for _ in case.specs]
    results: list[dict[str, Any]] = [{} for _ in specs]
    # stderr: stdout carries the JSON
    with Progress(console=Console(stderr=True)) as progress:
        task = progress.add_task(f"simulate {name}", total=len(specs))

        def finished(index: int, result: dict[str, Any]) -> None:
            results[index] = result
            progress.advance(task)
            done = int(progress.tasks[0].completed)
            progress.console.print(_finished_line(done, len(specs), labels[index], result), highlight=False)

        if jobs > 1:
            with ProcessPoolExecutor(jobs) as pool:
                futures = {pool.submit(_run, spec): index for index, spec in enumerate(specs)}
                for future in as_completed(futures):
                    finished(futures[future], future.result())
        elif name == "scale":  # one long run: show simulated time instead
            spec = specs[0]
            progress.update(task, total=spec.max_sim_seconds)
            results = [run_spec(spec, lambda now, _events: progress.update(task, completed=now)).to_dict()]
        else:
            for index, spec in enumerate(specs):
                finished(index, _run(spec))
    out_cases, at = [], 0
    for case in cases:
        out_cases.append({"label": case.label, "runs": results[at : at + len(case.specs)]})
        at += len(case.specs)
    reference = REFERENCES[name]
    table = rows(out_cases, reference, invert=name in INVERTED)
    paper: dict[str, Any] = {"paper-fig10": PAPER_FIG10, "paper-table1": PAPER_TABLE1}.get(name, {})
    return {"scenario": name, "quick": quick, "reference": reference, "table": table, "paper": paper, "cases": out_cases}


def simulate(
    scenario: Annotated[str, typer.Option("--scenario", help="paper-fig10, paper-table1, sensitivity, coarsening, scale or validate")],
    quick: Annotated[bool, typer.Option("--quick", help="a coarser, smaller run (under a minute)")] = False,
    json_out: Annotated[Path | None, typer.Option("--json", help="write the figures here")] = None,
    markdown_out: Annotated[Path | None, typer.Option("--markdown", help="write the table here")] = None,
    plot_out: Annotated[Path | None, typer.Option("--plot", help="write a bar plot (PNG) here")] = None,
    workload: Annotated[Path | None, typer.Option(help="workload YAML (default: examples/sim/swe_agent.yaml values)")] = None,
    policy: Annotated[str | None, typer.Option(help="also run venus with this priority policy")] = None,
    jobs: Annotated[int, typer.Option(min=1, help="runs in parallel processes")] = 1,
    seeds: Annotated[int, typer.Option(min=1, help="run every case under this many seeds; medians of paired speedups")] = 1,
    perturbations: Annotated[int, typer.Option(min=1, help="and each seed this many times, each run after the first with every output delivered up to 1 ms later (another order of close events); medians, and the range of the speedups")] = 1,
    measured: Annotated[Path | None, typer.Option(help="validate: `venusrl bench rollout --json` output (default: run it now)")] = None,
    measured_dir: Annotated[Path | None, typer.Option(help="validate: the measured runs, read from here where it holds them, else measured now and saved here")] = None,
) -> None:
    """Project the system to a cluster with the real scheduling code and a cost model
    (scenarios paper-fig10, paper-table1, scale; `sensitivity`: Fig. 10's 32B batch-64 cell
    under each cost term and setting; `coarsening`: that cell at fewer merged turns; `validate`
    compares with the rollout bench)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if scenario == "validate":
        from venusrl.bench.measured_runs import MeasuredRunsError
        from venusrl.bench.sim_validation import run as validate

        try:
            result = validate(quick, json.loads(measured.read_text()) if measured else None, measured_dir=measured_dir)
        except MeasuredRunsError as err:
            raise typer.BadParameter(str(err), param_hint="--measured-dir") from None
        emit(result, json_out)
        return
    config = load_workload(workload) if workload else WorkloadConfig()
    result = run_scenario(scenario, quick, config, policy, jobs, seeds, perturbations)
    table = markdown(result["table"], result["reference"], PAPER_TABLE1 if scenario == "paper-table1" else None,
                     invert=scenario in INVERTED)
    if markdown_out:
        markdown_out.write_text(table)
    if plot_out and result["table"]:
        plot(result["table"], result["reference"], plot_out, scenario)
    result["markdown"] = table
    emit(result, json_out)
