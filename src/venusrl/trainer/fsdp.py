"""The streaming trainer over data-parallel FSDP2 ranks (torch.distributed: NCCL on CUDA, gloo
on the CPU).

Every rank is handed every group. Rank r trains rows i ≡ r (mod world size) of it; each rank's
loss is a token *sum* over its own rows, so the sum of the ranks' gradients is the gradient the
single-process `StreamingTrainer` computes for the whole group. Advantages come from all K
rewards and `step` divides by the whole batch's token count, both known to every rank, so the
exact token mean over the batch is kept.

`ShardedTrainer` is rank 0, in the caller's process, with the methods `TrainerService` calls;
ranks 1.. are processes it starts, which run every call rank 0 runs, in the same order. Calls
reach them through a pipe each, not a collective: between calls a rank may wait longer than any
collective timeout (for rollouts), and a pipe ends with EOF when rank 0's process does.

Mixed precision is FSDP2's `MixedPrecisionPolicy`: each rank keeps its shard of the float32
master parameters and optimizer state, all-gathers the parameters in the compute dtype for
forward and backward, and reduce-scatters the gradients in float32.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Callable
from datetime import timedelta
from multiprocessing import connection as mp_connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from venusrl.model.checkpoint import copy_tokenizer_files
from venusrl.trainer.config import TrainerConfig
from venusrl.trainer.losses import PolicyLossStats
from venusrl.trainer.streaming import GroupResult, StepResult, StreamingTrainer, engine_copy
from venusrl.types import Group, Trajectory

log = logging.getLogger(__name__)

T = TypeVar("T")

# Builds a rank's policy model (and its frozen reference model, or None) on the device given.
# It is pickled to the worker processes: a module-level function or a partial of one.
ModelBuilder = Callable[[torch.device], tuple[nn.Module, nn.Module | None]]

_FULL_ON_RANK0 = StateDictOptions(full_state_dict=True, cpu_offload=True)


class FSDPTrainer(StreamingTrainer):
    """One rank's streaming trainer on an FSDP2-sharded model. Each method is a collective: every
    rank must get the same calls, with the same arguments, in the same order."""

    def __init__(self, model: nn.Module, config: TrainerConfig, version: int = 0, reference: nn.Module | None = None,
                 optimizer_state: Path | None = None, temperature: float = 1.0,
                 compute_dtype: torch.dtype = torch.float32) -> None:
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self._mesh = init_device_mesh(next(model.parameters()).device.type, (self.world_size,))
        # `_place` shards the policy forward (and the reference's); the optimizer then holds the shards
        super().__init__(model, config, version, reference, temperature, compute_dtype)
        if optimizer_state is not None:
            # every rank reads the whole state and keeps its own shard of it
            state = _by_name(torch.load(optimizer_state, weights_only=True), model)
            set_optimizer_state_dict(model, self.optimizer, state, options=StateDictOptions(full_state_dict=True))

    def _place(self) -> None:
        policy = MixedPrecisionPolicy(param_dtype=self.compute_dtype, reduce_dtype=torch.float32)
        _shard(self.policy, self._mesh, policy)
        if self.reference_policy is not None:
            _shard(self.reference_policy, self._mesh, policy)

    @torch.no_grad()
    def engine_weights(self) -> dict[str, torch.Tensor]:
        """On rank 0, the full weights on the CPU by Hugging Face name in the compute dtype (as
        `StreamingTrainer.engine_weights`); the other ranks take part in the gather and get {}."""
        return {name: engine_copy(tensor, self.compute_dtype) for name, tensor in self._master_weights().items()}

    def _master_weights(self) -> dict[str, torch.Tensor]:
        """The full float32 master weights on rank 0's CPU ({} on the others); a collective."""
        return get_model_state_dict(self.model, options=_FULL_ON_RANK0)

    def save(self, directory: Path, tokenizer_dir: Path) -> None:
        """What `checkpoint.save_policy` writes (the float32 master), written by rank 0. The
        optimizer state is in `Optimizer.state_dict()`'s layout, by parameter position, so a
        checkpoint resumes at any world size."""
        weights = self._master_weights()
        optimizer = get_optimizer_state_dict(self.model, self.optimizer, options=_FULL_ON_RANK0)
        if self.rank == 0:
            self.model.save_pretrained(directory / "model", state_dict=weights, safe_serialization=True)
            copy_tokenizer_files(tokenizer_dir, directory / "model")
            torch.save(_by_position(optimizer, self.model), directory / "optimizer.pt")

    def _forward_backward(self, trajectories: list[Trajectory], advantages: torch.Tensor) -> tuple[float, PolicyLossStats]:
        # FSDP2 all-gathers a layer's weights on every forward call and reduce-scatters its
        # gradient on every backward, so all ranks must run the same number of passes, each with
        # the same number of forward calls, or the collectives pair up wrongly and hang until the
        # timeout. Every rank holds the whole group, so each plans every rank's passes and
        # aligns them without talking: a pass shares its prefix only where every rank's does, and
        # a rank with no rows left runs an idle pass (loss and gradient exactly 0).
        plans = [self._plan(trajectories, range(rank, len(trajectories), self.world_size))
                 for rank in range(self.world_size)]
        mine = plans[self.rank]
        loss_sum, stats = 0.0, PolicyLossStats()
        for index in range(max(len(plan) for plan in plans)):
            if index >= len(mine):
                self._backward([_idle(trajectories[0])], torch.zeros(1), 0)
                continue
            rows = [trajectories[i] for i in mine[index]]
            shared = all(index < len(plan) and self._shared_prefix([trajectories[i] for i in plan[index]])
                         for plan in plans)
            pass_loss, pass_stats = self._backward(rows, advantages[mine[index]],
                                                   self._shared_prefix(rows) if shared else 0)
            loss_sum += pass_loss
            stats = stats.merge(pass_stats)
        totals: list[Any] = [None] * self.world_size
        dist.all_gather_object(totals, (loss_sum, stats))
        return sum(loss for loss, _ in totals), functools.reduce(PolicyLossStats.merge, (s for _, s in totals))


