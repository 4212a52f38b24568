"""`venusrl bench engine`: throughput against transformers, greedy agreement, the cost of
the engine in its own process (`remote_ratio`), and the KV hit rate of a multi-turn agentic
workload under a tight KV budget for each cache policy."""

from __future__ import annotations

import asyncio
import logging
import random
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil
import torch
from rich.progress import Progress

from venusrl.bench.report import emit
from venusrl.engine.async_engine import AsyncEngine
from venusrl.engine.client import EngineClient
from venusrl.engine.config import EngineConfig
from venusrl.engine.engine import Engine
from venusrl.engine.remote.process import EngineSpec
from venusrl.engine.remote.remote import spawn_engines
from venusrl.model.checkpoint import load_model
from venusrl.model.tiny import make_tiny_model
from venusrl.types import Priority, SamplingParams

log = logging.getLogger(__name__)


@dataclass(slots=True, frozen=True)
class ThroughputCase:
    batch: int
    prompt_len: int
    new_tokens: int


def throughput(model_dir: Path, case: ThroughputCase, repeats: int) -> dict[str, float]:
    """Generated tokens/s of our engine and of `transformers.generate` on the same model,
    prompts and batch (greedy, no early stop), and whether the tokens agree."""
    import transformers

    ours = load_model(model_dir)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, 256, (case.batch, case.prompt_len), generator=g)
    params = SamplingParams(max_new_tokens=case.new_tokens, temperature=0, stop_token_ids=(-1,))
    engine_capacity = case.batch * (case.prompt_len + case.new_tokens) * 2
    our_times, hf_times = [], []
    for _ in range(repeats):
        engine = Engine(ours, EngineConfig(kv_capacity_tokens=engine_capacity, max_running_requests=case.batch,
                                           max_prefill_tokens=case.batch * case.prompt_len))
        start = time.perf_counter()
        outputs = engine.generate(prompts.tolist(), params)
        our_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        with torch.no_grad():
            reference = theirs.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=False,
                                        max_new_tokens=case.new_tokens, min_new_tokens=case.new_tokens,
                                        eos_token_id=None, pad_token_id=0)
        hf_times.append(time.perf_counter() - start)
    generated = case.batch * case.new_tokens
    matches = sum(o.output_ids == r[case.prompt_len:].tolist() for o, r in zip(outputs, reference, strict=True))
    ours_tps, hf_tps = generated / min(our_times), generated / min(hf_times)
    return {"ours_tokens_per_s": ours_tps, "hf_tokens_per_s": hf_tps, "hf_ratio": ours_tps / hf_tps,
            "greedy_match": matches / case.batch}


async def _timed_batch(client: EngineClient, prompts: list[list[int]], params: SamplingParams) -> tuple[float, list]:
    """Seconds to generate every prompt at once through `client` (streamed, as a rollout
    worker reads it), and the outputs."""

    async def one(prompt: list[int]) -> list[int]:
        final = None
        async for output in client.generate(prompt, params):
            final = output
        return final.output_ids

    start = time.perf_counter()
    outputs = await asyncio.gather(*(one(p) for p in prompts))
    return time.perf_counter() - start, outputs


