"""`venusrl bench engine --backends ours,vllm,hf`: generated tokens/s of each engine backend
side by side on the same model and prompts (greedy, no early stop), in paired repeats whose
order rotates, and each backend's greedy agreement with ours. vLLM runs through `VLLMEngine`,
the client venus's rollout uses (its start is timed apart: it is paid once per run). Run it in
the vLLM venv (`make vllm-venv`) to include vllm."""

from __future__ import annotations

import asyncio
import logging
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch

from venusrl.bench.engine import ThroughputCase
from venusrl.engine.config import EngineConfig
from venusrl.engine.engine import Engine
from venusrl.model.checkpoint import load_model
from venusrl.model.tiny import make_tiny_model
from venusrl.types import Priority, SamplingParams

log = logging.getLogger(__name__)

BACKENDS = ("ours", "vllm", "hf")
# head_dim 64: vLLM's CPU attention refuses head_dim 16 (and the engine bench's model has 32)
SHAPE = dict(layers=4, hidden=256, heads=4, kv_heads=2, head_dim=64, seed=1)
# vLLM's CPU worker binds its OpenMP threads to all cores but one (VLLM_CPU_OMP_THREADS_BIND=auto
# reserves one for the engine core): ours and hf get the same number of threads. On a shared,
# oversubscribed host that matters tenfold: two OpenMP threads contending with other processes
# ran our engine at 30-50 tok/s where one thread ran it at 440-530 (same case, same minute).
THREADS = max(1, (os.cpu_count() or 2) - 1)
CASES = {"quick": [ThroughputCase(batch=16, prompt_len=128, new_tokens=64)],
         "full": [ThroughputCase(batch=16, prompt_len=128, new_tokens=64),
                  ThroughputCase(batch=8, prompt_len=1024, new_tokens=64)]}


def parse_backends(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in BACKENDS]
    if bad or not names:
        raise ValueError(f"--backends: {', '.join(bad) or 'none given'} not among {', '.join(BACKENDS)}")
    return names


def _engine_config(case: ThroughputCase) -> EngineConfig:
    return EngineConfig(kv_capacity_tokens=case.batch * (case.prompt_len + case.new_tokens) * 2,
                        max_running_requests=case.batch, max_prefill_tokens=case.batch * case.prompt_len,
                        page_size=32)


def _ours(model_dir: Path, case: ThroughputCase) -> Callable[[list[list[int]], SamplingParams], list[list[int]]]:
    model = load_model(model_dir)

    def generate(prompts, params):
        engine = Engine(model, _engine_config(case))
        return [o.output_ids for o in engine.generate(prompts, params)]

    return generate


def _hf(model_dir: Path, case: ThroughputCase):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    def generate(prompts, params):
        ids = torch.tensor(prompts)
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=case.new_tokens, min_new_tokens=case.new_tokens,
                                 eos_token_id=None, pad_token_id=0)
        return out[:, ids.shape[1]:].tolist()

    return generate


def _vllm(model_dir: Path, case: ThroughputCase, runner: asyncio.Runner):
    from venusrl.engine.vllm.backend import VLLMEngine

    async def start():
        return VLLMEngine.start(model_dir, _engine_config(case))

    began = time.perf_counter()
    engine = runner.run(start())
    startup = time.perf_counter() - began

    async def collect(prompt, params):
        last = None
        async for out in engine.generate(prompt, params, Priority.HIGH):
            last = out
        return last.output_ids

    async def batch(prompts, params):
        return await asyncio.gather(*(collect(p, params) for p in prompts))

    return (lambda prompts, params: runner.run(batch(prompts, params))), engine, startup


def side_by_side(model_dir: Path, case: ThroughputCase, backends: list[str], repeats: int) -> dict[str, object]:
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, 256, (case.batch, case.prompt_len), generator=g).tolist()
    params = SamplingParams(max_new_tokens=case.new_tokens, temperature=0, stop_token_ids=(-1,))
    runner = asyncio.Runner()
    generators: dict[str, Callable] = {}
    result: dict[str, object] = {"case": asdict(case), "threads": THREADS}
    vllm_engine = None
    threads = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    try:
        for name in backends:
            if name == "vllm":
                generators[name], vllm_engine, result["vllm_startup_s"] = _vllm(model_dir, case, runner)
            else:
                generators[name] = (_ours if name == "ours" else _hf)(model_dir, case)
        outputs = {name: generate(prompts, params) for name, generate in generators.items()}  # warm-up
        times: dict[str, list[float]] = {name: [] for name in backends}
        for r in range(repeats):
            order = backends[r % len(backends):] + backends[:r % len(backends)]  # rotate: paired, interleaved
            for name in order:
                began = time.perf_counter()
                generators[name](prompts, params)
                times[name].append(time.perf_counter() - began)
            log.info("repeat %d/%d: %s", r + 1, repeats, {n: round(t[-1], 3) for n, t in times.items()})
    finally:
        if vllm_engine is not None:
            runner.run(vllm_engine.shutdown())
        runner.close()
        torch.set_num_threads(threads)
    generated = case.batch * case.new_tokens
    tps = {name: [generated / t for t in ts] for name, ts in times.items()}
    result["backends"] = {name: statistics.median(v) for name, v in tps.items()}
    result["tokens_per_s"] = tps
    result["spread"] = {name: [min(v), max(v)] for name, v in tps.items()}
    if "ours" in outputs:
        result["greedy_match_with_ours"] = {
            name: sum(a == b for a, b in zip(out, outputs["ours"], strict=True)) / case.batch
            for name, out in outputs.items() if name != "ours"}
    return result


def run(quick: bool, backends: list[str]) -> dict[str, object]:
    repeats = 3 if quick else 5
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_tiny_model(Path(tmp) / "model", **SHAPE)
        cases = []
        for i, case in enumerate(CASES["quick" if quick else "full"]):
            log.info("backends %s, case %d: %s", ",".join(backends), i + 1, case)
            cases.append(side_by_side(model_dir, case, backends, repeats))
    first = cases[0]
    return {"model": {**SHAPE, "vocab": 263}, "quick": quick, "repeats": repeats,
            "backends": first["backends"], "cases": cases}
