"""Training checkpoints: everything a killed run needs to go on as if it had not stopped.

`RUN_DIR/checkpoints/step-NNNNNN/` holds the policy as a Hugging Face directory (the
engines load it as they are), the optimizer state, the coordinator snapshot (JSON, see
`coordinator/snapshot.py`), the length predictor, `state.json`, and `manifest.json`: the
size and SHA-256 of every other file, written last. A checkpoint is written under a
temporary name, every file fsynced, and renamed into place, so a kill while writing leaves
the previous one as the newest complete checkpoint.

On resume each checkpoint is verified against its manifest, newest first; one that fails
(a truncated or flipped file, a missing manifest) is skipped and the next older one is
used, with one log line naming what was skipped and why. With no intact one left the
resume stops with that list rather than silently starting over.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from venusrl.coordinator.snapshot import CoordinatorSnapshot
from venusrl.durable import fsync_path, rename_durable, write_atomic
from venusrl.model.checkpoint import copy_tokenizer_files

log = logging.getLogger(__name__)

_PREFIX = "step-"
MANIFEST = "manifest.json"
SNAPSHOT = "coordinator.json"
STATE = "state.json"
OPTIMIZER = "optimizer.pt"
_FORMAT = "venusrl.checkpoint"
# what a checkpoint cannot resume without; the manifest must list each
_REQUIRED = ("model/config.json", OPTIMIZER, SNAPSHOT, STATE)


class CheckpointError(ValueError):
    """A checkpoint is incomplete or corrupt (the message says which file and how)."""


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
        return self.path / OPTIMIZER


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
    torch.save(optimizer.state_dict(), directory / OPTIMIZER)


def save_rollout_state(directory: Path, snapshot: CoordinatorSnapshot, predictor: Any = None) -> None:
    """`predictor` is anything with `save(path)`."""
    (directory / SNAPSHOT).write_bytes(snapshot.to_bytes())
    if predictor is not None:
        predictor.save(directory / "predictor")


def finish_checkpoint(run_dir: Path, partial: Path, state: TrainingState, keep: int = 2) -> Path:
    """Write state.json and the manifest, rename the checkpoint into place; keep the newest
    `keep`."""
    for required in ("model", OPTIMIZER, SNAPSHOT):
        if not (partial / required).exists():
            raise RuntimeError(f"checkpoint {partial} lacks {required}")
    (partial / STATE).write_text(json.dumps(asdict(state), indent=2))
    write_manifest(partial)
    final = run_dir / "checkpoints" / f"{_PREFIX}{state.step:06d}"
    shutil.rmtree(final, ignore_errors=True)
    rename_durable(partial, final)
    for old in _checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    log.info("checkpoint %s written (weight version %d)", final, state.weight_version)
    return final


def write_manifest(directory: Path) -> None:
    """Size and SHA-256 of every file under `directory`, each fsynced first, written last
    (atomically): a manifest vouches only for bytes already on disk."""
    files = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST):
        files[path.relative_to(directory).as_posix()] = {"size": path.stat().st_size, "sha256": _sha256(path)}
        fsync_path(path)
    for sub in (p for p in directory.rglob("*") if p.is_dir()):
        fsync_path(sub)
    write_atomic(directory / MANIFEST, json.dumps({"format": _FORMAT, "files": files}, indent=1))


def verify_checkpoint(path: Path) -> None:
    """Raise `CheckpointError` unless every file the manifest lists is there with its size
    and checksum, and the manifest lists what a resume needs."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        files = manifest["files"] if manifest.get("format") == _FORMAT else None
    except FileNotFoundError:
        raise CheckpointError(f"no {MANIFEST} (torn, or written by a venusrl without manifests)") from None
    except (OSError, ValueError, AttributeError, KeyError, TypeError) as err:
        raise CheckpointError(f"{MANIFEST} is unreadable ({err})") from None
    if not isinstance(files, dict):
        raise CheckpointError(f"{MANIFEST} is not a venusrl checkpoint manifest")
    missing = [name for name in _REQUIRED if name not in files]
    if not any(name.startswith("model/") and name.endswith(".safetensors") for name in files):
        missing.append("model/*.safetensors")
    if missing:
        raise CheckpointError(f"{MANIFEST} lists no {', '.join(missing)}")
    for name, entry in files.items():
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"{name} is missing")
        size = file.stat().st_size
        if size != entry.get("size"):
            raise CheckpointError(f"{name} is {size} bytes, the manifest says {entry.get('size')}")
        if _sha256(file) != entry.get("sha256"):
            raise CheckpointError(f"{name} does not match its SHA-256 in the manifest")


def load_checkpoint(path: Path) -> Checkpoint:
    """A verified checkpoint, or `CheckpointError` saying what is wrong with it."""
    verify_checkpoint(path)
    try:
        state = TrainingState(**json.loads((path / STATE).read_text()))
        snapshot = CoordinatorSnapshot.from_bytes((path / SNAPSHOT).read_bytes())
    except (OSError, ValueError, TypeError) as err:
        raise CheckpointError(f"unreadable: {err}") from None
    log.info("checkpoint %s verified against its manifest", path)
    return Checkpoint(path, state, snapshot)


def latest_checkpoint(run_dir: Path) -> Checkpoint | None:
    """The newest intact checkpoint of a run, or None when the run has none. Corrupt newer
    ones are skipped (one log line says which and why); when every one is corrupt, raises
    `CheckpointError` listing them, since starting over would train prompts twice."""
    skipped = []
    for path in reversed(_checkpoints(run_dir)):
        try:
            checkpoint = load_checkpoint(path)
        except CheckpointError as err:
            skipped.append(f"{path.name} ({err})")
            continue
        if skipped:
            log.warning("resuming from %s; skipped %s", path.name, "; ".join(skipped))
        return checkpoint
    if skipped:
        raise CheckpointError(f"no intact checkpoint in {run_dir / 'checkpoints'}: {'; '.join(skipped)}; "
                              "move the run directory aside to start over")
    return None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _checkpoints(run_dir: Path) -> list[Path]:
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(_PREFIX))
