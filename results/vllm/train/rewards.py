"""Reward first vs last steps of two `venusrl train` runs (metrics.jsonl): python rewards.py OURS VLLM."""

import json
import statistics
import sys


def figures(run_dir: str) -> dict:
    steps = [r for r in map(json.loads, open(f"{run_dir}/metrics.jsonl")) if r.get("kind") == "step"]
    reward = [s["reward_mean"] for s in steps]
    kl = [s["behaviour_kl"] for s in steps if s.get("behaviour_kl") is not None]
    return {"steps": len(steps), "reward_per_step": [round(r, 3) for r in reward],
            "reward_first5": round(statistics.mean(reward[:5]), 3), "reward_last5": round(statistics.mean(reward[-5:]), 3),
            "reward_first10": round(statistics.mean(reward[:10]), 3), "reward_last10": round(statistics.mean(reward[-10:]), 3),
            "behaviour_kl_mean": statistics.mean(kl) if kl else None, "behaviour_kl_max": max(map(abs, kl)) if kl else None,
            "tokens_generated": sum(s.get("tokens_generated", 0) for s in steps),
            "summary": json.load(open(f"{run_dir}/summary.json"))}


if __name__ == "__main__":
    print(json.dumps({"ours": figures(sys.argv[1]), "vllm": figures(sys.argv[2])}, indent=1))
