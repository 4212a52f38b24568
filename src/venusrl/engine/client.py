"""`EngineClient`: everything a rollout worker, orchestrator, trainer or HTTP server asks of
one engine, as typed calls. No closure crosses it, so an engine can live in this process
(`AsyncEngine`), in another process or on another node (a remote client speaking a wire
protocol), or in the simulator: the callers are the same code.

Ordering: calls on one client take effect in the order they are made. `set_priority` is a
notification (it returns nothing and is not awaited): it is ordered before every later call
on the same client, which is what a caller re-prioritising and then generating relies on.

Implementations: `AsyncEngine` (engine/async_engine.py, this process) and `RemoteEngine`
(engine/remote/remote.py, the engine in its own OS process or Ray actor, over engine/remote/wire.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from venusrl.engine.engine import RequestOutput
from venusrl.engine.kv_pool import HostKV
from venusrl.engine.stats import EngineLoad, EngineStats
from venusrl.engine.step_log import StepLogSlice
from venusrl.types import Priority, SamplingParams


@dataclass(slots=True, frozen=True)
class PrefixKV:
    """The KV of the first `tokens` tokens of a prefix, copied to host memory for another
    engine (`kv.num_tokens == tokens`; 0 tokens when nothing page-aligned was cached)."""

    tokens: int
    kv: HostKV


@dataclass(slots=True, frozen=True)
class EngineHealth:
    alive: bool
    weight_version: int
    restarts: int  # engine rebuilds after crashes inside a step
    error: str | None = None  # why it died, when it did


@dataclass(slots=True, frozen=True)
class EngineInfo:
    """What a front end (the HTTP server) needs to know of the engine behind a client, fixed
    for the client's life: read without a round trip."""

    vocab_size: int
    max_position_embeddings: int
    kv_capacity_tokens: int
    page_size: int
    eos_token_ids: tuple[int, ...]


# Where an engine process takes prefix KV from other engines (`KVReceiver`): host, port.
KVAddress = tuple[str, int]


@runtime_checkable
class EngineClient(Protocol):
    def generate(self, prompt_ids: list[int], sampling: SamplingParams, priority: Priority | None = None,
                 trajectory_id: str | None = None) -> AsyncIterator[RequestOutput]:
        """One output per step that produced tokens, the last with `finished` set. Leaving the
        iteration early aborts the request (its computed KV stays cached for a resume)."""
        ...

    async def abort(self, request_id: str) -> RequestOutput | None:
        """Abort from outside the stream; its consumer sees the partial output, finished with
        reason "abort". None when the request had already finished."""
        ...

    def set_priority(self, trajectory_id: str, priority: Priority) -> None: ...

    async def start_trajectory(self, trajectory_id: str, priority: Priority) -> None: ...

    async def release_trajectory(self, trajectory_id: str) -> bool:
        """Its KV becomes plain cache; whether the trajectory was live."""
        ...

    async def demoted_trajectories(self) -> frozenset[str]:
        """Cheap in process (no call while the engine has never demoted anything); one round
        trip to an engine elsewhere."""
        ...

    async def load(self) -> EngineLoad: ...

    async def stats(self) -> EngineStats: ...

    async def steps_since(self, index: int) -> StepLogSlice:
        """The engine's timed steps from `index` on (`engine/step_log.py`): poll with the last
        slice's `next_index` to read only what is new."""
        ...

    async def export_prefix(self, token_ids: list[int]) -> PrefixKV: ...

    async def import_prefix(self, token_ids: list[int], kv: HostKV, trajectory_id: str | None = None) -> int:
        """Insert `token_ids[:kv.num_tokens]`'s KV; the tokens now cached. With a trajectory,
        it references the prefix (it is about to resume here)."""
        ...

    async def send_prefix(self, token_ids: list[int], target: EngineClient, trajectory_id: str | None = None) -> int:
        """Copy this engine's cached KV of the longest page-aligned prefix of `token_ids` into
        `target` (with a trajectory: it references the prefix there); the tokens `target`
        now holds. Between engine processes the KV goes straight from this engine's process to
        `target.kv_address` over the KV transport, not through the caller; otherwise it is
        `export_prefix` here and `import_prefix` there."""
        ...

    @property
    def kv_address(self) -> KVAddress | None:
        """Where this engine's process receives prefix KV; None for an engine in the caller's
        process."""
        ...

    def info(self) -> EngineInfo: ...

    async def update_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Applied at an iteration boundary before the call returns, all tensors or none (a
        bad one is a ValueError naming it, and the engine keeps its weights and version).
        A run pushes through `weights/pusher.py`, which picks how the tensors travel."""
        ...

    async def health(self) -> EngineHealth: ...

    async def shutdown(self) -> None: ...


async def copy_prefix(source: EngineClient, target: EngineClient, token_ids: list[int],
                      trajectory_id: str | None = None) -> int:
    """`send_prefix` through the caller: export from `source`, import into `target`."""
    prefix = await source.export_prefix(token_ids)
    if not prefix.tokens:
        return 0
    return await target.import_prefix(list(token_ids[: prefix.tokens]), prefix.kv, trajectory_id)
