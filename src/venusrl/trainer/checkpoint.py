"""Training checkpoints: everything a killed run needs to go on as if it had not stopped.

`RUN_DIR/checkpoints/step-NNNNNN/` holds the policy as a Hugging Face directory (the
engines load it as they are), the optimizer state, the coordinator snapshot (see
`coordinator/snapshot.py`), the length predictor, and `state.json`. A checkpoint is written
under a temporary name and renamed into place, so a kill while writing leaves the previous
one as the newest complete checkpoint.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from venusrl.coordinator.snapshot import CoordinatorSnapshot
from venusrl.model.checkpoint import copy_tokenizer_files

log = logging.getLogger(__name__)

_PREFIX = "step-"


@dataclass(slots=True)
class TrainingState:
    step: int
    weight_version: int
    elapsed_s: float  # wall time of the run so far, so metrics' time_s continues on resume
    accuracy_before: float | None = None
    epoch_prompts: int = 0  # prompts per pass over the dataset (a resume checks it matches)


@dataclass(slots=True)
class Checkpoint:
    path: Path
    state: TrainingState
    snapshot: CoordinatorSnapshot

    @property
    def model_dir(self) -> Path:
        return self.path / "model"

    @property
    def predictor_path(self) -> Path | None:
        path = self.path / "predictor"
        return path if path.exists() else None

    @property
    def optimizer_path(self) -> Path:
        return self.path / "optimizer.pt"


def begin_checkpoint(run_dir: Path, step: int) -> Path:
    """A fresh temporary directory for checkpoint `step`; the policy and rollout sides
    write into it (`save_policy`, `save_rollout_state`), then `finish_checkpoint`."""
    partial = run_dir / "checkpoints" / f".{_PREFIX}{step:06d}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    return partial


def save_policy(directory: Path, model: nn.Module, tokenizer_dir: Path, optimizer: torch.optim.Optimizer) -> None:
    model.save_pretrained(directory / "model", safe_serialization=True)
    copy_tokenizer_files(tokenizer_dir, directory / "model")
    torch.save(optimizer.state_dict(), directory / "optimizer.pt")


def save_rollout_state(directory: Path, snapshot: CoordinatorSnapshot, predictor: Any = None) -> None:
    """`predictor` is anything with `save(path)`."""
    (directory / "coordinator.pkl").write_bytes(snapshot.to_bytes())
    if predictor is not None:
        predictor.save(directory / "predictor")


def finish_checkpoint(run_dir: Path, partial: Path, state: TrainingState, keep: int = 2) -> Path:
    """Write state.json and rename the checkpoint into place; keep the newest `keep`."""
    for required in ("model", "optimizer.pt", "coordinator.pkl"):
        if not (partial / required).exists():
            raise RuntimeError(f"checkpoint {partial} lacks {required}")
    (partial / "state.json").write_text(json.dumps(asdict(state), indent=2))
    final = run_dir / "checkpoints" / f"{_PREFIX}{state.step:06d}"
    shutil.rmtree(final, ignore_errors=True)
    partial.rename(final)
    for old in _checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    log.info("checkpoint %s written (weight version %d)", final, state.weight_version)
    return final


def latest_checkpoint(run_dir: Path) -> Checkpoint | None:
    """The newest complete checkpoint of a run, or None."""
    checkpoints = _checkpoints(run_dir)
    if not checkpoints:
        return None
    path = checkpoints[-1]
    try:
        state = TrainingState(**json.loads((path / "state.json").read_text()))
        snapshot = CoordinatorSnapshot.from_bytes((path / "coordinator.pkl").read_bytes())
    except (OSError, ValueError, TypeError) as err:
        raise ValueError(f"checkpoint {path} is unreadable: {err}") from None
    return Checkpoint(path, state, snapshot)


def _checkpoints(run_dir: Path) -> list[Path]:
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(_PREFIX))
