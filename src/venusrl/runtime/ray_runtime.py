"""The Ray runtime (`run.runtime: ray`): the local runtime's training loop with its parts
in Ray actors.

    this process   TrainingDriver, talking to the actors through `ActorProxy`
    RolloutActor   coordinator, predictor, engines, rollout worker, sandbox controller
    EngineActor    with `engine.placement: process`, one per engine (one GPU each where there
                   are GPUs, spread over the nodes); the rollout actor reaches them over
                   sockets (`RemoteEngine`), and prefix KV moves engine to engine directly
    TrainerActor   policy model and streaming trainer
    NodeAgentActor one per sandbox node agent, spread over the nodes (ray_sandbox.py)

Nodes advertising a role (ray_nodes.py) take only that role's actors: `venusrl_engine`
the engine actors, `venusrl_sandbox` the node agents, `venusrl_trainer` the rollout and
trainer actors.

New weights go from the trainer actor to the rollout actor through the object store,
never through this process; the rollout actor pushes them to each engine actor by the
transport `engine.weight_sync` picks (weights/placement.py): shared memory to one on its
node, a broadcast over its weight group (gloo, rendezvous at its node's IP) to one on
another node, which joins the group at start-up. The run joins the cluster at `run.ray_address` (or
RAY_ADDRESS), else starts Ray on this machine and stops it at the end.

On a multi-node cluster the run directory and the model directory must be on a shared
filesystem, at the same path on every node: the rollout actor (coordinator snapshot,
predictor) and the trainer actor (model, optimizer) write their halves of each checkpoint
into one directory, and both append their log lines to RUN_DIR/train.log. venusrl must
be installed on every node.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayActorError, RayError

from venusrl.config import Config, ConfigError
from venusrl.engine.placement import engine_spec
from venusrl.runtime.driver import TrainingDriver
from venusrl.runtime.engine_failover import AllEnginesLost
from venusrl.runtime.interrupted import RunInterrupted
from venusrl.runtime.local import prepare
from venusrl.runtime.ray_actors import RolloutActor, TrainerActor
from venusrl.runtime.ray_engines import open_engine_actors, start_engine_actors
from venusrl.runtime.ray_nodes import check_engine_room, role_options
from venusrl.runtime.ray_support import ActorProxy
from venusrl.trainer.checkpoint import Checkpoint
from venusrl.types import Prompt

log = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 120.0
# next_group waits on the rollout actor's loop while the driver calls push_weights, stats, save_state
ROLLOUT_CONCURRENCY = 8


class TrainerProxy(ActorProxy):
    async def weights(self) -> ray.ObjectRef:
        """A reference only: the rollout actor's push_weights resolves it from the object store."""
        return self.actor.weights.remote()


def train(config: Config, run_dir: Path, progress: bool = True) -> dict:
    """Train, or resume when `run_dir` holds a checkpoint; returns the summary that is also
    written to RUN_DIR/summary.json."""
    run_dir = run_dir.resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    train_prompts, eval_prompts, checkpoint = prepare(config, run_dir)  # bad data fails before Ray starts
    started = _connect(config.run.ray_address)
    try:
        return asyncio.run(_train(_with_absolute_paths(config), run_dir, progress, train_prompts, eval_prompts, checkpoint))
    except RayActorError as err:  # its node (or process) died: nothing in this run can stand in for it
        log.error("run interrupted: %s", err)
        raise RunInterrupted(f"the {_actor_role(err)} actor was lost ({type(err).__name__})", run_dir) from err
    except AllEnginesLost as err:
        raise RunInterrupted(str(err), run_dir) from err
    finally:
        if started:
            ray.shutdown()


def _actor_role(err: RayActorError) -> str:
    """Which of the run's actors `err` is about, from the class Ray names in it."""
    text = str(err)
    return next((role for role, name in (("rollout", "RolloutActor"), ("trainer", "TrainerActor"))
                 if name in text), "rollout or trainer")


