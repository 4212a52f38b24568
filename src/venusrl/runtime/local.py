"""The embedded runtime: the whole run in this process (plus the sandbox node agents).

Rollout (coordinator, worker, engines on their own threads) runs on the asyncio loop; the
trainer's forward/backward passes run in a worker thread, so trajectories keep generating
while groups are trained."""

from __future__ import annotations

import asyncio
from pathlib import Path

from venusrl.config import Config
from venusrl.runtime.data import check_steps_fit_data, load_prompts, prompt_stream
from venusrl.runtime.driver import TrainingDriver
from venusrl.runtime.rollout_service import RolloutService
from venusrl.runtime.trainer_service import TrainerService
from venusrl.trainer.checkpoint import Checkpoint, latest_checkpoint


def train(config: Config, run_dir: Path, progress: bool = True) -> dict:
    """Train, or resume when `run_dir` holds a checkpoint; returns the summary that is also
    written to RUN_DIR/summary.json."""
    return asyncio.run(_train(config, run_dir, progress))


async def _train(config: Config, run_dir: Path, progress: bool) -> dict:
    driver = await build(config, run_dir, progress)
    try:
        return await driver.run()
    finally:
        await driver.rollout.close()


async def build(config: Config, run_dir: Path, progress: bool = True) -> TrainingDriver:
    """The run's services in this process, wired to a driver; the caller closes
    `driver.rollout`."""
    train_prompts, eval_prompts, checkpoint = prepare(config, run_dir)
    model_dir = checkpoint.model_dir if checkpoint else Path(config.model.path)
    version = checkpoint.state.weight_version if checkpoint else 0
    skip = checkpoint.snapshot.prompts_consumed if checkpoint else 0
    rollout = RolloutService(config, model_dir, prompt_stream(train_prompts, config.trainer.epochs, skip), version,
                             checkpoint.snapshot if checkpoint else None, checkpoint.predictor_path if checkpoint else None)
    try:
        trainer = TrainerService(config, model_dir, version, checkpoint.optimizer_path if checkpoint else None)
    except BaseException:
        await rollout.close()
        raise
    return TrainingDriver(config, run_dir, rollout, trainer, len(train_prompts), eval_prompts, checkpoint, progress)


def prepare(config: Config, run_dir: Path) -> tuple[list, list, Checkpoint | None]:
    """Prompts (checked against the environment) and the checkpoint to resume from, if any."""
    if config.model.path is None:
        raise ValueError("model.path: set it to a Hugging Face model directory")
    train_prompts = load_prompts(config.data, config.rollout.environment, "train")
    check_steps_fit_data(config.trainer.steps, config.coordinator.batch_groups, len(train_prompts),
                         config.trainer.epochs)
    eval_prompts = load_prompts(config.data, config.rollout.environment, "eval")
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is not None and checkpoint.state.epoch_prompts != len(train_prompts):
        raise ValueError(f"{checkpoint.path}: the run had {checkpoint.state.epoch_prompts} training prompts, "
                         f"the data now gives {len(train_prompts)}")
    return train_prompts, eval_prompts, checkpoint
