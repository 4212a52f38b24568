"""Paired repeats of the venus round (moves between engines on) of `venusrl bench rollout --quick
--engine-backend vllm`, with `engine.vllm_kv_connector` nixl and none, the two interleaved
(nixl first in even repeats, none first in odd ones), on the same tasks per repeat.

The round is the bench's own (`venusrl.bench.rollout._round`, the quick case, head_dim 64, the
trainer at 0.5 x T_batch, T_batch from one action_level calibration round as the bench takes it);
unlike the bench's venus round it runs without the learned length predictor (the coordinator's
group history instead), which both arms share.

Usage: paired.py REPEATS OUT.json"""
import asyncio
import json
import statistics
import sys
import tempfile
from dataclasses import asdict, replace
from pathlib import Path

import torch

from venusrl.bench.rollout import QUICK, _round, tasks
from venusrl.model.tiny import make_tiny_model

CONNECTORS = ("nixl", "none")


def main(repeats: int, out: Path) -> None:
    torch.set_num_threads(1)
    base = replace(QUICK, engine_backend="vllm", head_dim=64)
    rounds: dict[str, list[dict]] = {c: [] for c in CONNECTORS}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_tiny_model(Path(tmp) / "model", seed=1, head_dim=64)
        calibration = asyncio.run(_round(model_dir, replace(base, vllm_kv_connector="none"), "action_level", 0.0,
                                         tasks(base, base.seed + 1000))).figures
        batch_s = calibration["time_to_last_step_s"] / base.steps
        for repeat in range(repeats):
            for connector in CONNECTORS if repeat % 2 == 0 else CONNECTORS[::-1]:
                case = replace(base, vllm_kv_connector=connector)
                figures = asyncio.run(_round(model_dir, case, "venus", 0.5 * batch_s, tasks(case, case.seed + repeat)))
                rounds[connector].append(figures.figures)
                print(connector, repeat, {k: figures.figures[k] for k in ("time_to_last_step_s", "migrations",
                                                                          "moved_tokens")}, flush=True)
    ratios = [b["time_to_last_step_s"] / a["time_to_last_step_s"] for a, b in zip(rounds["nixl"], rounds["none"])]
    result = {
        "case": asdict(base), "mode": "venus", "trainer_step_s": 0.5 * batch_s, "calibration_batch_s": batch_s,
        "order": "repeat r: nixl then none for even r, none then nixl for odd r; tasks seeded by r",
        "median": {c: {k: statistics.median(r[k] for r in rounds[c])
                       for k in ("time_to_last_step_s", "steady_step_s", "time_to_first_batch_s")} for c in CONNECTORS},
        "moved_tokens": {c: [r["moved_tokens"] for r in rounds[c]] for c in CONNECTORS},
        "prefill_computed_tokens": {c: [r["tokens"]["prefill_computed"] for r in rounds[c]] for c in CONNECTORS},
        "migrations": {c: [r["migrations"] for r in rounds[c]] for c in CONNECTORS},
        "none_over_nixl_time_to_last_step_per_repeat": ratios,
        "rounds": rounds,
    }
    out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(int(sys.argv[1]), Path(sys.argv[2]))