def _connect(address: str | None) -> bool:
    """Join or start Ray unless this process already is connected; True when this call did."""
    if ray.is_initialized():
        return False
    # Actor output stays in Ray's log files: their log lines go to train.log, errors come back as exceptions.
    if address is None:
        ray.init(include_dashboard=False, log_to_driver=False)
    else:
        ray.init(address=address, log_to_driver=False)
    log.info("ray: connected to %s (%s)", address or "a new local instance", ray.cluster_resources())
    return True


async def _train(config: Config, run_dir: Path, progress: bool, train_prompts: list[Prompt],
                 eval_prompts: list[Prompt], checkpoint: Checkpoint | None) -> dict:
    async with open_actors(config, run_dir, train_prompts, checkpoint) as (rollout, trainer, _):
        driver = TrainingDriver(config, run_dir, rollout, trainer, len(train_prompts), eval_prompts, checkpoint, progress)
        return await driver.run()


@contextlib.asynccontextmanager
async def open_actors(config: Config, run_dir: Path, train_prompts: list[Prompt],
                      checkpoint: Checkpoint | None,
                      ) -> AsyncIterator[tuple[ActorProxy, TrainerProxy, list[dict[str, Any]]]]:
    """The run's actors, opened, and the engine actors' handshakes (with `engine.placement:
    process` the engine actors open first, and those that take pushes by broadcast join the
    rollout actor's weight group); closed on the way out."""
    model_dir = checkpoint.model_dir if checkpoint else Path(config.model.path)
    version = checkpoint.state.weight_version if checkpoint else 0
    skip = checkpoint.snapshot.prompts_consumed if checkpoint else 0
    cluster_gpus = ray.cluster_resources().get("GPU", 0)
    rollout_gpus, trainer_gpus = actor_gpus(config, cluster_gpus)
    engine_actors, handshakes = [], []
    engine_gpus = 0.0
    if config.engine.placement == "process":
        check_engine_room(config.scheduler.engines)
        engine_gpus = engine_actor_gpus(config, cluster_gpus)
        engine_actors = start_engine_actors(config.scheduler.engines, engine_gpus)
        rollout_gpus = 0  # the engines hold the rollout side's GPUs
    rollout_actor = ray.remote(RolloutActor).options(num_gpus=rollout_gpus, max_concurrency=ROLLOUT_CONCURRENCY,
                                                     **role_options("trainer")).remote()
    trainer_actor = ray.remote(TrainerActor).options(num_gpus=trainer_gpus, **role_options("trainer")).remote()
    rollout, trainer = ActorProxy(rollout_actor), TrainerProxy(trainer_actor)
    try:
        if engine_actors:
            spec = engine_spec(model_dir, config.engine, config.model, version)
            handshakes = await open_engine_actors(engine_actors, spec, run_dir, config.run.log_level)
            handshakes = await join_weight_group(rollout, engine_actors, handshakes, config)
        opened = await asyncio.gather(
            rollout.open(config, run_dir, model_dir, train_prompts, skip, version,
                         checkpoint.snapshot if checkpoint else None, checkpoint.predictor_path if checkpoint else None,
                         handshakes or None, engine_gpus),
            trainer.open(config, run_dir, model_dir, version, checkpoint.optimizer_path if checkpoint else None),
            return_exceptions=True)  # both finish opening before either is closed
        for result in opened:
            if isinstance(result, BaseException):
                raise result
        log.info("ray actors: %s", {"driver": {"pid": os.getpid()}, "rollout": opened[0], "trainer": opened[1],
                                    "engines": [{k: h[k] for k in ("pid", "host", "address", "weight_rank")}
                                                for h in handshakes]})
        yield rollout, trainer, handshakes
    finally:
        await _shutdown(rollout_actor, trainer_actor, engine_actors)


