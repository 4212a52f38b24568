"""`venusrl demo` (behind `make demo`): the whole product on a tiny model, on CPU, with RL
improving on what supervised warm-starting leaves undone.

1. Build a tiny Qwen3-architecture model (random weights, byte-level tokenizer) and check
   our forward pass against transformers on it.
2. Warm-start it with SFT on calculator demonstrations (one tool call, then the tool's
   result). In `make demo`'s task (the imperfect teacher, `demo.teacher_swap_fraction`,
   results/demo-teacher/) that share of the subtractions are called with the operands
   swapped, so the SFT model samples both orders. In the answer-form task
   `demo.sft_ungraded_fraction` of them end "The result is N." instead of the graded
   'Answer: N'.
3. Train it with GRPO through multi-turn tool use with `venusrl train`'s loop (streaming
   trainer, rollout engine, coordinator, the configured scheduler). What to learn from the
   reward alone: the written operand order, or the graded form.
   (`data.generate_options.busy_fraction` gives a third task: a tool that sometimes answers
   with a transient error, never demonstrated.)
4. Evaluate the SFT model (the control: 0 RL steps) and the RL-trained model on held-out
   problems disjoint from the SFT and RL problems: greedy and sampled, graded form and any
   form, per operator (and with and without the transient error). Everything goes to
   RUN_DIR/summary.json.
"""

from __future__ import annotations

import json
import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from venusrl.config import Config
from venusrl.coordinator.dataset import prompt_from_row
from venusrl.env.calculator import (
    CALCULATE_TOOL,
    GRADED_ANSWER,
    demonstration,
    final_number_matches,
    generate_dataset,
)
from venusrl.model.chat import load_tokenizer
from venusrl.model.checkpoint import load_model
from venusrl.model.tiny import make_tiny_model
from venusrl.runtime.data import check_steps_fit_data
from venusrl.runtime.evaluation import evaluate_model
from venusrl.runtime.launch import run_training
from venusrl.trainer.checkpoint import latest_checkpoint
from venusrl.trainer.sft import sft_examples, train_sft

log = logging.getLogger(__name__)
UNGRADED_ANSWER = "The result is {}."  # right number, but not the form the grader reads
# the figure `make demo` leads with: sampled (T=1) decoding, graded form. Greedy decoding
# hides what RL changes where the demonstrations are mixed: it picks their majority.
HEADLINE = ("sampled", "graded")
# row fields the eval figures are broken down by, where the rows have them: the operators
# ("+", "-"), and busy_calls 0 (the tool answers) or 1 (the first call fails)
BREAKDOWNS = ("operations", "busy_calls")


@dataclass(frozen=True)
class Splits:
    """The demo's three problem sets; `held_out` shares no question with the other two."""

    sft: list[dict[str, Any]]
    train: list[dict[str, Any]]
    held_out: list[dict[str, Any]]


@dataclass(frozen=True)
class WarmStart:
    sft_dir: Path
    splits: Splits
    sft: dict[str, Any]
    parity_max_abs_diff: float


def run_demo(config: Config, progress: bool = True) -> dict:
    """SFT, the control's evaluation, RL with `scheduler.policy`, the evaluation after RL."""
    started = time.monotonic()
    check_rl_steps(config)
    warm = warm_start(config, progress)
    before = evaluate(warm.sft_dir, config, warm.splits)
    summary = reinforce(config, warm, before, progress)
    summary["wall_s"] = round(time.monotonic() - started, 2)
    Path(summary["run_dir"], "summary.json").write_text(json.dumps(summary, indent=2))
    _print_summary(summary)
    return summary


def warm_start(config: Config, progress: bool = True) -> WarmStart:
    """Tiny model, parity check, the three problem sets (written to WORKDIR/data), SFT; or,
    with `demo.sft_model`, that SFT model and the problem sets."""
    console = Console(stderr=True)
    demo, workdir = config.demo, Path(config.demo.workdir)
    if demo.sft_model is not None:
        return reuse_warm_start(config, console)
    base_dir, sft_dir = workdir / "model", workdir / "sft"
    make_tiny_model(base_dir, hidden=demo.model_hidden, layers=demo.model_layers, heads=demo.model_heads,
                    kv_heads=demo.model_kv_heads, rope_theta=demo.rope_theta, seed=config.run.seed)
    max_diff = parity_with_transformers(base_dir)
    console.print(f"[bold]model[/] {base_dir}: Qwen3 architecture, {demo.model_layers} layers x {demo.model_hidden}; "
                  f"max |logit difference| vs transformers {max_diff:.1e}")
    splits = make_splits(config)
    write_splits(splits, workdir / "data")
    conversations = demonstrations(splits.sft, demo.sft_ungraded_fraction, demo.sft_seed, demo.teacher_swap_fraction)
    examples = sft_examples(load_tokenizer(base_dir), conversations, [CALCULATE_TOOL])
    sft = train_sft(base_dir, sft_dir, examples, epochs=demo.sft_epochs, lr=demo.sft_learning_rate,
                    batch_size=demo.sft_batch_size, seed=config.run.seed, progress=progress)
    console.print(f"[bold]sft[/] {len(examples)} demonstrations (the tool never busy, "
                  f"{demo.teacher_swap_fraction:.0%} of subtractions called swapped) x {demo.sft_epochs} epochs "
                  f"in {sft['seconds']:.0f}s, loss per epoch {', '.join(f'{x:.3f}' for x in sft['loss_per_epoch'])}")
    return WarmStart(sft_dir, splits, sft, max_diff)


