"""`venusrl bench fidelity`: does the scheduler change what the model learns, or only how
fast? The demo's task (SFT warm start from an imperfect teacher, then GRPO) trained
with each scheduler from the same SFT model on the same seeds; reported per scheduler:
reward per step (the paper's Fig. 11), held-out accuracy before and after RL, and the
weight versions trajectories span by length percentile with the longest 5%'s stale-discard
rate (Fig. 12), reward per 10 steps per seed, and which prompts each step trained: each
trained group's difficulty and length percentile against the training rows (a scheduler
that trains the groups predicted to finish first could favour easy or short prompts). The
noise a difference is judged against comes from the seeds: the spread of one scheduler's
accuracy across seeds, and the binomial standard error of one accuracy on the held-out set."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from venusrl.config import Config, validate_config
from venusrl.metrics.fidelity import (
    attempts,
    half_means,
    midrank_percentiles,
    reward_per_step,
    reward_per_window,
    trained_composition,
    version_span_heatmap,
    window_means,
)

FIDELITY_HEATMAP_PNG = "fidelity_version_span.png"
FIDELITY_REWARD_PNG = "fidelity_reward.png"
FIDELITY_COMPOSITION_PNG = "fidelity_trained_composition.png"
REWARD_WINDOW_STEPS = 10
COMPOSITION_PERCENTILE = ("mid-rank percentile of the trained group's prompt among the training rows: 100 x (rows "
                          "below + half the rows equal) / rows; the rows' mean is exactly 50, so below 50 means the "
                          "scheduler trained easier (shorter) prompts than the dataset holds")
# What a trained prompt is ranked by among the training rows (`generate_dataset` rows of the
# calculator, the demo's task), each a mid-rank percentile (metrics/fidelity.py: 50 = the rows').
COMPOSITION_MEASURES = {
    "difficulty": "the row's operations (tool calls, `steps`), then its subtractions (`operations`): the demo's "
                  "teacher calls subtractions with the operands swapped, so they are what RL has to fix; the "
                  "demo's rows have one operation each, so a subtraction ranks above an addition",
    "length": "characters of the question (tokens under the tiny model's byte-level tokenizer); they grow with "
              "the operands' digits, and so do the tool call and the answer",
}


def run_fidelity(configs: dict, policies: list[str], workdir: Path, progress: bool = True) -> dict:
    """One warm start per seed, then one RL run per scheduler from it."""
    from venusrl.demo import HEADLINE, evaluate, reinforce, warm_start
    from venusrl.metrics.figures import (
        draw_reward_curves,
        draw_trained_composition,
        draw_version_heatmaps,
    )
    from venusrl.metrics.run_stats import by_kind
    from venusrl.metrics.writer import METRICS_FILE, read_metrics
    from venusrl.runtime.ledger import LEDGER_FILE, TrainedLedger

    runs: dict[str, list[dict]] = {p: [] for p in policies}
    for seed, config in configs.items():
        warm = warm_start(config, progress)
        before = evaluate(warm.sft_dir, config, warm.splits)
        percentiles = prompt_percentiles(warm.splits.train)
        for policy in policies:
            summary = reinforce(with_scheduler_policy(config, policy), warm, before, progress)
            run_dir = Path(summary["run_dir"])
            kinds = by_kind(read_metrics(run_dir / METRICS_FILE))
            ledger = TrainedLedger(run_dir / LEDGER_FILE).entries()
            runs[policy].append({"seed": seed, "summary": summary, "rewards": reward_per_step(kinds.get("step", [])),
                                 "attempts": attempts(kinds.get("group", []), summary["stale_discard_tokens"]),
                                 "composition": trained_composition(ledger, percentiles)})
    any_config = next(iter(configs.values()))
    max_span = any_config.coordinator.max_version_span
    heatmaps = {p: version_span_heatmap([r["attempts"] for r in runs[p]], max_span) for p in policies}
    workdir.mkdir(parents=True, exist_ok=True)
    draw_version_heatmaps(heatmaps, workdir / FIDELITY_HEATMAP_PNG)
    draw_reward_curves({p: {f"seed {r['seed']}": r["rewards"] for r in runs[p]} for p in policies},
                       workdir / FIDELITY_REWARD_PNG)
    draw_trained_composition({p: composition_curves([r["composition"] for r in runs[p]]) for p in policies},
                             workdir / FIDELITY_COMPOSITION_PNG)
    held_out = any_config.data.generate_eval
    schedulers = {}
    for policy in policies:
        after = [r["summary"]["accuracy_after"] for r in runs[policy]]
        schedulers[policy] = {
            "accuracy_after_per_seed": after,
            "accuracy_after_mean": round(statistics.fmean(after), 4),
            "accuracy_after_seed_spread": round(max(after) - min(after), 4),
            "gain_over_control_per_seed": [r["summary"]["gain_over_control"] for r in runs[policy]],
            "reward_last5_mean_per_seed": [round(statistics.fmean(v for _, v in r["rewards"][-5:]), 4)
                                           for r in runs[policy]],
            "train_wall_s_per_seed": [r["summary"]["train_wall_s"] for r in runs[policy]],
            "trajectories_discarded_per_seed": [r["summary"]["trajectories_discarded"] for r in runs[policy]],
            "version_span_heatmap": heatmaps[policy],
            "long_tail_discard_rate": heatmaps[policy]["long_tail_discard_rate"],
            "reward_per_step": [r["rewards"] for r in runs[policy]],
            "reward_per_10_steps_per_seed": [reward_per_window(r["rewards"], REWARD_WINDOW_STEPS)
                                             for r in runs[policy]],
            "trained_composition_summary": {measure: half_means([r["composition"] for r in runs[policy]], measure)
                                            for measure in COMPOSITION_MEASURES},
            "trained_composition": [{"seed": r["seed"], "steps": r["composition"]} for r in runs[policy]],
            "evaluations": [{"seed": r["seed"], "before": r["summary"]["before"], "after": r["summary"]["after"]}
                            for r in runs[policy]],
        }
    p = statistics.fmean(a for s in schedulers.values() for a in s["accuracy_after_per_seed"])
    return {"headline": "/".join(HEADLINE), "seeds": list(configs), "held_out_problems": held_out,
            "binomial_standard_error": round(math.sqrt(p * (1 - p) / held_out), 4) if held_out else None,
            "composition_measures": {**COMPOSITION_MEASURES, "percentile": COMPOSITION_PERCENTILE},
            "schedulers": schedulers,
            "figures": [str(workdir / name) for name in (FIDELITY_HEATMAP_PNG, FIDELITY_REWARD_PNG,
                                                         FIDELITY_COMPOSITION_PNG)]}


def prompt_percentiles(rows: list[dict]) -> dict[str, dict[str, float]]:
    """measure -> row id -> the row's percentile among `rows` (COMPOSITION_MEASURES)."""
    return {"difficulty": midrank_percentiles({r["id"]: (r["steps"], r["operations"].count("-")) for r in rows}),
            "length": midrank_percentiles({r["id"]: len(r["question"]) for r in rows})}


