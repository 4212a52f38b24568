"""`venusrl train` on one GPU with a 0.6B-shaped random Qwen3 (byte vocabulary), train_gpu.yaml:
the generated tokens/s of the whole loop per step (metrics.jsonl), into a JSON file.

    python results/engine-gpu/train_loop.py OUT.json [--device cpu --layers 2 --hidden 64 --heads 4 --kv-heads 2 --head-dim 16]

The issue's bar: at least 3,000 generated tokens/s for the loop on the GPU. With --device cpu
and a small shape it is a smoke test of this script."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--slots", type=int, default=64)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp())
    venusrl = [sys.executable, "-m", "venusrl"]
    subprocess.run([*venusrl, "model", "make-tiny", str(work / "m"), "--layers", str(args.layers), "--hidden",
                    str(args.hidden), "--heads", str(args.heads), "--kv-heads", str(args.kv_heads), "--head-dim",
                    str(args.head_dim), "--intermediate", str(3 * args.hidden)], check=True)
    (work / "t.yaml").write_text((HERE / "train_gpu.yaml").read_text().replace("MODEL_DIR", str(work / "m")))
    device = [] if args.device == "cuda" else ["model.device=cpu", "model.dtype=float32"]
    started = time.perf_counter()
    run = subprocess.run([*venusrl, "train", str(work / "t.yaml"), f"trainer.steps={args.steps}",
                          f"scheduler.slots_per_engine={args.slots}", *device, "--run-dir", str(work / "run"),
                          "--no-progress"], capture_output=True, text=True)
    result = {"command": " ".join(sys.argv), "device": args.device,
              "shape": {k: getattr(args, k) for k in ("layers", "hidden", "heads", "kv_heads", "head_dim")},
              "rc": run.returncode, "wall_s": round(time.perf_counter() - started, 1), "stderr_tail": run.stderr[-2000:]}
    metrics = work / "run" / "metrics.jsonl"
    if metrics.exists():
        steps = [json.loads(line) for line in metrics.read_text().splitlines() if '"kind": "step"' in line]
        result["steps"] = [{k: s.get(k) for k in ("step", "step_time_s", "tokens_generated", "tokens_per_s")}
                           for s in steps]
        generated = sum(s.get("tokens_generated") or 0 for s in steps)
        seconds = sum(s.get("step_time_s") or 0 for s in steps)
        result["generated_tokens_per_s"] = round(generated / seconds, 1) if seconds else None
        result["at_least_3000_tokens_per_s"] = bool(seconds) and generated / seconds >= 3000
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "stderr_tail"}, indent=2))
    sys.exit(run.returncode)


if __name__ == "__main__":
    main()
