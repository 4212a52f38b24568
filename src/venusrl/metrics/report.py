"""`venusrl report`: the plots and a markdown summary of a run, from its metrics.jsonl."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from pathlib import Path
from typing import Any

from venusrl.metrics.figures import (
    Kinds,
    draw_kv_hit_rate,
    draw_reward,
    draw_sandbox_memory,
    draw_throughput,
    draw_version_span,
)
from venusrl.metrics.run_stats import (
    Record,
    by_kind,
    mean,
    number,
    sandbox_series,
    series,
    version_span_counts,
    with_fields,
)
from venusrl.metrics.writer import METRICS_FILE, read_metrics

PLOTS: tuple[tuple[str, str, Callable[[Kinds, Path], bool], str], ...] = (
    ("reward.png", "Reward", draw_reward, "no step records with reward_mean and no eval records with accuracy"),
    ("throughput.png", "Throughput", draw_throughput, "no step records with tokens_per_s or groups"),
    ("kv_hit_rate.png", "KV cache hit rate", draw_kv_hit_rate, "no step records with kv_hit_rate"),
    ("version_span.png", "Version span", draw_version_span, "no group records with version_spans"),
    ("sandbox_memory.png", "Sandbox memory", draw_sandbox_memory, "no sandbox records with memory_bytes"),
)


def write_report(run_dir: Path, out_dir: Path | None = None) -> Path:
    """Draw the PNGs and write report.md into `out_dir` (default RUN_DIR/report); returns report.md."""
    run_dir = Path(run_dir)
    metrics_path = run_dir / METRICS_FILE
    if not metrics_path.is_file():
        raise FileNotFoundError(f"no {METRICS_FILE} in {run_dir}")
    records = read_metrics(metrics_path)
    kinds = by_kind(records)
    out_dir = Path(out_dir) if out_dir is not None else run_dir / "report"
    out_dir.mkdir(parents=True, exist_ok=True)
    sections = [
        f"# Run report: {run_dir.resolve().name}",
        _overview(records, kinds),
        _version_span_table(kinds),
        _faults(kinds),
        _summary_table(kinds),
        _plots(kinds, out_dir),
    ]
    path = out_dir / "report.md"
    path.write_text("\n\n".join(sections) + "\n", encoding="utf-8")
    return path


def _overview(records: list[Record], kinds: Kinds) -> str:
    steps = kinds.get("step", [])
    wall = [t for r in records if (t := number(r, "time_s")) is not None]
    rows = [
        ("steps", _steps(steps)),
        ("wall time", f"{max(wall):.1f} s ({datetime.timedelta(seconds=round(max(wall)))})" if wall else "n/a"),
        ("reward (first / last / best)", _reward(steps)),
        *_eval_accuracy(kinds.get("eval", [])),
        ("mean tokens/s", _fixed(mean(series(steps, "step", "tokens_per_s")[1]), 1)),
        ("mean KV hit rate", _fixed(mean(series(steps, "step", "kv_hit_rate")[1]), 3)),
        ("peak sandbox memory", _peak_memory(kinds.get("sandbox", []))),
    ]
    return "## Overview\n\n" + _table(("metric", "value"), rows)


def _steps(steps: list[Record]) -> str:
    numbered = with_fields(steps, "step")
    if not numbered:
        return "n/a"
    return f"{len(numbered)} step records, last step {numbered[-1]['step']}"


def _reward(steps: list[Record]) -> str:
    rows = with_fields(steps, "step", "reward_mean")
    if not rows:
        return "n/a"
    best = max(rows, key=lambda r: r["reward_mean"])
    return (f"{rows[0]['reward_mean']:.3f} / {rows[-1]['reward_mean']:.3f} / "
            f"{best['reward_mean']:.3f} (step {best['step']})")


def _eval_accuracy(evals: list[Record]) -> list[tuple[str, str]]:
    """One row per eval split: accuracy of its first and last eval (before / after training)."""
    rows = with_fields(evals, "step", "accuracy")
    if not rows:
        return [("eval accuracy (before / after)", "n/a")]
    out = []
    for split in sorted({str(r.get("split", "eval")) for r in rows}):
        split_rows = [r for r in rows if str(r.get("split", "eval")) == split]
        first, last = split_rows[0], split_rows[-1]
        out.append((f"eval accuracy, {split} (before / after)",
                    f"{first['accuracy']:.3f} (step {first['step']}) / {last['accuracy']:.3f} (step {last['step']})"))
    return out


def _peak_memory(samples: list[Record]) -> str:
    nodes = sandbox_series(samples)
    if not nodes:
        return "n/a"
    parts = []
    for node, records in nodes.items():
        peak = max(r["memory_bytes"] for r in records)
        limits = [limit for r in records if (limit := number(r, "limit_bytes")) is not None]
        parts.append(f"{node} {_gib(peak)}" + (f" of {_gib(limits[-1])}" if limits else ""))
    return "; ".join(parts)


# What node, engine and sandbox losses cost the run: counters the rollout side keeps from its
# start (runtime/engine_failover.py, the sandbox controller, the coordinator), in every step
# record and the summary.
FAULTS = (
    ("engines_lost", "engines lost (killed, or silent past the watchdog's timeout)"),
    ("turns_resumed", "turns resumed on a surviving engine"),
    ("tokens_recomputed", "tokens recomputed (the resumed turns' prefixes)"),
    ("engine_recovery_s", "recovery time: longest a resumed turn went without a token (s)"),
    ("sandbox_nodes_lost", "sandbox nodes lost"),
    ("sandboxes_recovered", "sandboxes recovered on another node"),
    ("trajectories_discarded", "trajectories discarded (stale or failed) and re-run"),
)


def _faults(kinds: Kinds) -> str:
    """From the newest record that has any of FAULTS (a run's counters only grow)."""
    for record in reversed([*kinds.get("step", []), *kinds.get("summary", [])]):
        rows = [(label, _value(record[key])) for key, label in FAULTS if number(record, key) is not None]
        if rows:
            return "## Faults\n\n" + _table(("what", "count"), rows)
    return "## Faults\n\nNo fault counters in the metrics."


def _version_span_table(kinds: Kinds) -> str:
    counts = version_span_counts(kinds.get("group", []))
    if not counts:
        return "## Version span\n\nNo group records with version_spans."
    total = sum(counts.values())
    rows = [(str(span), str(n), f"{n / total:.3f}") for span, n in counts.items()]
    return (f"## Version span\n\nWeight versions spanned by each of {total} trajectories "
            "(max − min version over its turns).\n\n" + _table(("span", "trajectories", "fraction"), rows))


def _summary_table(kinds: Kinds) -> str:
    summaries = kinds.get("summary", [])
    if not summaries:
        return "## Summary\n\nNo summary record."
    # A resumed run may hold several; the last one describes the finished run.
    fields = [(key, _value(value)) for key, value in summaries[-1].items() if key != "kind"]
    return "## Summary\n\n" + _table(("field", "value"), fields)


def _plots(kinds: Kinds, out_dir: Path) -> str:
    parts = ["## Plots"]
    for filename, title, draw, absent in PLOTS:
        path = out_dir / filename
        if draw(kinds, path):
            parts.append(f"### {title}\n\n![{title}]({filename})")
        else:
            path.unlink(missing_ok=True)  # a stale PNG from an earlier report would contradict "skipped"
            parts.append(f"### {title}\n\nSkipped: {absent}.")
    return "\n\n".join(parts)


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _fixed(value: float | None, digits: int) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _gib(n_bytes: float) -> str:
    return f"{n_bytes / (1 << 30):.2f} GiB"


def _value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)