def composition_curves(runs: list[list[dict]]) -> dict[str, list[tuple[int, float]]]:
    """measure -> (last step of the window, mean percentile of the groups trained in it, all
    seeds pooled) per REWARD_WINDOW_STEPS steps: what the composition figure plots."""
    curves = {}
    for measure in COMPOSITION_MEASURES:
        points = [(s["step"], v) for run in runs for s in run for v in s[f"{measure}_percentiles"]]
        means = window_means(points, REWARD_WINDOW_STEPS)
        curves[measure] = [((k + 1) * REWARD_WINDOW_STEPS, m) for k, m in enumerate(means) if m is not None]
    return curves


def with_scheduler_policy(config: Config, policy: str) -> Config:
    """`config` under another `scheduler.policy`, validated again so what derives from it
    (the coordinator's rule) follows; a baseline ranks no group, whatever rule venus had."""
    data = config.model_dump(mode="json")
    data["scheduler"]["policy"] = policy
    if policy != "venus":
        del data["scheduler"]["priority"]
    return validate_config(data)


def table(report: dict) -> str:
    lines = [f"{'scheduler':16s} {'after RL per seed':22s} {'gain per seed':20s} {'longest 5% discarded':>20s}"]
    for name, s in report["schedulers"].items():
        lines.append(f"{name:16s} {', '.join(f'{a:.3f}' for a in s['accuracy_after_per_seed']):22s} "
                     f"{', '.join(f'{g:+.3f}' for g in s['gain_over_control_per_seed']):20s} "
                     f"{s['long_tail_discard_rate']:>20.1%}")
    lines += composition_table(report) + reward_window_table(report)
    lines.append(f"held-out binomial standard error {report['binomial_standard_error']}; figures {report['figures']}")
    return "\n".join(lines)


def composition_table(report: dict) -> list[str]:
    """Mean percentile of the trained groups' prompts, first / second half of the steps, all
    seeds pooled; the dataset's is 50."""
    lines = ["trained prompts' percentile among the training rows (dataset 50), first / second half of the steps",
             f"{'scheduler':16s} " + " ".join(f"{measure:>22s}" for measure in COMPOSITION_MEASURES)]
    for name, s in report["schedulers"].items():
        halves = [s["trained_composition_summary"][measure] for measure in COMPOSITION_MEASURES]
        lines.append(f"{name:16s} " + " ".join(
            f"{_percent(h['first_half_mean']) + ' / ' + _percent(h['second_half_mean']):>22s}" for h in halves))
    return lines


def reward_window_table(report: dict) -> list[str]:
    lines = [f"reward per {REWARD_WINDOW_STEPS} steps"]
    for name, s in report["schedulers"].items():
        for seed, windows in zip(report["seeds"], s["reward_per_10_steps_per_seed"], strict=True):
            lines.append(f"{name + ' seed ' + str(seed):24s} "
                         + " ".join("  - " if r is None else f"{r:.2f}" for r in windows))
    return lines


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
