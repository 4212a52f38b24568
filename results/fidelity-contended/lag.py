"""How late each prompt was trained against its admission order, by kind of prompt.

The coordinator admits groups in the training file's order; with no reordering at all the
k-th trained prompt (by file position) would be trained at step k // B + 1. A prompt's lag is
the step it was trained at less that step: positive means later than its turn. A scheduler
that defers long or hard groups shows a larger lag for them than action_level (first come
first served) does, whose lag comes from the groups' own running times alone. Every step
trains B prompts, so the lags of a run average to zero; what differs is who is late.

    python results/fidelity-contended/lag.py results/fidelity-contended/ledgers/attempt1 results/fidelity-contended/ledgers/attempt2
    (or any fidelity workdir: seed-*/data/train.jsonl and seed-*/run-*/{trained.jsonl,config.yaml})
"""

import json
import statistics
import sys
from pathlib import Path


def lags(run_dir: Path, rows: dict[str, dict], batch_groups: int) -> dict[str, int]:
    ledger = [json.loads(line) for line in (run_dir / "trained.jsonl").read_text().splitlines()]
    trained_at = {pid: entry["step"] for entry in ledger for pid in entry["prompt_ids"]}
    in_file_order = sorted(trained_at, key=lambda pid: rows[pid]["position"])
    return {pid: trained_at[pid] - (k // batch_groups + 1) for k, pid in enumerate(in_file_order)}


def main(workdirs: list[Path]) -> None:
    print(f"{'run (mean lag in steps)':72s} {'sub':>6s} {'add':>6s} {'short':>6s} {'mid':>6s} {'long':>6s} "
          f"{'|lag|>=2':>9s}")
    for workdir in workdirs:
        for run_dir in sorted(workdir.glob("seed-*/run-*")):
            if not (run_dir / "trained.jsonl").exists():
                continue
            lines = (run_dir.parent / "data" / "train.jsonl").read_text().splitlines()
            rows = {row["id"]: {**row, "position": i} for i, row in enumerate(map(json.loads, lines))}
            config = (run_dir / "config.yaml").read_text()
            batch_groups = int(config.split("batch_groups:")[1].split()[0])
            lag = lags(run_dir, rows, batch_groups)
            by_length = sorted(lag, key=lambda pid: len(rows[pid]["question"]))
            third = len(by_length) // 3
            parts = {
                "sub": [p for p in lag if rows[p]["operations"] == "-"],
                "add": [p for p in lag if rows[p]["operations"] == "+"],
                "short": by_length[:third], "mid": by_length[third:-third], "long": by_length[-third:],
            }
            means = {k: statistics.fmean(lag[p] for p in v) for k, v in parts.items()}
            far = sum(abs(v) >= 2 for v in lag.values()) / len(lag)
            print(f"{str(run_dir):72s} " + " ".join(f"{means[k]:6.2f}" for k in
                  ("sub", "add", "short", "mid", "long")) + f" {far:9.1%}")


if __name__ == "__main__":
    main([Path(a) for a in sys.argv[1:]])
