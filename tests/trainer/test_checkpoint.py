"""A checkpoint's manifest vouches for every file: each way a file can be wrong is refused
with the file's name, and a torn or foreign manifest too."""

from __future__ import annotations

import json

import pytest

from venusrl.trainer.checkpoint import CheckpointError, verify_checkpoint, write_manifest

FILES = {"model/config.json": b"{}", "model/model.safetensors": b"\0" * 64, "optimizer.pt": b"opt" * 10,
         "coordinator.json": b"{}", "state.json": b"{}", "predictor/model.json": b"[]"}


@pytest.fixture
def checkpoint(tmp_path):
    for name, data in FILES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    write_manifest(tmp_path)
    verify_checkpoint(tmp_path)  # intact
    return tmp_path


@pytest.mark.parametrize(("damage", "message"), [
    (lambda p: (p / "optimizer.pt").write_bytes(b"opt"), "optimizer.pt is 3 bytes, the manifest says 30"),
    (lambda p: (p / "model/model.safetensors").write_bytes(b"\1" * 64), "model/model.safetensors does not match"),
    (lambda p: (p / "predictor/model.json").unlink(), "predictor/model.json is missing"),
    (lambda p: (p / "manifest.json").unlink(), "no manifest.json"),
    (lambda p: (p / "manifest.json").write_text('{"format": "venusrl.checkpoint", "fi'), "manifest.json is unreadable"),
    (lambda p: (p / "manifest.json").write_text('{"format": "other", "files": {}}'), "not a venusrl checkpoint"),
])
def test_each_damage_is_named(checkpoint, damage, message):
    damage(checkpoint)
    with pytest.raises(CheckpointError, match=message):
        verify_checkpoint(checkpoint)


def test_a_manifest_without_what_a_resume_needs_is_refused(checkpoint):
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    del manifest["files"]["coordinator.json"]
    (checkpoint / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="lists no coordinator.json"):
        verify_checkpoint(checkpoint)