def reuse_warm_start(config: Config, console: Console) -> WarmStart:
    """An earlier warm start of this config: its SFT model directory as it is, the problem
    sets drawn again (they depend on the config alone), the parity check on the SFT model."""
    sft_dir = Path(config.demo.sft_model)
    if not (sft_dir / "config.json").is_file():
        raise ValueError(f"demo.sft_model: {sft_dir} is not a model directory (no config.json)")
    max_diff = parity_with_transformers(sft_dir)
    splits = make_splits(config)
    write_splits(splits, Path(config.demo.workdir) / "data")
    console.print(f"[bold]sft[/] reused {sft_dir}; max |logit difference| vs transformers {max_diff:.1e}")
    return WarmStart(sft_dir, splits, {"seconds": 0.0, "reused": str(sft_dir)}, max_diff)


def reinforce(config: Config, warm: WarmStart, before: dict, progress: bool = True) -> dict:
    """GRPO from the SFT model with the configured scheduler, then the held-out evaluation of
    the final weights; the summary compares them with `before` (the SFT model's figures)."""
    check_rl_steps(config)
    workdir = Path(config.demo.workdir)
    run_dir = workdir / f"run-{config.scheduler.policy}"
    data = config.data.model_copy(update={"train": str(workdir / "data" / "train.jsonl"), "eval": None,
                                          "generate_eval": 0})  # held-out figures come from `evaluate`
    trained = config.model_copy(update={"model": config.model.model_copy(update={"path": str(warm.sft_dir)}),
                                        "data": data})
    summary = run_training(trained, run_dir, progress)
    final = latest_checkpoint(run_dir)
    if final is None or final.state.step != summary["steps"]:
        raise RuntimeError(f"{run_dir}: no checkpoint of the final step {summary['steps']}")
    after = evaluate(final.model_dir, config, warm.splits)
    headline_before, headline_after = _figure(before, HEADLINE), _figure(after, HEADLINE)
    return {**summary, "train_wall_s": summary["wall_s"],
            "accuracy_before": headline_before, "accuracy_after": headline_after,
            "headline": "/".join(HEADLINE), "gain_over_control": round(headline_after - headline_before, 4),
            "control": "the SFT model, 0 RL steps, evaluated on the same held-out problems and seed",
            "before": before, "after": after, "sft_seconds": round(warm.sft["seconds"], 2),
            "sft_reused": warm.sft.get("reused"),
            "parity_max_abs_diff": warm.parity_max_abs_diff, "run_dir": str(run_dir), "seed": config.run.seed,
            "splits": {"sft": len(warm.splits.sft), "train": len(warm.splits.train),
                       "held_out": len(warm.splits.held_out)}}


def check_rl_steps(config: Config) -> None:
    """Before any work: the demo evaluates the final step's checkpoint, so the RL problems
    must last that many steps and a checkpoint must fall on the last."""
    steps, every = config.trainer.steps, config.trainer.checkpoint_every_steps
    if not steps or steps % every:
        raise ValueError(f"trainer.checkpoint_every_steps ({every}) must divide trainer.steps ({steps}): "
                         "the demo evaluates the final step's checkpoint")
    check_steps_fit_data(steps, config.coordinator.batch_groups, config.data.generate_train, config.trainer.epochs)


def evaluate(model_dir: Path, config: Config, splits: Splits) -> dict:
    prompts = [prompt_from_row(dict(row), f"held-out row {i}", f"held-out-{i}") for i, row in enumerate(splits.held_out)]
    console = Console(stderr=True)
    console.print(f"[bold]evaluating[/] {model_dir} on {len(prompts)} held-out problems (greedy and sampled)")
    breakdowns = [field for field in BREAKDOWNS if any(field in row for row in splits.held_out)]
    result = evaluate_model(model_dir, config, prompts, samples=config.demo.eval_samples, seed=config.run.seed,
                            scorers={"any_form": final_number_matches}, breakdowns=breakdowns)
    console.print(f"  greedy graded {result['greedy']['graded']:.3f}, sampled graded {result['sampled']['graded']:.3f}, "
                  f"greedy any form {result['greedy']['any_form']:.3f}")
    return result


