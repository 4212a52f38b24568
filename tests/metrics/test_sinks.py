import sys
import types

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from venusrl.metrics.sinks import MissingExtraError
from venusrl.metrics.writer import MetricsWriter, read_metrics


def test_tensorboard_gets_step_and_eval_scalars(tmp_path):
    with MetricsWriter(tmp_path, tensorboard=True) as writer:
        for step in range(3):
            writer.write({"kind": "step", "time_s": step + 1.0, "step": step, "reward_mean": 0.25 * step,
                          "groups": 4, "done": True, "node": "n0"})
        writer.write({"kind": "eval", "time_s": 4.0, "step": 2, "accuracy": 0.75, "split": "held_out"})
        writer.write({"kind": "sandbox", "time_s": 4.5, "node": "n0", "memory_bytes": 100})
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert events
    accumulator = EventAccumulator(str(tmp_path / "tensorboard"))
    accumulator.Reload()
    assert set(accumulator.Tags()["scalars"]) == {"step/time_s", "step/reward_mean", "step/groups",
                                                 "eval/time_s", "eval/accuracy"}
    assert [(e.step, e.value) for e in accumulator.Scalars("step/reward_mean")] == [(0, 0.0), (1, 0.25), (2, 0.5)]
    assert [(e.step, e.value) for e in accumulator.Scalars("eval/accuracy")] == [(2, 0.75)]
    assert len(read_metrics(tmp_path / "metrics.jsonl")) == 5


def test_missing_tensorboard_names_the_config_key_and_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(MissingExtraError, match=r"metrics\.tensorboard.*pip install venusrl\[tensorboard\]"):
        MetricsWriter(tmp_path, tensorboard=True)


def test_missing_wandb_names_the_config_key_and_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(MissingExtraError, match=r"metrics\.wandb_project.*pip install venusrl\[wandb\]"):
        MetricsWriter(tmp_path, wandb_project="venus")
    assert not (tmp_path / "metrics.jsonl").exists()


def test_wandb_gets_step_and_eval_scalars(tmp_path, monkeypatch):
    calls = []

    class FakeRun:
        def log(self, data, step):
            calls.append(("log", data, step))

        def finish(self):
            calls.append(("finish",))

    def init(**kwargs):
        calls.append(("init", kwargs))
        return FakeRun()

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    with MetricsWriter(tmp_path, wandb_project="venus", run_name="r1", config={"seed": 0}) as writer:
        writer.write({"kind": "step", "time_s": 1.0, "step": 0, "loss": 0.5})
        writer.write({"kind": "group", "time_s": 1.5, "reward_mean": 1.0})
        writer.write({"kind": "eval", "time_s": 2.0, "step": 0, "accuracy": 0.5, "split": "held_out"})
    assert calls == [
        ("init", {"project": "venus", "name": "r1", "config": {"seed": 0}, "dir": str(tmp_path)}),
        ("log", {"step/time_s": 1.0, "step/loss": 0.5}, 0),
        ("log", {"eval/time_s": 2.0, "eval/accuracy": 0.5}, 0),
        ("finish",),
    ]