class ShardedTrainer:
    """Rank 0 of `world_size` FSDP2 ranks, in this process; ranks 1.. are spawned processes. Rank
    r uses cuda:r with NCCL, or the CPU with gloo. Each call goes to every rank, rank 0 last.

    A failed call stops every rank (they may be stuck at different points of a collective) and
    raises; a rank that died is named. A collective waits at most
    `trainer.collective_timeout_s`, so a rank that hangs becomes an error, not a hang. One per process: it owns the default process group."""

    def __init__(self, world_size: int, build: ModelBuilder, config: TrainerConfig, version: int = 0,
                 optimizer_state: Path | None = None, device_type: str = "cpu", temperature: float = 1.0,
                 compute_dtype: torch.dtype = torch.float32) -> None:
        if world_size < 2:
            raise ValueError(f"ShardedTrainer needs world_size ≥ 2, got {world_size}; use StreamingTrainer")
        if dist.is_initialized():
            raise RuntimeError("this process already has a default process group; ShardedTrainer needs its own")
        # port 0: the OS picks a free port, held by the store's socket from then on (no race)
        timeout = timedelta(seconds=config.collective_timeout_s)
        store = dist.TCPStore("127.0.0.1", 0, world_size, is_master=True, timeout=timeout, wait_for_workers=False)
        spec = _RankSpec(world_size, store.port, device_type, timeout, build, config, version, optimizer_state,
                         temperature, compute_dtype)
        context = mp.get_context("spawn")
        self._ranks: list[tuple[BaseProcess, mp_connection.Connection]] = []
        self._trainer: FSDPTrainer | None = None
        atexit.register(self.close)
        for rank in range(1, world_size):
            ours, theirs = context.Pipe()
            process = context.Process(target=_serve, args=(rank, spec, theirs), name=f"fsdp-rank-{rank}", daemon=True)
            process.start()
            theirs.close()
            self._ranks.append((process, ours))
        self._trainer = self._guarded(lambda: _start_rank(0, spec, store))
        log.info("FSDP2 trainer: %d ranks (%s), ranks 1.. are pids %s", world_size, device_type, self.worker_pids)

    @property
    def worker_pids(self) -> list[int]:
        """The processes of ranks 1, 2, ..."""
        return [process.pid for process, _ in self._ranks]

    def accumulate(self, group: Group) -> GroupResult:
        return self._call("accumulate", group)

    def step(self) -> StepResult:
        return self._call("step")

    def engine_weights(self) -> dict[str, torch.Tensor]:
        return self._call("engine_weights")

    def save(self, directory: Path, tokenizer_dir: Path) -> None:
        self._call("save", directory, tokenizer_dir)

    def close(self) -> None:
        """Stops every rank; safe to call again (it also runs at exit)."""
        atexit.unregister(self.close)
        for _, connection in self._ranks:
            with contextlib.suppress(OSError):  # that rank is gone already
                connection.send(("stop", ()))
        for process, connection in self._ranks:
            process.join(timeout=10)
            if process.is_alive():  # stuck in a collective rank 0 left, or stopped
                process.kill()
                process.join()
            connection.close()
        self._ranks, self._trainer = [], None
        if dist.is_initialized():
            dist.destroy_process_group()

    def _call(self, method: str, *args: Any) -> Any:
        trainer = self._trainer
        if trainer is None:
            raise RuntimeError("the FSDP ranks are stopped (an earlier call failed, or close() was called)")

        def run() -> Any:
            for _, connection in self._ranks:
                connection.send((method, args))
            return getattr(trainer, method)(*args)

        return self._guarded(run)

    def _guarded(self, run: Callable[[], T]) -> T:
        try:
            return run()
        except Exception as err:
            processes = [process for process, _ in self._ranks]
            # a dying peer closes its connections a moment before it can be reaped
            deadline = time.monotonic() + 2.0
            for process in processes:
                process.join(max(0.0, deadline - time.monotonic()))
            dead = [f"rank {rank} (pid {process.pid}, exit code {process.exitcode})"
                    for rank, process in enumerate(processes, start=1) if not process.is_alive()]
            self.close()
            if dead:
                raise RuntimeError(f"FSDP {', '.join(dead)} died; every rank is stopped") from err
            raise


