"""A synthetic run directory holding every record kind, with figures the tests can predict."""

from __future__ import annotations

from pathlib import Path

from venusrl.metrics.writer import MetricsWriter

STEPS = 10
GIB = 1 << 30
# 20 trajectories over 5 groups: 10 span 0, 6 span 1, 4 span 2.
VERSION_SPANS = [[0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 1, 1], [0, 1, 1, 2], [1, 2, 2, 2]]
VERSION_SPAN_FRACTIONS = {0: 0.5, 1: 0.3, 2: 0.2}
EVAL_BEFORE, EVAL_AFTER = 0.25, 0.625


def step_record(step: int) -> dict:
    return {
        "kind": "step", "time_s": 2.0 * (step + 1), "step": step, "weight_version": step + 1,
        "reward_mean": 0.05 + 0.1 * step, "reward_std": 0.1, "loss": 1.0 / (step + 1),
        "policy_loss": 0.5, "kl_mean": 0.01, "entropy_mean": 1.2, "clip_fraction": 0.1,
        "grad_norm": 0.8, "learning_rate": 1e-6, "groups": 4, "trajectories": 32,
        "tokens_generated": 4000, "tokens_per_s": 100.0 + 10 * step,
        "kv_hit_rate": 0.5 + 0.04 * step, "groups_ready": 2, "sandboxes_live": 12,
        "step_time_s": 2.0, "wait_s": 0.3,
    }


def write_synthetic_run(run_dir: Path) -> Path:
    with MetricsWriter(run_dir) as writer:
        writer.write({"kind": "eval", "time_s": 0.5, "step": 0, "accuracy": EVAL_BEFORE, "split": "held_out"})
        for step in range(STEPS):
            for node, eighths_per_step in (("node-0", 1.0), ("node-1", 0.8)):
                writer.write({"kind": "sandbox", "time_s": 2.0 * step + 1, "node": node,
                              "memory_bytes": int((step + 1) * eighths_per_step * GIB / 8),
                              "live": step + 2, "limit_bytes": 2 * GIB})
            if step < len(VERSION_SPANS):
                writer.write({"kind": "group", "time_s": 2.0 * step + 1.5, "group_id": step,
                              "prompt_id": f"p{step}", "reward_mean": 0.5,
                              "version_spans": VERSION_SPANS[step], "tokens_generated": 1000})
            writer.write(step_record(step))
        writer.write({"kind": "eval", "time_s": 21.0, "step": STEPS - 1, "accuracy": EVAL_AFTER, "split": "held_out"})
        writer.write({"kind": "summary", "time_s": 21.5, "groups_dropped": 3, "final_reward": 0.95})
    return run_dir
