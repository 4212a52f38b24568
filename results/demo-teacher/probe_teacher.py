"""How often an SFT model of the imperfect-teacher task calls a held-out problem with the
operands in the written order or swapped, sampled at the rollout temperature (T=1) through
the real agent loop and engine (the held-out evaluation's own loop and seeding).

    python probe_teacher.py MODEL_DIR PROBLEMS SAMPLES [config overrides...]

MODEL_DIR: the demo's WORKDIR/sft; the held-out problems are the demo's (`make_splits` of
examples/demo.yaml with the overrides), the first PROBLEMS of each operator, each sampled
SAMPLES times and once greedily. Prints, per operator, the share of calls in order, swapped
and neither (a copy error or no call), the graded reward, and how the per-problem swap
rates spread (a calibrated model swaps each problem about as often as the teacher did; one
that memorised swaps some problems always and others never)."""

import asyncio
import json
import re
import sys
from collections import Counter

from venusrl.config import load_config
from venusrl.coordinator.dataset import prompt_from_row
from venusrl.demo import make_splits
from venusrl.engine.async_engine import AsyncEngine
from venusrl.engine.engine import Engine
from venusrl.env.base import Episode
from venusrl.env.registry import environment_factory
from venusrl.model.chat import load_tokenizer
from venusrl.model.checkpoint import load_model
from venusrl.runtime.evaluation import scored_episodes

_QUESTION = re.compile(r"Compute \((\d+) ([+-]) (\d+)\)\.")


def first_call(episode: Episode) -> str | None:
    for message in episode.messages:
        for call in message.get("tool_calls") or []:
            try:
                return json.loads(call["function"]["arguments"])["expression"].replace(" ", "")
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
                return None
    return None


def order(swapped: bool):
    def score(episode: Episode) -> bool:
        a, op, b = _QUESTION.fullmatch(episode.row["question"]).groups()
        return first_call(episode) == (f"{b}{op}{a}" if swapped else f"{a}{op}{b}")
    return score


async def probe(model_dir: str, rows: list[dict], samples: int, config) -> list:
    tokenizer = load_tokenizer(model_dir)
    engine = AsyncEngine(Engine(load_model(model_dir), config.engine, tokenizer))
    prompts = [prompt_from_row(dict(row), f"probe row {i}", f"probe-{i}") for i, row in enumerate(rows)]
    try:
        return await scored_episodes([engine], tokenizer, environment_factory("calculator"), config.rollout, prompts,
                                     samples=samples, seed=config.run.seed, breakdowns=("operations",),
                                     scorers={"in_order": order(False), "swapped": order(True)})
    finally:
        await engine.shutdown()


def main() -> None:
    model_dir, problems, samples, overrides = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
    config = load_config("examples/demo.yaml", overrides)
    held_out = make_splits(config).held_out
    rows = [row for op in ("+", "-") for row in [r for r in held_out if r["operations"] == op][:problems]]
    episodes = asyncio.run(probe(model_dir, rows, samples, config))
    print(f"{model_dir}: {problems} held-out problems per operator, {samples} samples each at T="
          f"{config.rollout.temperature} and one greedy")
    for op in ("+", "-"):
        for decoding in ("greedy", "sampled"):
            chosen = [e for e in episodes if e.groups["operations"] == op and e.decoding == decoding]
            n = len(chosen)
            in_order = sum(e.scores["in_order"] for e in chosen) / n
            swapped = sum(e.scores["swapped"] for e in chosen) / n
            graded = sum(e.scores["graded"] for e in chosen) / n
            print(f"  {op} {decoding:7s} n={n:4d}: in order {in_order:.3f}, swapped {swapped:.3f}, "
                  f"neither {1 - in_order - swapped:.3f}; graded {graded:.3f}")
        per_problem = Counter()
        for e in episodes:
            if e.groups["operations"] == op and e.decoding == "sampled":
                per_problem[e.prompt_id] += e.scores["swapped"]
        spread = Counter(int(v) for v in per_problem.values())
        print(f"  {op} problems by swapped samples (of {samples}): "
              + ", ".join(f"{k}: {spread[k]}" for k in range(samples + 1)))


if __name__ == "__main__":
    main()
