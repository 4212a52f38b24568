"""The report's PNGs. Each `draw_*` takes the records by kind and a path, and returns False
(drawing nothing) when the records hold none of its data. Figures are drawn on their own Agg
canvas, without pyplot, so reporting never touches the process-wide matplotlib backend."""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from venusrl.metrics.run_stats import (
    Record,
    groups_per_minute,
    number,
    sandbox_series,
    series,
    version_span_counts,
    with_fields,
)

Kinds = dict[str, list[Record]]


def draw_reward(kinds: Kinds, path: Path) -> bool:
    steps = with_fields(kinds.get("step", []), "step", "reward_mean")
    evals = with_fields(kinds.get("eval", []), "step", "accuracy")
    if not steps and not evals:
        return False
    fig = Figure(figsize=(8, 4.5))
    ax = fig.add_subplot()
    ax.set_xlabel("step")
    if steps:
        x = [r["step"] for r in steps]
        reward = [r["reward_mean"] for r in steps]
        ax.plot(x, reward, color="C0", label="reward mean")
        std = [number(r, "reward_std") for r in steps]
        if any(s is not None for s in std):
            spread = [(m, _or_nan(s)) for m, s in zip(reward, std, strict=True)]
            ax.fill_between(x, [m - s for m, s in spread], [m + s for m, s in spread],
                            color="C0", alpha=0.2, label="± std")
        ax.set_ylabel("reward")
        ax.grid(alpha=0.3)
    if evals:
        eval_ax = ax.twinx() if steps else ax
        for i, split in enumerate(sorted({str(r.get("split", "eval")) for r in evals})):
            x, accuracy = series([r for r in evals if str(r.get("split", "eval")) == split], "step", "accuracy")
            eval_ax.plot(x, accuracy, "o--", color=f"C{i + 1}", label=f"eval accuracy ({split})")
        eval_ax.set_ylabel("eval accuracy")
    handles, labels = [], []
    for axis in fig.axes:
        axis_handles, axis_labels = axis.get_legend_handles_labels()
        handles += axis_handles
        labels += axis_labels
    fig.axes[-1].legend(handles, labels, loc="best")
    fig.suptitle("Reward per step")
    _save(fig, path)
    return True


def draw_throughput(kinds: Kinds, path: Path) -> bool:
    steps = kinds.get("step", [])
    panels = [
        (*series(steps, "time_s", "tokens_per_s"), "tokens/s"),
        (*groups_per_minute(steps), "groups/min"),
    ]
    panels = [panel for panel in panels if panel[0]]
    if not panels:
        return False
    scale, unit = _time_unit(max(max(times) for times, _, _ in panels))
    fig = Figure(figsize=(8, 3 * len(panels)))
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (times, values, label) in zip(axes, panels, strict=True):
        ax.plot([t / scale for t in times], values, marker=".")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel(f"time ({unit})")
    fig.suptitle("Throughput")
    _save(fig, path)
    return True


def draw_kv_hit_rate(kinds: Kinds, path: Path) -> bool:
    x, rate = series(kinds.get("step", []), "step", "kv_hit_rate")
    if not x:
        return False
    fig = Figure(figsize=(8, 4))
    ax = fig.add_subplot()
    ax.plot(x, rate, marker=".")
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("step")
    ax.set_ylabel("KV cache hit rate")
    ax.grid(alpha=0.3)
    fig.suptitle("KV cache hit rate")
    _save(fig, path)
    return True


def draw_version_span(kinds: Kinds, path: Path) -> bool:
    counts = version_span_counts(kinds.get("group", []))
    if not counts:
        return False
    total = sum(counts.values())
    spans = list(counts)
    fractions = [counts[s] / total for s in spans]
    fig = Figure(figsize=(6, 4))
    ax = fig.add_subplot()
    bars = ax.bar(spans, fractions)
    ax.bar_label(bars, labels=[f"{f:.1%}" for f in fractions])
    ax.set_xticks(spans)
    ax.set_ylim(0, 1.1)
    ax.set_xlabel("weight versions spanned (max − min over a trajectory's turns)")
    ax.set_ylabel("fraction of trajectories")
    fig.suptitle(f"Version span of {total} trajectories")
    _save(fig, path)
    return True


