"""`venusrl bench weight-push`: how long the trainer's weights take to reach an engine, per
engine placement, today's paths against weights/'s, on one model shape.

    device_copy    engine in this process, the trainer's live tensors copied in (cast on device)
    host_copy      the same engine, today's in-process path: the state dict copied to host
                   memory (`StreamingTrainer.engine_weights`), then into the engine
    shared_memory  engine process on this host, CPU: one shared segment, a handle on the socket
    cuda_ipc       engine process on this host, GPU: one device buffer, its CUDA IPC handle
    socket         the same engine process, today's path: the host state dict's bytes over
                   its socket (`RemoteEngine.update_weights`)
    broadcast      the same engine process in a weight group (gloo; NCCL on GPUs), standing
                   in for an engine on another host

A push is timed from the trainer holding new weights to the engine serving them (its version
set): everything the engine needs before its next step, host copies included. Each
placement's first push (segments created, pages faulted in, IPC handles opened: once per
run) is reported apart as `first_push_s`. Placements are
interleaved and rotated each repeat (A,B,C / B,C,A / ...), so a load change on the machine
hits all of them; each new transport is compared with today's path for the same placement
repeat by repeat (`speedup`: median and spread of the paired ratios). After the last repeat
each engine's weights are checked bit for bit against the trainer's (sha256, weights/digest.py).

Weights are random, in the official Qwen3 shapes (as ../shared/gpu/gpu_check.py builds them):
nothing is downloaded.
"""

from __future__ import annotations

import asyncio
import gc
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from venusrl.engine.async_engine import AsyncEngine
from venusrl.engine.config import EngineConfig
from venusrl.engine.engine import Engine
from venusrl.engine.remote.process import EngineSpec
from venusrl.engine.remote.remote import RemoteEngine, spawn_engines
from venusrl.model.args import ModelArgs
from venusrl.model.causal_lm import CausalLM
from venusrl.model.checkpoint import load_model, resolve_dtype, save_weights
from venusrl.model.shapes import QWEN3_SHAPES as SHAPES
from venusrl.model.shapes import hf_config_fields
from venusrl.model.tiny import make_tiny_model
from venusrl.weights.broadcast import WeightGroup
from venusrl.weights.config import WeightSyncConfig
from venusrl.weights.digest import expected_digest
from venusrl.weights.pusher import WeightPusher

# today's path each new transport is compared with
BASELINES = {"device_copy": "host_copy", "shared_memory": "socket", "cuda_ipc": "socket", "broadcast": "socket"}
IN_PROCESS = ("device_copy", "host_copy")
ENGINE = EngineConfig(kv_capacity_tokens=256, page_size=16, max_running_requests=4)


def default_placements(device: str) -> list[str]:
    if device.startswith("cuda"):  # NCCL takes one rank per GPU: a broadcast needs the engine on another GPU
        return ["device_copy", "host_copy", "cuda_ipc", "socket"]
    return ["device_copy", "host_copy", "shared_memory", "socket", "broadcast"]


def write_model_dir(path: Path, shape: str, dtype: torch.dtype, device: str) -> Path:
    """A checkpoint of `shape` with random weights (byte-level tokenizer: the vocabulary is
    the shape's, the tokens an engine can be asked for are not the point here)."""
    make_tiny_model(path, layers=1, hidden=64, heads=4, kv_heads=2)  # tokenizer, generation config, template
    config = json.loads((path / "config.json").read_text())
    config.update(hf_config_fields(SHAPES[shape]), torch_dtype=str(dtype).removeprefix("torch."))
    (path / "config.json").write_text(json.dumps(config, indent=2))
    save_weights(random_model(ModelArgs.from_hf(config), dtype, device, seed=0), path)
    return path


def random_model(args: ModelArgs, dtype: torch.dtype, device: str, seed: int) -> CausalLM:
    with torch.device("meta"):
        model = CausalLM(args)
    model = model.to_empty(device=device).to(dtype)
    if args.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.02, generator=generator)
    return model.requires_grad_(False)


def measure_weight_push(model_shape: str = "qwen3-0.6b", device: str = "cpu", dtype: str = "bfloat16",
                        trainer_dtype: str | None = None, placements: list[str] | None = None, repeats: int = 5,
                        workdir: Path | None = None, progress: Callable[[str], None] = print) -> dict[str, Any]:
    """Seconds per push for each placement, paired with today's path; a JSON-able dict."""
    if model_shape not in SHAPES:
        raise ValueError(f"model_shape {model_shape!r} is not one of {', '.join(SHAPES)}")
    placements = placements or default_placements(device)
    unknown = [p for p in placements if p not in (*BASELINES, "host_copy", "socket")]
    if unknown:
        raise ValueError(f"placements {unknown} are not among {', '.join((*BASELINES, 'host_copy', 'socket'))}")
    if device.startswith("cuda") and "broadcast" in placements:
        raise ValueError("placements: broadcast over NCCL needs the engine on another GPU than the trainer; "
                         "this benchmark runs both on one")
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    engine_dtype = resolve_dtype(dtype)
    source_dtype = resolve_dtype(trainer_dtype or dtype)
    with tempfile.TemporaryDirectory(dir=workdir) as scratch:
        progress(f"writing a random {model_shape} checkpoint ({dtype}) ...")
        model_dir = write_model_dir(Path(scratch) / "model", model_shape, engine_dtype, device)
        return asyncio.run(_measure(model_dir, model_shape, device, engine_dtype, source_dtype, placements, repeats,
                                    progress))


