"""The training loop of `venusrl train`, the same on every runtime. It talks to a rollout
side and a trainer side through their async methods (in-process objects on the local
runtime, Ray actors on the Ray runtime):

    each ready group  -> trainer.accumulate (its gradient, as it arrives)
    B groups in       -> trainer.step -> weights to the engines -> coordinator retires them
    every N steps     -> checkpoint (weights, optimizer, coordinator snapshot, predictor)
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

from venusrl.config import Config
from venusrl.durable import write_atomic
from venusrl.metrics.writer import MetricsWriter
from venusrl.runtime.ledger import LEDGER_FILE, TrainedLedger
from venusrl.runtime.progress import TrainingProgress
from venusrl.trainer.checkpoint import (
    Checkpoint,
    TrainingState,
    begin_checkpoint,
    finish_checkpoint,
)
from venusrl.types import Group, Prompt

log = logging.getLogger(__name__)


class TrainingDriver:
    def __init__(self, config: Config, run_dir: Path, rollout: Any, trainer: Any, train_prompts: int,
                 eval_prompts: list[Prompt], checkpoint: Checkpoint | None, show_progress: bool = True) -> None:
        self.config, self.run_dir, self.rollout, self.trainer = config, run_dir, rollout, trainer
        self.train_prompts, self.eval_prompts = train_prompts, eval_prompts
        self.show_progress = show_progress
        self.ledger = TrainedLedger(run_dir / LEDGER_FILE)
        self.started = time.monotonic()
        state = checkpoint.state if checkpoint is not None else None
        self.step = state.step if state else 0
        self.version = state.weight_version if state else 0
        self.elapsed_before = state.elapsed_s if state else 0.0
        self.accuracy_before = state.accuracy_before if state else None
        # steps past the checkpoint (all of them when a run killed before its first checkpoint
        # starts over) died with the process; a torn last line goes too
        if self.ledger.path.exists():
            self.ledger.truncate_after(self.step)
        self.resumed_from = checkpoint.path.name if checkpoint is not None else None
        if checkpoint is not None:
            log.info("resuming from checkpoint %s: step %d, weight version %d", checkpoint.path.name, self.step,
                     self.version)

    def now(self) -> float:
        return self.elapsed_before + time.monotonic() - self.started

    async def run(self) -> dict:
        config = self.config
        self.metrics = MetricsWriter(self.run_dir, config.metrics.tensorboard, config.metrics.wandb_project,
                                     config.run.name, config.model_dump(mode="json"))
        total_steps = config.trainer.steps or math.ceil(self.train_prompts * config.trainer.epochs
                                                         / config.coordinator.batch_groups)
        try:
            with TrainingProgress(total_steps, self.step, enabled=self.show_progress) as self.progress:
                if self.accuracy_before is None:
                    self.accuracy_before = await self._evaluate("before")
                await self.rollout.start()
                await self._train(total_steps)
                accuracy_after = await self._evaluate("after")
            summary = {"accuracy_before": self.accuracy_before, "accuracy_after": accuracy_after,
                       "wall_s": round(self.now(), 2), "steps": self.step, "weight_version": self.version,
                       "scheduler": config.scheduler.policy, "resumed_from": self.resumed_from,
                       **await self.rollout.summary(), **await self.rollout.stats()}
            self.metrics.write({"kind": "summary", "time_s": self.now(), **summary})
        finally:
            self.metrics.close()
        write_atomic(self.run_dir / "summary.json", json.dumps(summary, indent=2))
        log.info("run finished: %s", summary)
        return summary

    async def _train(self, total_steps: int) -> None:
        batch: list[Group] = []
        while self.step < total_steps:
            group = await self.rollout.next_group()
            if group is not None:
                result = await self.trainer.accumulate(group)
                batch.append(group)
                self._record_group(group, result.tokens)
            if len(batch) == self.config.coordinator.batch_groups or (group is None and batch):
                await self._step(batch)
                batch = []
            elif group is None:
                return  # the dataset is used up and every group is trained

    async def _step(self, batch: list[Group]) -> None:
        result = await self.trainer.step()
        self.step, self.version = self.step + 1, result.version
        pushed = time.perf_counter()
        push_seconds = await self.rollout.push_weights(await self.trainer.weights(), result.version)
        push_s = time.perf_counter() - pushed
        self.ledger.record(self.step, result.version, [g.prompt.id for g in batch])
        record = {"kind": "step", "time_s": self.now(), "step": self.step, "weight_version": result.version,
                  "reward_mean": result.reward_mean, "reward_std": result.reward_std, "loss": result.loss,
                  "policy_loss": result.loss, "grad_norm": result.grad_norm,
                  "learning_rate": self.config.trainer.learning_rate, "groups": result.groups,
                  "trajectories": result.trajectories, "tokens_generated": result.tokens,
                  "tokens_per_s": result.tokens / result.seconds if result.seconds > 0 else 0.0,
                  "step_time_s": result.seconds, "skipped_groups": result.skipped_groups,
                  # the trainer's weights to every engine (and per transport, weights/pusher.py)
                  "weight_push_s": round(push_s, 4),
                  **{f"weight_push_{transport}_s": s for transport, s in push_seconds.items()},
                  **result.stats, **await self.rollout.stats()}
        if self.step % self.config.metrics.log_every_steps == 0:
            self.metrics.write(record)
        for sample in await self.rollout.sandbox_samples():
            self.metrics.write({"kind": "sandbox", "time_s": self.now(), **sample})
        self.progress.stepped(self.step, record)
        if self.step % self.config.trainer.checkpoint_every_steps == 0:
            await self._checkpoint()
        if self.config.trainer.eval_every_steps and self.step % self.config.trainer.eval_every_steps == 0:
            await self._evaluate(f"at step {self.step}")

    async def _checkpoint(self) -> None:
        directory = begin_checkpoint(self.run_dir, self.step)
        await self.rollout.save_state(directory)  # first: the coordinator must not move on meanwhile
        await self.trainer.save(directory)
        state = TrainingState(self.step, self.version, self.now(), self.accuracy_before, self.train_prompts)
        finish_checkpoint(self.run_dir, directory, state, self.config.trainer.keep_checkpoints)

    async def _evaluate(self, label: str) -> float | None:
        if not self.eval_prompts:
            return None
        self.progress.note(f"evaluating ({label}) on {len(self.eval_prompts)} held-out prompts")
        accuracy = await self.rollout.evaluate(self.eval_prompts)
        self.metrics.write({"kind": "eval", "time_s": self.now(), "step": self.step, "accuracy": accuracy,
                            "split": "held_out", "label": label})
        log.info("held-out accuracy %s: %.3f", label, accuracy)
        return accuracy

    def _record_group(self, group: Group, tokens: int) -> None:
        spans = [max(t.weight_version for t in traj.turns) - min(t.weight_version for t in traj.turns)
                 if traj.turns else 0 for traj in group.trajectories]
        reward_mean = sum(traj.reward or 0.0 for traj in group.trajectories) / len(group.trajectories)
        self.metrics.write({"kind": "group", "time_s": self.now(), "group_id": group.id, "prompt_id": group.prompt.id,
                            "reward_mean": reward_mean, "version_spans": spans, "tokens_generated": tokens,
                            "trajectory_tokens": [traj.generated_tokens for traj in group.trajectories]})
        self.progress.group_trained(reward_mean)
