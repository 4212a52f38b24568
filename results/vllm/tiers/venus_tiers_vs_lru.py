"""One venus round on vLLM with `engine.cache_policy: tiers` (holds by tier and demotion,
engine/vllm/tiers.py) and one with `lru` (vLLM's own prefix cache), all else equal: the quick
case of `venusrl bench rollout` with a tight KV pool (1,500 tokens per engine, the sweep's tight
budget), the same tasks, a trainer of 0.5 s per step, no learned predictor (the coordinator's
priors rank the groups). Writes each round's cache figures to the JSON named on the command
line. Run from the repository root in the vLLM venv (`make vllm-venv`):

    nice -n 19 .venv-vllm/bin/python results/vllm/tiers/venus_tiers_vs_lru.py results/vllm/tiers/venus_tiers_vs_lru.json
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from dataclasses import asdict, replace
from pathlib import Path

import torch

from venusrl.bench import rollout
from venusrl.model.tiny import make_tiny_model

CASE = replace(rollout.QUICK, engine_backend="vllm", head_dim=64, kv_tokens_per_engine=1500)
TRAINER_S = 0.5
FIGURES = ("hit_rate", "tokens", "evicted_tokens", "demotions", "preemptions", "migrations", "time_to_last_step_s",
           "time_to_first_batch_s")


def main(out: str) -> None:
    torch.set_num_threads(1)
    rollout.SETUPS["venus_lru"] = replace(rollout.SETUPS["venus"], cache_policy="lru", demotion=False)
    result = {"case": asdict(CASE), "trainer_s": TRAINER_S, "predictor": None,
              "setups": {m: asdict(rollout.SETUPS[m]) for m in ("venus", "venus_lru")}}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_tiny_model(Path(tmp) / "model", seed=1, head_dim=CASE.head_dim)
        for mode in ("venus", "venus_lru"):
            measured = asyncio.run(rollout._round(model_dir, CASE, mode, TRAINER_S, rollout.tasks(CASE, CASE.seed)))
            result[mode] = {k: measured.figures[k] for k in FIGURES}
            print(mode, json.dumps(result[mode]), flush=True)
    Path(out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":  # vLLM spawns its engine-core processes
    main(sys.argv[1])