async def _measure(model_dir: Path, shape: str, device: str, engine_dtype: torch.dtype, source_dtype: torch.dtype,
                   placements: list[str], repeats: int, progress: Callable[[str], None]) -> dict[str, Any]:
    trainer = random_model(ModelArgs.from_dir(model_dir), source_dtype, device, seed=1)
    weights = {name: tensor.detach() for name, tensor in trainer.state_dict().items()}
    nbytes = sum(t.numel() * engine_dtype.itemsize for n, t in trainer.named_parameters())
    in_process = AsyncEngine(Engine(load_model(model_dir, engine_dtype, device), ENGINE)) \
        if any(p in IN_PROCESS for p in placements) else None
    remote, group = None, None
    if any(p not in IN_PROCESS for p in placements):
        if "broadcast" in placements:
            group = WeightGroup.open_source("127.0.0.1", 0, 1, "nccl" if device.startswith("cuda") else "gloo", 600.0)
        spec = EngineSpec(model_dir=str(model_dir), engine=ENGINE, dtype=str(engine_dtype).removeprefix("torch."),
                          device=device, weight_group=group.member(1) if group else None)
        progress("starting the engine process ...")
        remote = (await asyncio.to_thread(spawn_engines, [spec]))[0]
    pushers = {p: _pusher(p, in_process, remote, engine_dtype, group) for p in placements}
    seconds: dict[str, list[float]] = {p: [] for p in placements}
    first: dict[str, float] = {}
    version = 0

    async def timed(placement: str) -> float:
        nonlocal version
        version += 1
        gc.collect()
        _sync(device)
        started = time.perf_counter()
        if placement in ("host_copy", "socket"):  # today: StreamingTrainer.engine_weights first
            await pushers[placement].push({name: tensor.to("cpu", copy=True) for name, tensor in weights.items()},
                                          version)
        else:
            await pushers[placement].push(weights, version)
        _sync(device)
        return time.perf_counter() - started

    try:
        for placement in placements:  # a run's first push maps segments and faults pages in: once per run
            first[placement] = round(await timed(placement), 4)
            progress(f"first push {placement}: {first[placement]:.3f} s")
        for repeat in range(repeats):
            order = placements[repeat % len(placements):] + placements[: repeat % len(placements)]
            for placement in order:
                seconds[placement].append(await timed(placement))
                progress(f"repeat {repeat + 1}/{repeats} {placement}: {seconds[placement][-1]:.3f} s")
        want = expected_digest(weights, engine_dtype, trainer.args.tie_word_embeddings)
        identical = {}
        if in_process is not None:
            identical["in_process"] = want == await in_process.weight_digest()
        if remote is not None:
            identical["engine_process"] = want == await remote.weight_digest()
    finally:
        for pusher in pushers.values():
            pusher.close()
        for engine in (in_process, remote):
            if engine is not None:
                await engine.shutdown()
    return _report(shape, device, engine_dtype, source_dtype, nbytes, repeats, seconds, first, identical)


def _pusher(placement: str, in_process: AsyncEngine | None, remote: RemoteEngine | None, dtype: torch.dtype,
            group: WeightGroup | None) -> WeightPusher:
    engine = in_process if placement in IN_PROCESS else remote
    transport = "device_copy" if placement == "host_copy" else placement
    return WeightPusher([engine], WeightSyncConfig(transport=transport), dtype, group)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4),
            "max": round(max(values), 4), "samples": [round(v, 4) for v in values]}


def _report(shape: str, device: str, engine_dtype: torch.dtype, source_dtype: torch.dtype, nbytes: int,
            repeats: int, seconds: dict[str, list[float]], first: dict[str, float],
            identical: dict[str, bool]) -> dict[str, Any]:
    placements: dict[str, Any] = {}
    for placement, values in seconds.items():
        entry = {"seconds": _spread(values), "gb_per_s": round(nbytes / statistics.median(values) / 1e9, 3),
                 "first_push_s": first[placement]}
        baseline = BASELINES.get(placement)
        if baseline in seconds:
            ratios = [b / a for a, b in zip(values, seconds[baseline], strict=True)]
            entry["speedup"] = {"against": baseline, **_spread(ratios)}
        placements[placement] = entry
    return {"benchmark": "weight_push", "model_shape": shape, "device": device,
            "engine_dtype": str(engine_dtype).removeprefix("torch."),
            "trainer_dtype": str(source_dtype).removeprefix("torch."), "weight_bytes": nbytes, "repeats": repeats,
            "torch_threads": torch.get_num_threads(), "bit_identical": identical, "placements": placements}
