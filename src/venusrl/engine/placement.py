"""Opening a run's rollout engines where `engine.placement` says: in this process
(`AsyncEngine`) or each in its own process (`RemoteEngine` to `engine/remote/process.py`: spawned
here, or already running, e.g. as Ray actors, and named by their handshakes); with
`engine.backend: vllm`, vLLM engines (`VLLMEngine`, in the vLLM venv)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from venusrl.engine.async_engine import AsyncEngine
from venusrl.engine.client import EngineClient
from venusrl.engine.config import EngineConfig
from venusrl.engine.engine import Engine
from venusrl.engine.remote.process import EngineSpec
from venusrl.engine.remote.remote import RemoteEngine, spawn_engines
from venusrl.weights.broadcast import WeightGroup

log = logging.getLogger(__name__)


def engine_spec(model_dir: Path, engine: EngineConfig, model: Any, weight_version: int = 0,
                torch_threads: int | None = None) -> EngineSpec:
    """What an engine process builds, from the config's `engine` and `model` sections."""
    return EngineSpec(model_dir=str(model_dir), engine=engine, dtype=model.dtype, device=model.device,
                      weight_version=weight_version, chat_template_kwargs=model.chat_template_kwargs,
                      tool_call_format=model.tool_call_format, torch_threads=torch_threads)


def open_engines(model_dir: Path, engine: EngineConfig, model: Any, count: int, weight_version: int = 0,
                 handshakes: list[dict[str, Any]] | None = None,
                 weight_group: WeightGroup | None = None) -> list[EngineClient]:
    """`count` engine clients; with `handshakes`, clients of those running engine processes.
    With `weight_group` (rank 0 in this process), the engine processes started here join it
    as ranks 1..count."""
    if handshakes is not None:
        return [RemoteEngine.from_handshake(h, name=f"engine {i} ({h['address'][0]}, pid {h['pid']})")
                for i, h in enumerate(handshakes)]
    if engine.backend == "vllm":  # vLLM's AsyncLLM runs its engine core in processes of its own
        from venusrl.engine.vllm.backend import VLLMEngine

        return [VLLMEngine.start(model_dir, engine, dtype=model.dtype, weight_version=weight_version)
                for _ in range(count)]
    if engine.placement == "process":
        spec = engine_spec(model_dir, engine, model, weight_version)
        return list(spawn_engines([spec.model_copy(update={"weight_group": weight_group.member(rank + 1)})
                                   if weight_group is not None else spec for rank in range(count)]))
    engines = []
    for _ in range(count):
        built = Engine.from_pretrained(model_dir, engine, dtype=model.dtype, device=model.device)
        built.weight_version = weight_version
        built.tokenizer.configure(model.chat_template_kwargs, model.tool_call_format)
        engines.append(AsyncEngine(built))
    return engines
