"""The scheduler and predictor benchmarks run end to end and report coherent figures."""

import json

import pytest
from typer.testing import CliRunner

from venusrl.bench.scheduler import batch_for_window, run
from venusrl.cli import app


def test_batch_for_window_fills_the_window_exactly():
    assert batch_for_window(1250, 1.5) == 833
    for groups in (1, 2, 3, 10, 99, 1250):
        b = batch_for_window(groups, 1.5)
        assert -(-3 * b // 2) <= groups < -(-3 * (b + 1) // 2)


def test_scheduler_bench_drives_every_policy_through_weight_steps():
    result = run(groups=12, group_size=3, events=4000, policies=["fcfs", "action_level", "length_prediction", "oracle"], seed=1)
    for name, r in result["policies"].items():
        assert r["groups_in_flight"] == 12 and r["batch_groups"] == 8
        assert r["initial_trajectories"] == 36
        assert r["weight_versions"] >= 1, name
        assert r["events"] == 4000 and r["events_per_s"] > 0
        assert 0 < r["event_p50_ms"] <= r["event_p99_ms"] <= r["event_max_ms"]
        assert set(r["per_event"]) >= {"turn_start", "turn_end", "prediction", "tool_result", "done", "weight_version"}
    assert result["policies"]["action_level"]["policy_versions"] == 0
    assert result["policies"]["length_prediction"]["policy_versions"] > 1


def test_predictor_bench_on_a_jsonl(tmp_path):
    runner = CliRunner()
    data = tmp_path / "ex.jsonl"
    assert runner.invoke(app, ["predictor", "synth", str(data), "--prompts", "30", "--group-size", "3"]).exit_code == 0
    out = tmp_path / "bench.json"
    result = runner.invoke(app, ["bench", "predictor", "--data", str(data), "--predictors", "group_history,learned",
                                 "--json", str(out), "--quick"])
    assert result.exit_code == 0, result.output
    figures = json.loads(out.read_text())
    assert figures["headline_split"] == "held_out_prompts"
    for name in ("group_history", "learned"):
        p = figures["predictors"][name]
        assert -1 <= p["spearman"] <= 1 and p["mae"] >= 0 and p["mape"] >= 0
        assert 0 < p["latency_p50_ms"] <= p["latency_p99_ms"]
    assert figures["predictors"]["learned"]["spearman"] > figures["predictors"]["group_history"]["spearman"]
    assert "met" in figures["target"]


def test_bench_rejects_unknown_names():
    runner = CliRunner()
    assert runner.invoke(app, ["bench", "predictor", "--predictors", "magic"]).exit_code == 2
    assert runner.invoke(app, ["bench", "scheduler", "--policies", "lifo"]).exit_code == 2


@pytest.mark.slow
def test_predictor_bench_quick_synthetic_run(tmp_path):
    out = tmp_path / "p.json"
    result = CliRunner().invoke(app, ["bench", "predictor", "--quick", "--json", str(out)])
    assert result.exit_code == 0, result.output
    figures = json.loads(out.read_text())
    assert set(figures["predictors"]) == {"group_history", "learned", "lm"}
    assert figures["predictors"]["learned"]["spearman"] > figures["predictors"]["group_history"]["spearman"]
