"""`venusrl demo` (behind `make demo`): the whole product on a tiny model, on CPU.

1. Build a tiny Qwen3-architecture model (random weights, byte-level tokenizer) and check
   our forward pass against transformers on it.
2. Warm-start it with SFT on generated calculator demonstrations (tool call per operation,
   then the tool's result as the answer), a `sft_ungraded_fraction` of which end in a form
   the grader does not take ("The result is N." for "Answer: N").
3. Train it with GRPO through multi-turn tool use with `venusrl train`'s loop: streaming
   trainer, rollout engine, coordinator and the configured scheduler.
4. Report held-out accuracy (greedy) before and after RL, and the wall time, in
   RUN_DIR/summary.json. What RL has to learn from the reward is the graded form.
"""

from __future__ import annotations

import json
import logging
import random
import time
from pathlib import Path

import torch
from rich.console import Console

from venusrl.config import Config
from venusrl.env.calculator import CALCULATE_TOOL, GRADED_ANSWER, demonstration, generate_dataset
from venusrl.model.chat import load_tokenizer
from venusrl.model.checkpoint import load_model
from venusrl.model.tiny import make_tiny_model
from venusrl.runtime.cli import run_training
from venusrl.trainer.sft import sft_examples, train_sft

log = logging.getLogger(__name__)
UNGRADED_ANSWER = "The result is {}."  # right number, but not the form the grader reads


def run_demo(config: Config, progress: bool = True) -> dict:
    console = Console(stderr=True)
    demo = config.demo
    workdir = Path(demo.workdir)
    started = time.monotonic()
    base_dir, sft_dir = workdir / "model", workdir / "sft"
    make_tiny_model(base_dir, hidden=demo.model_hidden, layers=demo.model_layers, heads=demo.model_heads,
                    kv_heads=demo.model_kv_heads, rope_theta=demo.rope_theta, seed=config.run.seed)
    max_diff = parity_with_transformers(base_dir)
    console.print(f"[bold]model[/] {base_dir}: Qwen3 architecture, {demo.model_layers} layers x {demo.model_hidden}; "
                  f"max |logit difference| vs transformers {max_diff:.1e}")

    rows = generate_dataset(demo.sft_examples, seed=demo.sft_seed, **config.data.generate_options)
    conversations = demonstrations(rows, demo.sft_ungraded_fraction, demo.sft_seed)
    examples = sft_examples(load_tokenizer(base_dir), conversations, [CALCULATE_TOOL])
    sft = train_sft(base_dir, sft_dir, examples, epochs=demo.sft_epochs, lr=demo.sft_learning_rate,
                    batch_size=demo.sft_batch_size, seed=config.run.seed, progress=progress)
    console.print(f"[bold]sft[/] {len(examples)} demonstrations x {demo.sft_epochs} epochs in {sft['seconds']:.0f}s, "
                  f"loss per epoch {', '.join(f'{x:.3f}' for x in sft['loss_per_epoch'])}")

    run_dir = workdir / f"run-{config.scheduler.policy}"
    trained = config.model_copy(update={"model": config.model.model_copy(update={"path": str(sft_dir)})})
    summary = run_training(trained, run_dir, progress)
    summary = {**summary, "train_wall_s": summary["wall_s"], "wall_s": round(time.monotonic() - started, 2),
               "sft_seconds": round(sft["seconds"], 2), "parity_max_abs_diff": max_diff, "run_dir": str(run_dir)}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    console.print(f"[bold]held-out accuracy[/] before RL {summary['accuracy_before']:.3f} -> after RL "
                  f"{summary['accuracy_after']:.3f} ({summary['steps']} GRPO steps, {config.scheduler.policy} "
                  f"scheduler); whole demo {summary['wall_s']:.0f}s; run directory {run_dir}")
    return summary


def demonstrations(rows: list[dict], ungraded_fraction: float, seed: int) -> list[list[dict]]:
    """One demonstration per row; `ungraded_fraction` of them (at random) end in the ungraded
    form, as if from an annotator who did not follow the system prompt."""
    ungraded = round(ungraded_fraction * len(rows))
    forms = [UNGRADED_ANSWER] * ungraded + [GRADED_ANSWER] * (len(rows) - ungraded)
    random.Random(seed).shuffle(forms)
    return [demonstration(row, form) for row, form in zip(rows, forms, strict=True)]


@torch.no_grad()
def parity_with_transformers(model_dir: Path) -> float:
    import transformers

    ours = load_model(model_dir)
    reference = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.arange(0, 200)[None] % ours.args.vocab_size
    return (ours(ids) - reference(ids).logits).abs().max().item()
