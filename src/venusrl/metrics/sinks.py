"""Optional scalar sinks behind `MetricsWriter`: TensorBoard and Weights & Biases."""

from __future__ import annotations

import numbers
from pathlib import Path
from typing import Any


class MissingExtraError(ImportError):
    """A configured sink whose package is not installed."""


def scalar_fields(record: dict[str, Any]) -> dict[str, float]:
    """The record's numeric scalars, without `kind`, `step` (the x axis) and booleans."""
    return {
        key: float(value)
        for key, value in record.items()
        if key not in ("kind", "step") and isinstance(value, numbers.Real) and not isinstance(value, bool)
    }


class TensorBoardSink:
    def __init__(self, log_dir: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:
            raise MissingExtraError(
                "metrics.tensorboard is true but TensorBoard is not installed: "
                "pip install venusrl[tensorboard] (or set metrics.tensorboard=false)"
            ) from err
        self._writer = SummaryWriter(log_dir=str(log_dir))

    def log(self, kind: str, step: int, scalars: dict[str, float]) -> None:
        for field, value in scalars.items():
            self._writer.add_scalar(f"{kind}/{field}", value, global_step=step)

    def close(self) -> None:
        self._writer.close()


class WandbSink:
    def __init__(self, project: str, run_name: str | None, config: dict | None, run_dir: Path) -> None:
        try:
            import wandb
        except ImportError as err:
            raise MissingExtraError(
                f"metrics.wandb_project is set ({project!r}) but wandb is not installed: "
                "pip install venusrl[wandb] (or unset metrics.wandb_project)"
            ) from err
        self._run = wandb.init(project=project, name=run_name, config=config, dir=str(run_dir))

    def log(self, kind: str, step: int, scalars: dict[str, float]) -> None:
        self._run.log({f"{kind}/{field}": value for field, value in scalars.items()}, step=step)

    def close(self) -> None:
        self._run.finish()
