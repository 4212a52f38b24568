"""The trained ledger survives a kill at any point: a torn appended line is not a step, and
a truncation is all or nothing."""

from __future__ import annotations

import os

import pytest

from venusrl.runtime.ledger import TrainedLedger


def test_a_truncation_that_dies_midway_leaves_the_old_ledger(tmp_path, monkeypatch):
    ledger = TrainedLedger(tmp_path / "trained.jsonl")
    for step in (1, 2, 3):
        ledger.record(step, step, [f"p{step}"])
    before = ledger.path.read_bytes()

    def killed(fd):  # the process dies after writing the new content, before it is durable
        raise OSError("killed")

    monkeypatch.setattr(os, "fsync", killed)
    with pytest.raises(OSError):
        ledger.truncate_after(1)
    assert ledger.path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["trained.jsonl"]  # no temporary left behind
    monkeypatch.undo()
    ledger.truncate_after(1)
    assert [e["step"] for e in ledger.entries()] == [1]


def test_a_torn_last_line_is_not_a_step(tmp_path):
    ledger = TrainedLedger(tmp_path / "trained.jsonl")
    ledger.record(1, 1, ["a"])
    with ledger.path.open("a") as f:
        f.write('{"step": 2, "weight_ver')
    assert [e["step"] for e in ledger.entries()] == [1]
