"""A local training run with its engines in their own processes gets each step's weights by
the transport `engine.weight_sync` picks (auto: shared memory on this host; broadcast: a gloo
group set up at start-up), records each push's seconds in the step metrics, and evaluates
on the trained weights exactly as a fresh engine over the saved checkpoint does."""

import asyncio

import pytest
from tests.runtime.test_train_local import held_out_accuracy, run_config

from venusrl.metrics.writer import read_metrics
from venusrl.runtime.local import train


@pytest.mark.parametrize(("transport", "field"), [
    ("auto", "weight_push_shared_memory_s"),
    pytest.param("broadcast", "weight_push_broadcast_s", marks=pytest.mark.slow),  # 45 s; the transport itself
])                                                     # is tested in test_weight_push.py
def test_a_run_with_engine_processes_pushes_by_its_transport(tiny_model_dir, tmp_path, transport, field):
    config = run_config(tiny_model_dir, trainer={"steps": 2, "keep_checkpoints": 1},
                        engine={"placement": "process", "weight_sync": {"transport": transport}},
                        scheduler={"engines": 2, "slots_per_engine": 4})
    summary = train(config, tmp_path, progress=False)
    assert summary["steps"] == 2 and summary["weight_version"] == 2
    steps = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["kind"] == "step"]
    assert [r["weight_version"] for r in steps] == [1, 2]
    assert all(r[field] > 0 and r["weight_push_s"] >= r[field] for r in steps)
    trained = tmp_path / "checkpoints" / "step-000002" / "model"
    assert summary["accuracy_after"] == asyncio.run(held_out_accuracy(config, trained))
