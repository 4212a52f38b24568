"""`venusrl demo`: the most complete real path that exists, end to end on the tiny model.

Builds a tiny Hugging Face model, checks our forward pass against transformers on it, then
runs groups of calculator trajectories concurrently: agent loops generating turns on the
rollout engine (continuous batching, radix cache, HIGH groups before LOW), parsing tool
calls, running the calculator tool and feeding results back. The model is random (it rarely
calls the tool, so most trajectories end after one turn) and the rewards are not the point;
the tokens, masks, log-probs and cache figures are real.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import Progress

from venusrl.engine.async_engine import AsyncEngine
from venusrl.engine.config import EngineConfig
from venusrl.engine.engine import Engine
from venusrl.env.calculator import CalculatorEnv, generate_dataset
from venusrl.model.tiny import make_tiny_model
from venusrl.rollout.agent_loop import Rollout, run_agent_loop
from venusrl.rollout.config import RolloutConfig
from venusrl.rollout.generate import engine_generate
from venusrl.types import Priority

log = logging.getLogger(__name__)


def run_demo(workdir: Path, groups: int = 2, group_size: int = 4, seed: int = 0) -> dict:
    console = Console()
    model_dir = workdir / "model"
    with console.status("building the tiny model"):
        make_tiny_model(model_dir, seed=seed)
    console.print(f"[bold]model[/] {model_dir} (Qwen3 architecture, random weights)")
    engine = Engine.from_pretrained(model_dir, EngineConfig(kv_capacity_tokens=32768, page_size=1))
    max_diff = _compare_with_transformers(model_dir, engine)
    console.print(f"[bold]parity[/] max |logit difference| vs transformers: {max_diff:.2e}")

    rows = generate_dataset(groups, seed=seed)
    config = RolloutConfig(max_turns=3, max_new_tokens_per_turn=32, temperature=0.8)
    # the first group is the critical one (HIGH), the rest LOW, as the coordinator would rank them
    priority = {f"g{g}-t{k}": Priority.HIGH if g == 0 else Priority.LOW
                for g in range(groups) for k in range(group_size)}
    rollouts = asyncio.run(_rollouts(engine, rows, group_size, config, priority, console))

    stats = engine.stats()
    summary = {
        "parity_max_abs_diff": max_diff,
        "trajectories": [
            {"id": r.trajectory_id, "turns": len(r.turns), "tokens": len(r.token_ids),
             "generated_tokens": sum(r.generated_mask), "tool_calls": sum(t.tool_calls for t in r.turns),
             "tool_errors": sum(t.tool_errors for t in r.turns), "finish_reason": r.finish_reason,
             "reward": r.reward}
            for r in rollouts
        ],
        "engine": {k: stats[k] for k in ("prompt_tokens", "cached_tokens", "hit_rate", "hit_rate_by_priority")},
    }
    for t in summary["trajectories"]:
        console.print(f"[bold]{t['id']}[/] {t['turns']} turns, {t['tokens']} tokens "
                      f"({t['generated_tokens']} generated), {t['tool_calls']} tool calls, "
                      f"{t['tool_errors']} malformed, {t['finish_reason']}, reward {t['reward']:.0f}")
    console.print(f"[bold]engine[/] prompt tokens {stats['prompt_tokens']}, cached {stats['cached_tokens']} "
                  f"(hit rate {stats['hit_rate']:.2f}: group mates share the prompt's KV, later turns "
                  "reuse earlier turns')")
    (workdir / "demo.json").write_text(json.dumps(summary, indent=2))
    return summary


async def _rollouts(engine: Engine, rows: list[dict], group_size: int, config: RolloutConfig,
                    priority: dict[str, Priority], console: Console) -> list[Rollout]:
    async_engine = AsyncEngine(engine)
    generate = engine_generate(async_engine, priority.get)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("rollouts", total=len(priority))

        async def one(row: dict, trajectory_id: str) -> Rollout:
            rollout = await run_agent_loop(CalculatorEnv(), row, generate, engine.tokenizer, config, trajectory_id)
            await async_engine.acall(lambda e: e.release_trajectory(trajectory_id))
            progress.advance(task)
            return rollout

        try:
            return await asyncio.gather(*(one(row, f"g{g}-t{k}") for g, row in enumerate(rows)
                                          for k in range(group_size)))
        finally:
            await async_engine.shutdown()


def _compare_with_transformers(model_dir: Path, engine: Engine) -> float:
    import transformers

    ours = engine.runner.model
    reference = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.arange(0, 200)[None] % ours.args.vocab_size
    with torch.no_grad():
        return (ours(ids) - reference(ids).logits).abs().max().item()
