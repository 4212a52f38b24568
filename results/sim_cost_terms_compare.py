"""Side by side: venus's end-to-end speedup (time to the last step) in the simulator before
the cost terms of issue 22 (results/sim-integrated) and after (results/sim-cost-terms), with
the paper's figure. Usage: python results/sim_cost_terms_compare.py [before_dir] [after_dir]
[after_suffix] (the after files' names end in it, `-quick.json` by default: `-quick-final.json`
for results/sim-machine-speed). Prints one markdown table per scenario (medians of per-seed
paired ratios, as the tables)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from venusrl.sim.scenarios import PAPER_FIG10, PAPER_TABLE1


def table(path: Path) -> dict[str, dict]:
    data = json.loads(path.read_text())
    return {", ".join(f"{k}={v}" for k, v in row.items() if k not in ("throughput", "speedup", "first_batch_speedup",
                                                                     "end_to_end_speedup", "seeds")): row
            for row in data["table"]}


def fig10_paper(label: str) -> str:
    """The paper's range for the cell (§6.2 gives ranges over its baselines, not per baseline)."""
    model = "qwen3-4b" if "qwen3-4b" in label else "qwen3-32b"
    batch = int(label.split("batch=")[1].split(",")[0])
    cell = PAPER_FIG10["bsz16_async_1.5_2.0"] if batch == 16 else PAPER_FIG10["bsz32_64_async_1.5_2.0"][model]
    return f"{cell[0]:.2f}-{cell[1]:.2f}"


def main(before_dir: Path, after_dir: Path, after_suffix: str = "-quick.json") -> None:
    for name, others in (("fig10-quick.json", ("slime", "rollflash", "thunderagent")),
                         ("table1-quick.json", ("+priority", "+kv_residency", "+migration"))):
        before, after = table(before_dir / name), table(after_dir / name.replace("-quick.json", after_suffix))
        fig10 = name.startswith("fig10")
        print(f"\n### {name.removesuffix('-quick.json')} (quick)\n")
        what = "venus / {other}" if fig10 else "{other} / baseline"
        print("| case | " + " | ".join(what.format(other=o) for o in others) + " |")
        print("|---|" + "---|" * len(others))
        for label in after:
            cells = []
            for other in others:
                b = before.get(label, {}).get("end_to_end_speedup", {}).get(other)
                a = after[label]["end_to_end_speedup"][other]
                if fig10:
                    paper = fig10_paper(label)
                else:
                    batch = int(label.split("batch=")[1].split(",")[0])
                    paper = f"{PAPER_TABLE1[batch][('+priority', '+kv_residency', '+migration').index(other) + 1]:.2f}"
                cells.append(f"{'-' if b is None else f'{b:.2f}x'} -> **{a:.2f}x** (paper {paper})")
            print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    dirs = [Path(a) for a in sys.argv[1:3]] or [Path("results/sim-integrated"), Path("results/sim-cost-terms")]
    main(*dirs, *sys.argv[3:4])