def draw_sandbox_memory(kinds: Kinds, path: Path) -> bool:
    nodes = sandbox_series(kinds.get("sandbox", []))
    if not nodes:
        return False
    samples = [r for node in nodes.values() for r in node]
    show_live = any(number(r, "live") is not None for r in samples)
    scale, unit = _time_unit(max(r["time_s"] for r in samples))
    byte_scale, byte_unit = _byte_unit(max(max(r["memory_bytes"], number(r, "limit_bytes") or 0) for r in samples))
    fig = Figure(figsize=(8, 6 if show_live else 4))
    axes = fig.subplots(2 if show_live else 1, 1, sharex=True, squeeze=False)[:, 0]
    for i, (node, records) in enumerate(nodes.items()):
        times = [r["time_s"] / scale for r in records]
        axes[0].plot(times, [r["memory_bytes"] / byte_scale for r in records], color=f"C{i}", label=node)
        limits = [number(r, "limit_bytes") for r in records]
        if any(limit is not None for limit in limits):
            axes[0].plot(times, [_or_nan(v) / byte_scale for v in limits],
                         "--", color=f"C{i}", label=f"{node} limit")
        if show_live:
            axes[1].plot(times, [_or_nan(number(r, "live")) for r in records], color=f"C{i}", label=node)
    axes[0].set_ylabel(f"sandbox memory ({byte_unit})")
    axes[0].legend(fontsize="small")
    if show_live:
        axes[1].set_ylabel("live sandboxes")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel(f"time ({unit})")
    fig.suptitle("Sandbox memory per node")
    _save(fig, path)
    return True


def draw_version_heatmaps(heatmaps: dict[str, dict], path: Path) -> None:
    """Fig. 12 of the paper: one panel per scheduler, weight-version span (rows, "discarded"
    last) by trajectory-length percentile (columns); cells are fractions of their column."""
    fig = Figure(figsize=(3.6 * len(heatmaps) + 1, 3.6))
    axes = fig.subplots(1, len(heatmaps), squeeze=False)[0]
    for ax, (name, heatmap) in zip(axes, heatmaps.items(), strict=True):
        ax.imshow(heatmap["fractions"], cmap="Blues", vmin=0.0, vmax=1.0, aspect="auto")
        for r, row in enumerate(heatmap["fractions"]):
            for c, value in enumerate(row):
                ax.text(c, r, f"{value:.1%}", ha="center", va="center", fontsize=8,
                        color="white" if value > 0.6 else "black")
        ax.set_xticks(range(len(heatmap["columns"])), heatmap["columns"], fontsize=8)
        ax.set_yticks(range(len(heatmap["rows"])), heatmap["rows"])
        ax.set_xlabel("trajectory length percentile")
        ax.set_title(f"{name}: longest 5% discarded {heatmap['long_tail_discard_rate']:.1%}", fontsize=9)
    axes[0].set_ylabel("weight versions spanned")
    fig.suptitle("Version span by trajectory length")
    _save(fig, path)


def draw_reward_curves(curves: dict[str, dict[str, list[tuple[int, float]]]], path: Path) -> None:
    """Fig. 11 of the paper: reward mean per step, one colour per scheduler, one line per run
    (`curves[scheduler][run label]`, the label naming the seed)."""
    fig = Figure(figsize=(8, 4.5))
    ax = fig.add_subplot()
    for i, (name, runs) in enumerate(curves.items()):
        for j, (label, run) in enumerate(runs.items()):
            ax.plot([s for s, _ in run], [r for _, r in run], color=f"C{i}", alpha=0.8,
                    linestyle=("-", "--", ":", "-.")[j % 4], label=f"{name} ({label})")
    ax.set_xlabel("step")
    ax.set_ylabel("reward mean")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.suptitle("Reward per step")
    _save(fig, path)


def draw_trained_composition(curves: dict[str, dict[str, list[tuple[int, float]]]], path: Path) -> None:
    """Which prompts each scheduler trained: one panel per measure (`curves[scheduler][measure]`:
    (last step of a window, mean percentile of the prompts of the groups trained in it among
    the training rows)), one colour per scheduler, the dataset's 50 dashed."""
    measures = list(next(iter(curves.values())))
    fig = Figure(figsize=(4.5 * len(measures) + 1, 4))
    axes = fig.subplots(1, len(measures), squeeze=False)[0]
    for ax, measure in zip(axes, measures, strict=True):
        for i, (name, by_measure) in enumerate(curves.items()):
            points = by_measure[measure]
            ax.plot([s for s, _ in points], [p for _, p in points], marker=".", color=f"C{i}", label=name)
        ax.axhline(50.0, color="grey", linestyle="--", linewidth=1, label="dataset")
        ax.set_ylim(0, 100)
        ax.set_xlabel("step (end of the window)")
        ax.set_ylabel(f"{measure} percentile of trained prompts")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize="small")
    fig.suptitle("Trained prompts against the training rows")
    _save(fig, path)


def _save(fig: Figure, path: Path) -> None:
    FigureCanvasAgg(fig)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _or_nan(value: float | None) -> float:
    return float("nan") if value is None else value


def _time_unit(max_seconds: float) -> tuple[float, str]:
    if max_seconds >= 2 * 3600:
        return 3600.0, "h"
    if max_seconds >= 2 * 60:
        return 60.0, "min"
    return 1.0, "s"


def _byte_unit(max_bytes: float) -> tuple[float, str]:
    if max_bytes >= 1 << 30:
        return float(1 << 30), "GiB"
    return float(1 << 20), "MiB"