async def join_weight_group(rollout: ActorProxy, actors: list[Any], handshakes: list[dict[str, Any]],
                            config: Config) -> list[dict[str, Any]]:
    """The engine actors that are to take pushes by broadcast join the rollout actor's weight
    group (it decides which: `RolloutActor.open_weight_group`); the handshakes, those of the
    members now naming their ranks."""
    members = await rollout.open_weight_group(config, handshakes)
    joined = await asyncio.gather(*(ActorProxy(actors[index]).join_weight_group(spec)
                                    for index, spec in members.items()))
    rejoined = dict(zip(members, joined, strict=True))
    if members:
        spec = next(iter(members.values()))
        log.info("weight group: engine(s) %s joined the rollout actor's, rendezvous at %s:%d", sorted(members),
                 spec.host, spec.port)
    return [rejoined.get(index, handshake) for index, handshake in enumerate(handshakes)]


async def _shutdown(rollout_actor: Any, trainer_actor: Any, engine_actors: list[Any]) -> None:
    """Close the rollout side (engines, predictor, node agents), then end the actors."""
    try:
        await asyncio.wait_for(rollout_actor.close.remote(), CLOSE_TIMEOUT_S)
        # each on its own: an engine actor lost with its node must not keep the others open
        closed = await asyncio.wait_for(asyncio.gather(*(actor.close.remote() for actor in engine_actors),
                                                       return_exceptions=True), CLOSE_TIMEOUT_S)
        for index, result in enumerate(closed):
            if isinstance(result, BaseException):
                log.info("engine actor %d did not close (%s: lost with its node or process)", index,
                         type(result).__name__)
    except (RayError, asyncio.TimeoutError) as err:
        log.warning("rollout actor or an engine actor did not close cleanly: %s", err)
    finally:
        for actor in (rollout_actor, trainer_actor, *engine_actors):
            ray.kill(actor)


def _with_absolute_paths(config: Config) -> Config:
    """Actors do not run in this process's working directory."""
    model = config.model.model_copy(update={"path": str(Path(config.model.path).resolve())})
    update: dict[str, Any] = {"model": model}
    if config.predictor.path is not None:
        update["predictor"] = config.predictor.model_copy(update={"path": str(Path(config.predictor.path).resolve())})
    return config.model_copy(update=update)


def actor_gpus(config: Config, cluster_gpus: float) -> tuple[float, float]:
    """GPUs of the rollout and the trainer actor. The trainer holds one per FSDP rank (its rank
    processes use the GPUs Ray gives it, as cuda:0..world_size-1); where the cluster has fewer
    than one more than that, a single-rank trainer shares one GPU with the rollout."""
    if not config.model.device.startswith("cuda"):
        return 0, 0
    ranks = config.trainer.world_size
    if cluster_gpus >= ranks + 1:
        return 1, ranks
    if ranks > 1:
        raise ConfigError(f"trainer.world_size={ranks} needs {ranks + 1} GPUs in the Ray cluster (one per rank and one "
                          f"for rollout), it has {cluster_gpus:g}")
    return 0.5, 0.5


def engine_actor_gpus(config: Config, cluster_gpus: float) -> float:
    """GPUs of each engine actor (`engine.placement: process`): one where the cluster has one
    per engine besides the trainer's; half of the one GPU a one-engine run shares with a
    single-rank trainer (as the rollout actor does)."""
    rollout_gpus, trainer_gpus = actor_gpus(config, cluster_gpus)
    if not rollout_gpus:
        return 0
    engines = config.scheduler.engines
    each = 1 if cluster_gpus >= engines + trainer_gpus else rollout_gpus
    if engines * each + trainer_gpus > cluster_gpus:
        raise ConfigError(f"scheduler.engines={engines} with engine.placement=process needs {engines} GPUs for the "
                          f"engines and {trainer_gpus:g} for the trainer; the Ray cluster has {cluster_gpus:g}")
    return each