@dataclasses.dataclass(frozen=True, slots=True)
class _RankSpec:
    world_size: int
    port: int
    device_type: str
    timeout: timedelta
    build: ModelBuilder
    config: TrainerConfig
    version: int
    optimizer_state: Path | None
    temperature: float  # the rollout's sampling temperature (StreamingTrainer)
    compute_dtype: torch.dtype  # model.dtype: the forward's and the engines' (StreamingTrainer)


def _start_rank(rank: int, spec: _RankSpec, store: dist.Store) -> FSDPTrainer:
    device = torch.device(spec.device_type, rank) if spec.device_type == "cuda" else torch.device(spec.device_type)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=store, rank=rank,
                            world_size=spec.world_size, timeout=spec.timeout)
    model, reference = spec.build(device)
    return FSDPTrainer(model, spec.config, spec.version, reference, spec.optimizer_state, spec.temperature,
                       spec.compute_dtype)


def _serve(rank: int, spec: _RankSpec, connection: mp_connection.Connection) -> None:
    """A worker rank's process: runs rank 0's calls until told to stop or rank 0 is gone. An
    exception ends the process, which rank 0 reports."""
    store = dist.TCPStore("127.0.0.1", spec.port, spec.world_size, is_master=False, timeout=spec.timeout)
    trainer = _start_rank(rank, spec, store)
    try:
        while True:
            try:
                method, args = connection.recv()
            except EOFError:  # rank 0's process ended
                return
            if method == "stop":
                return
            getattr(trainer, method)(*args)
    finally:
        dist.destroy_process_group()


def _shard(forward: nn.Module, mesh: DeviceMesh, mp_policy: MixedPrecisionPolicy) -> None:
    """One FSDP2 unit per decoder layer (Hugging Face's `_no_split_modules` of `forward.lm`), then
    the root: `forward` (a `PolicyForward`), which holds the embedding, final norm and LM head."""
    layer_classes = set(getattr(forward.lm, "_no_split_modules", None) or ())
    layers = [module for module in forward.modules() if type(module).__name__ in layer_classes]
    if not layers:
        raise ValueError(f"{type(forward.lm).__name__} names no decoder layer class in _no_split_modules")
    for layer in layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp_policy)
    fully_shard(forward, mesh=mesh, mp_policy=mp_policy)
    for module in forward.modules():
        if isinstance(module, FSDPModule):
            # FSDP2 averages gradients over ranks by default. Each rank's loss is a token sum
            # over its own rows, so the single-process gradient is the plain sum: divide by 1.
            # Forcing a SUM reduction keeps the factor out of the op (PREMUL_SUM, which gloo
            # rejects: "Cannot use ReduceOp.PREMUL_SUM with Gloo").
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)


def _idle(trajectory: Trajectory) -> Trajectory:
    """The first tokens of `trajectory` with nothing generated: a pass over it runs every layer
    forward and backward with loss and gradient exactly 0."""
    ids = trajectory.token_ids[:2]
    return dataclasses.replace(trajectory, token_ids=ids, generated_mask=[False] * len(ids), logprobs=[0.0] * len(ids))


def _trainable_names(model: nn.Module) -> list[str]:
    """Parameter names in the order `StreamingTrainer` hands the parameters to its optimizer."""
    return [name for name, parameter in model.named_parameters() if parameter.requires_grad]


def _by_position(state: dict[str, Any], model: nn.Module) -> dict[str, Any]:
    """An optimizer state keyed by parameter name -> keyed by position (`Optimizer.state_dict()`)."""
    position = {name: index for index, name in enumerate(_trainable_names(model))}
    return {"state": {position[name]: value for name, value in state["state"].items()},
            "param_groups": [{**group, "params": [position[name] for name in group["params"]]}
                             for group in state["param_groups"]]}


def _by_name(state: dict[str, Any], model: nn.Module) -> dict[str, Any]:
    """The inverse of `_by_position`."""
    names = _trainable_names(model)
    return {"state": {names[index]: value for index, value in state["state"].items()},
            "param_groups": [{**group, "params": [names[index] for index in group["params"]]}
                             for group in state["param_groups"]]}