def remote_throughput(model_dir: Path, case: ThroughputCase, repeats: int) -> dict[str, object]:
    """Generated tokens/s through an `EngineClient` with the engine in its own process
    (`RemoteEngine`) over the same with the engine in this process (`AsyncEngine`): same
    model, engine config, torch threads and prompts. Repeats interleave the two, alternating
    which goes first, each repeat on fresh prompts (so both meet the same cache state); the
    ratio is the median of the per-repeat paired ratios; `remote_cpu_ratio` is the same over
    the CPU seconds each side used.

    Both run on one torch thread (one core per engine, as `bench rollout` runs them): with
    a thread pool each, the side that just ran keeps its pool's threads spinning into the
    other side's turn, and on a 2-core machine whichever goes second loses about half."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _remote_throughput(model_dir, case, repeats)
    finally:
        torch.set_num_threads(threads)


def _remote_throughput(model_dir: Path, case: ThroughputCase, repeats: int) -> dict[str, object]:
    config = EngineConfig(kv_capacity_tokens=case.batch * (case.prompt_len + case.new_tokens) * (repeats + 2),
                          max_running_requests=case.batch, max_prefill_tokens=case.batch * case.prompt_len)
    params = SamplingParams(max_new_tokens=case.new_tokens, temperature=0, stop_token_ids=(-1,))
    local = AsyncEngine(Engine(load_model(model_dir), config))
    [remote] = spawn_engines([EngineSpec(model_dir=str(model_dir), engine=config, torch_threads=1)])
    clients = {"in_process": local, "remote": remote}
    g = torch.Generator().manual_seed(1)
    # CPU seconds each side spends (both processes for the remote one): less swayed by the
    # other tenants of a shared machine than wall time
    here, child = psutil.Process(), psutil.Process(remote.process.pid)

    def cpu_s(name: str) -> float:
        own = sum(here.cpu_times()[:2])
        return own + sum(child.cpu_times()[:2]) if name == "remote" else own

    async def measure() -> dict[str, object]:
        times: dict[str, list[float]] = {name: [] for name in clients}
        cpu: dict[str, list[float]] = {name: [] for name in clients}
        agree = []
        for repeat in range(repeats + 1):  # the first round warms both up, untimed
            prompts = torch.randint(0, 256, (case.batch, case.prompt_len), generator=g).tolist()
            order = list(clients) if repeat % 2 else list(reversed(clients))
            outputs = {}
            for name in order:
                cpu_before = cpu_s(name)
                seconds, outputs[name] = await _timed_batch(clients[name], prompts, params)
                if repeat:
                    times[name].append(seconds)
                    cpu[name].append(cpu_s(name) - cpu_before)
            agree.append(outputs["remote"] == outputs["in_process"])
        tokens = case.batch * case.new_tokens
        ratios = [local_s / remote_s for local_s, remote_s in zip(times["in_process"], times["remote"], strict=True)]
        # CPU clocks tick in 10 ms: a repeat too short to register on both sides has no ratio
        cpu_ratios = [local_s / remote_s for local_s, remote_s in zip(cpu["in_process"], cpu["remote"], strict=True)
                      if local_s > 0 and remote_s > 0]
        return {"remote_ratio": statistics.median(ratios), "remote_ratio_min": min(ratios),
                "remote_ratio_max": max(ratios), "remote_ratio_per_repeat": ratios,
                "remote_cpu_ratio": statistics.median(cpu_ratios) if cpu_ratios else None,
                "remote_cpu_ratio_min": min(cpu_ratios, default=None),
                "remote_cpu_ratio_max": max(cpu_ratios, default=None),

                "remote_tokens_per_s": tokens / statistics.median(times["remote"]),
                "in_process_tokens_per_s": tokens / statistics.median(times["in_process"]),
                "remote_greedy_match": all(agree), "remote_case": {**asdict(case), "repeats": repeats, "torch_threads": 1}}

    async def run_and_close() -> dict[str, object]:
        try:
            return await measure()
        finally:
            await local.shutdown()
            await remote.shutdown()

    return asyncio.run(run_and_close())


@dataclass(slots=True, frozen=True)
class AgenticCase:
    """SWE-agent-like trajectories, scaled to a tiny model: a long shared system prompt, a
    task prompt shared by the group, then turns of generation, a tool pause and an
    observation. Half the groups are HIGH (critical), half LOW."""

    groups: int
    group_size: int
    system_tokens: int
    task_tokens: int
    turns: int
    generate_tokens: int
    observation_tokens: int
    pause_steps: tuple[int, int]  # tool latency in engine steps, uniform in [lo, hi]
    kv_fraction: float  # KV capacity over the distinct tokens of all final contexts (shared prefixes once)
    host_fraction: float  # host-tier capacity, same unit (0: device pool only)
    slots: int  # generation slots: LOW requests are sent only while fewer are in use (paper §4.3)


@dataclass(slots=True)
class _AgentTrajectory:
    trajectory_id: str
    priority: Priority
    context: list[int]
    turns_left: int
    resume_at: int = 0
    request_id: str | None = None


def agentic(model_dir: Path, case: AgenticCase, cache_policy: str, demotion: bool, host: bool = True,
            seed: int = 0) -> dict[str, float]:
    rng = random.Random(seed)
    model = load_model(model_dir)
    system = [rng.randrange(256) for _ in range(case.system_tokens)]
    total = case.groups * case.group_size
    own_tokens = case.turns * (case.generate_tokens + case.observation_tokens)
    distinct = case.system_tokens + case.groups * case.task_tokens + total * own_tokens
    capacity = int(case.kv_fraction * distinct)
    host_capacity = int(case.host_fraction * distinct) if host else 0
    engine = Engine(model, EngineConfig(kv_capacity_tokens=capacity, host_kv_capacity_tokens=host_capacity,
                                        page_size=1, cache_policy=cache_policy,
                                        demotion=demotion, max_running_requests=total,
                                        max_prefill_tokens=4096, chunked_prefill_size=2048))
    trajectories = []
    for g in range(case.groups):
        task = [rng.randrange(256) for _ in range(case.task_tokens)]
        priority = Priority.HIGH if g % 2 == 0 else Priority.LOW
        for k in range(case.group_size):
            # trajectories arrive spread over the first tool-latency window, as they do in a run
            trajectory = _AgentTrajectory(f"g{g}-t{k}", priority, system + task, case.turns,
                                          resume_at=rng.randint(0, case.pause_steps[1]))
            engine.start_trajectory(trajectory.trajectory_id, priority)
            trajectories.append(trajectory)
    params = SamplingParams(max_new_tokens=case.generate_tokens, temperature=0, stop_token_ids=(-1,))
    step = 0
    by_request: dict[str, _AgentTrajectory] = {}
    finished_at: dict[Priority, int] = {}
    live = list(trajectories)
    while live:
        for trajectory in live:
            if trajectory.request_id is not None or trajectory.resume_at > step:
                continue
            if trajectory.priority == Priority.LOW and len(by_request) >= case.slots:
                continue  # a LOW trajectory takes a slot only when one would otherwise idle
            trajectory.request_id = engine.add_request(trajectory.context, params, trajectory.priority,
                                                       trajectory.trajectory_id)
            by_request[trajectory.request_id] = trajectory
        for output in engine.step() if engine.has_work else []:
            if not output.finished:
                continue
            trajectory = by_request.pop(output.request_id)
            trajectory.request_id = None
            trajectory.turns_left -= 1
            trajectory.context = trajectory.context + output.output_ids
            if trajectory.turns_left == 0:
                engine.release_trajectory(trajectory.trajectory_id)
                finished_at[trajectory.priority] = step
            else:
                trajectory.context += [rng.randrange(256) for _ in range(case.observation_tokens)]
                trajectory.resume_at = step + rng.randint(*case.pause_steps)
        live = [t for t in live if t.turns_left > 0]
        step += 1
    engine.scheduler.check_integrity()
    stats = engine.stats()
    return {
        "hit_rate": stats["hit_rate"],
        "hit_rate_high": stats["hit_rate_by_priority"]["high"],
        "hit_rate_low": stats["hit_rate_by_priority"]["low"],
        "recomputed_tokens": stats["recomputed_tokens"],
        "prompt_tokens": stats["prompt_tokens"],
        "evicted_tokens": stats["evicted_tokens"],
        "retractions": stats["retractions"],
        "demotions": stats["demotions"],
        "steps": step,
        "high_done_step": finished_at.get(Priority.HIGH, step),
        "kv_capacity_tokens": capacity,
        "host_kv_capacity_tokens": host_capacity,
        "host_loaded_tokens": stats["host_loaded_tokens"],
    }


# `hf_ratio` is measured on "throughput": in the full run an RL turn's shape, hundreds of
# generated tokens, so decode dominates. The full run also reports "short_throughput" (a
# quarter of its time in prefill, where both sides run the same GEMMs) as `short_case`.
QUICK = {
    "throughput": ThroughputCase(batch=8, prompt_len=64, new_tokens=32),
    "remote": ThroughputCase(batch=8, prompt_len=64, new_tokens=64),
    "agentic": AgenticCase(groups=4, group_size=4, system_tokens=256, task_tokens=192, turns=6,
                           generate_tokens=12, observation_tokens=12, pause_steps=(4, 30), kv_fraction=0.55, host_fraction=0.5,
                           slots=8),
}
FULL = {
    "throughput": ThroughputCase(batch=16, prompt_len=256, new_tokens=256),
    "remote": ThroughputCase(batch=16, prompt_len=256, new_tokens=128),
    "short_throughput": ThroughputCase(batch=16, prompt_len=128, new_tokens=64),
    "agentic": AgenticCase(groups=8, group_size=4, system_tokens=512, task_tokens=256, turns=10,
                           generate_tokens=16, observation_tokens=16, pause_steps=(4, 40), kv_fraction=0.55, host_fraction=0.5,
                           slots=12),
}
BENCH_SHAPE = dict(layers=4, hidden=256, heads=8, kv_heads=2, seed=1)
POLICIES = {"lru": ("lru", False), "tiers": ("tiers", False), "tiers_demotion": ("tiers", True)}


def run(quick: bool) -> dict[str, object]:
    cases = QUICK if quick else FULL
    with tempfile.TemporaryDirectory() as tmp, Progress() as progress:
        model_dir = make_tiny_model(Path(tmp) / "model", **BENCH_SHAPE)
        task = progress.add_task("engine bench", total=3 + 2 * len(POLICIES))
        result: dict[str, object] = {"model": {**BENCH_SHAPE, "vocab": 263}, "quick": quick,
                                     "machine": "shared: timings carry the load of other processes; see the spread"}
        result.update(throughput(model_dir, cases["throughput"], repeats=2 if quick else 5))
        result["throughput_case"] = asdict(cases["throughput"])
        progress.advance(task)
        if "short_throughput" in cases:
            short = cases["short_throughput"]
            result["short_case"] = {**asdict(short), **throughput(model_dir, short, repeats=5)}
        progress.advance(task)
        result.update(remote_throughput(model_dir, cases["remote"], repeats=7 if quick else 9))
        progress.advance(task)
        result["agentic_case"] = asdict(cases["agentic"])
        # with the host tier (the engine as configured for agentic work, like SGLang's HiCache
        # baseline), then the device pool alone
        for section, host in (("agentic", True), ("agentic_device_only", False)):
            for name, (policy, demotion) in POLICIES.items():
                result.setdefault(section, {})[name] = agentic(model_dir, cases["agentic"], policy, demotion, host)
                progress.advance(task)
    for section, prefix in (("agentic", ""), ("agentic_device_only", "device_only_")):
        runs = result[section]
        result[f"{prefix}hit_rate"] = {name: r["hit_rate"] for name, r in runs.items()}
        result[f"{prefix}hit_rate_high"] = {name: r["hit_rate_high"] for name, r in runs.items()}
        result[f"{prefix}recomputed_tokens"] = {name: r["recomputed_tokens"] for name, r in runs.items()}
    return result


def main(quick: bool, json_out: Path | None, backends: list[str] | None = None) -> None:
    if backends:  # the side-by-side tokens/s of engine backends instead (bench/engine_backends.py)
        from venusrl.bench.engine_backends import run as run_backends

        emit(run_backends(quick, backends), json_out)
        return
    emit(run(quick), json_out)
