"""Scenario results as rows, a markdown table and a bar plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def rows(cases: list[dict[str, Any]], reference: str, invert: bool = False) -> list[dict[str, Any]]:
    """One row per case: each system's throughput (trained tokens/s) and its speedup over
    `reference` (with `invert`, the reference's speedup over it)."""
    out = []
    for case in cases:
        throughput = {run["name"]: run["throughput_tokens_per_s"] for run in case["runs"]}
        base = throughput.get(reference) or 0.0
        row = {**case["label"], "throughput": throughput,
               "speedup": {name: (round(base / value, 3) if invert else round(value / base, 3)) if base and value else None
                           for name, value in throughput.items()}}
        out.append(row)
    return out


def markdown(table: list[dict[str, Any]], reference: str, paper: dict[int, tuple[float, ...]] | None = None,
             invert: bool = False) -> str:
    if not table:
        return ""
    names = list(table[0]["throughput"])
    label_keys = [k for k in table[0] if k not in ("throughput", "speedup")]
    header = [*label_keys, *(f"{n} tok/s" for n in names), *((f"{reference} / {n}" if invert else f"{n} / {reference}") for n in names if n != reference)]
    if paper:
        header.append("paper (Table 1)")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in table:
        cells = [str(row[k]) for k in label_keys]
        cells += [f"{row['throughput'][n]:,.0f}" for n in names]
        cells += [f"{row['speedup'][n]:.2f}x" if row["speedup"][n] is not None else "-" for n in names if n != reference]
        if paper:
            cells.append(" / ".join(f"{v:.2f}" for v in paper.get(row.get("batch"), ())))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(table: list[dict[str, Any]], reference: str, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(table[0]["throughput"])
    labels = [", ".join(f"{v}" for k, v in row.items() if k not in ("throughput", "speedup")) for row in table]
    width = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(table)), 4))
    for i, name in enumerate(names):
        values = [row["speedup"][name] or 0.0 for row in table]
        ax.bar([x + i * width for x in range(len(table))], values, width, label=name)
    ax.set_xticks([x + width * (len(names) - 1) / 2 for x in range(len(table))], labels, rotation=45, ha="right", fontsize=7)
    ax.set_ylabel(f"throughput / {reference}")
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