def make_splits(config: Config) -> Splits:
    """SFT problems (from a tool that is never busy), RL problems (`data.generate_train`,
    seed `data.generate_seed`) and `data.generate_eval` held-out problems whose questions
    appear in neither: drawn from seed `generate_seed + 1` onwards, repeats skipped."""
    options, data = dict(config.data.generate_options), config.data
    sft = _generate(config.demo.sft_examples, config.demo.sft_seed, {**options, "busy_fraction": 0.0})
    train = _generate(data.generate_train, data.generate_seed, options)
    seen = {row["question"] for row in sft + train}
    held_out: list[dict[str, Any]] = []
    for seed in range(data.generate_seed + 1, data.generate_seed + 1 + _HELD_OUT_DRAWS):
        for row in _generate(max(4 * data.generate_eval, 64), seed, options):
            if row["question"] not in seen:
                seen.add(row["question"])
                held_out.append({**row, "id": f"held-out-{len(held_out)}"})
            if len(held_out) == data.generate_eval:
                return Splits(sft, train, held_out)
    raise ValueError(f"data.generate_eval: only {len(held_out)} problems of data.generate_options {options} are not "
                     f"among the {len(seen) - len(held_out)} SFT and RL problems; ask for fewer or widen the options")


_HELD_OUT_DRAWS = 16  # seeds tried for held-out problems before the problem space counts as used up


def _generate(count: int, seed: int, options: dict[str, Any]) -> list[dict[str, Any]]:
    """`generate_dataset` rows; a bad option is named as the config key it came from."""
    try:
        return generate_dataset(count, seed=seed, **options)
    except (TypeError, ValueError) as err:
        raise ValueError(f"data.generate_options: {err}") from None


def write_splits(splits: Splits, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, rows in (("sft", splits.sft), ("train", splits.train), ("held_out", splits.held_out)):
        (directory / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def demonstrations(rows: list[dict], ungraded_fraction: float, seed: int,
                   swap_fraction: float = 0.0) -> list[list[dict]]:
    """One demonstration per row; `ungraded_fraction` of them (at random) end in the ungraded
    form, as if from an annotator who did not follow the system prompt; independently,
    `swap_fraction` of the rows with a subtraction (at random) call it with the operands
    swapped, as if from a careless teacher (their answers are wrong). Both counts are exact
    (rounded)."""
    rng = random.Random(seed)
    ungraded = round(ungraded_fraction * len(rows))
    forms = [UNGRADED_ANSWER] * ungraded + [GRADED_ANSWER] * (len(rows) - ungraded)
    rng.shuffle(forms)  # first, so the forms are drawn as they were before swaps existed
    subtractions = [i for i, row in enumerate(rows) if "-" in row.get("operations", "")]
    swapped = set(rng.sample(subtractions, round(swap_fraction * len(subtractions))))
    return [demonstration(row, form, swap_subtraction=i in swapped)
            for i, (row, form) in enumerate(zip(rows, forms, strict=True))]


@torch.no_grad()
def parity_with_transformers(model_dir: Path) -> float:
    import transformers

    ours = load_model(model_dir)
    reference = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.arange(0, 200)[None] % ours.args.vocab_size
    return (ours(ids) - reference(ids).logits).abs().max().item()


def _figure(evaluation: dict, key: tuple[str, str]) -> float:
    return evaluation[key[0]][key[1]]


def _print_summary(summary: dict) -> None:
    console = Console(stderr=True)
    before, after = summary["before"], summary["after"]
    console.print(f"[bold]held-out[/] {summary['splits']['held_out']} problems, none among the SFT or RL problems; "
                  f"{summary['steps']} GRPO steps ({summary['scheduler']} scheduler); control = SFT model, 0 RL steps")
    for decoding in ("greedy", "sampled"):
        for score in ("graded", "any_form"):
            console.print(f"  {decoding:7s} {score:8s} accuracy {before[decoding][score]:.3f} -> "
                          f"{after[decoding][score]:.3f}")
    for field in BREAKDOWNS:
        for value, group in before.get(f"by_{field}", {}).items():
            console.print(f"  {field} {value!r:5s} ({group['prompts']} problems): "
                          + "; ".join(f"{decoding} graded {group[decoding]['graded']:.3f} -> "
                                      f"{after[f'by_{field}'][value][decoding]['graded']:.3f}"
                                      for decoding in ("greedy", "sampled")))
    console.print(f"[bold]gain over the control[/] ({summary['headline']}) {summary['gain_over_control']:+.3f}; "
                  f"whole demo {summary['wall_s']:.0f}s; run directory {summary['run_dir']}")
