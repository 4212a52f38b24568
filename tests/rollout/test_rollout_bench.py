import asyncio
import json
import statistics
from dataclasses import replace

import pytest

from venusrl.bench.rollout import (
    MODES,
    QUICK,
    RolloutCase,
    Round,
    _round,
    _speedups,
    _summary,
    run,
    tasks,
)
from venusrl.engine.step_log import StepSample
from venusrl.model.tiny import make_tiny_model
from venusrl.sim.cost_model import CostModel
from venusrl.trace import read_trace

SMALL = RolloutCase(batch_groups=2, group_size=2, async_factor=1.5, engines=1, slots_per_engine=2,
                    kv_tokens_per_engine=4000, tokens_per_turn=4, tool_latency_mean_s=0.01, max_turns=3, steps=3)


@pytest.mark.slow
def test_quick_rollout_bench_reports_the_end_to_end_run_of_every_mode():
    result = run(quick=True)
    headline = result["by_trainer_factor"][str(QUICK.headline_factor)]
    for name in MODES:
        (only,) = result[name]["rounds"]  # QUICK runs every mode once
        done = only["step_done_s"]
        assert len(done) == QUICK.steps and done == sorted(done) and only["time_to_last_step_s"] == done[-1]
        assert 0 < only["time_to_first_batch_s"] <= done[0]
        assert only["weight_version"] == QUICK.steps
        assert all(v in (QUICK.steps - 1, QUICK.steps) for v in only["engine_weight_versions"])
        assert only["turn_weight_versions"][0] == 0 and only["turn_weight_versions"][-1] >= 1  # trained across versions
        assert only["max_version_span"] <= QUICK.max_version_span and only["max_in_flight"] <= only["window"]
        assert only["steady_step_s"] == statistics.median(b - a for a, b in zip(done, done[1:], strict=False))
        tokens = only["tokens"]
        assert tokens["trained"] <= tokens["sampled"] and tokens["discarded"] <= tokens["sampled"]
        assert abs(sum(result["breakdown"][name]["fractions"].values()) - 1) < 0.01
        assert all(v >= 0 for v in only["engine_waits_s"].values())
        split = result["breakdown"][name]["idle_split"]
        assert abs(split["no_request_s"] + split["stalled_s"] + split["calls_s"] + split["between_steps_s"]
                   - result["breakdown"][name]["idle_s"]) < 0.01
        assert result["steady_step_s"][name] == only["steady_step_s"]
    assert result["trajectory_level"]["rounds"][0]["preemptions"] == result["action_level"]["rounds"][0]["preemptions"] == 0
    assert result["venus_no_moves"]["rounds"][0]["migrations"] == 0
    assert result["venus_no_moves"]["rounds"][0]["move_s"] == {"count": 0, "median": None, "mean": None, "max": None}
    moves = result["venus"]["rounds"][0]["move_s"]
    assert moves["count"] == result["venus"]["rounds"][0]["migrations"]
    assert result["venus_no_moves"]["rounds"][0]["moves_by_reason"] == {}
    for mode in MODES:  # every decided move landed, or is counted as not
        for r in result[mode]["rounds"]:
            assert sum(r["moves_by_reason"].values()) == r["migrations"] + sum(r["moves_unlanded"].values()), (mode, r)
    assert result["venus"]["rounds"][0]["room_readings"]["all"] > 0
    assert 0 < result["venus_no_moves_end_to_end_speedup_vs_action_level"] == headline[
        "venus_no_moves_end_to_end_speedup_vs_action_level"]
    assert 1 <= headline["waste_bound_with_requests_vs_action_level"] <= headline["waste_bound_vs_action_level"]
    for baseline in ("action_level", "trajectory_level"):
        ratio = result[baseline]["time_to_last_step_s"] / result["venus"]["time_to_last_step_s"]
        assert result[f"end_to_end_speedup_vs_{baseline}"] == pytest.approx(ratio)
        assert result[f"end_to_end_speedup_vs_{baseline}_per_repeat"] == [pytest.approx(ratio)]
        assert headline[f"end_to_end_speedup_vs_{baseline}"] == result[f"end_to_end_speedup_vs_{baseline}"]
    for kind in ("group_history", "learned"):
        assert -1 <= result["predictor_spearman"][kind]["spearman"] <= 1
    assert result["predictor_spearman"]["learned"]["online"]["examples"] > 0
    assert result["calibration"]["batch_rollout_s"] > 0
    json.dumps(result)


def test_a_round_steps_the_weights_with_the_trainer_in_the_loop_and_discards_past_the_span(tmp_path):
    """Span 0: a trajectory still running when the weights step is discarded and re-run
    (the window holds more groups than a batch, and long tasks, so some are); every trained
    one ran under one version. The trainer takes its time after each batch."""
    model_dir = make_tiny_model(tmp_path / "model", layers=1)
    case = replace(SMALL, max_version_span=0, async_factor=2.5, max_turns=6)
    trainer_s = 0.05
    figures = asyncio.run(_round(model_dir, case, "venus", trainer_s, tasks(case, 0))).figures
    done = figures["step_done_s"]
    assert len(done) == case.steps and figures["weight_version"] == case.steps
    assert figures["turn_weight_versions"][-1] >= 1
    assert figures["max_version_span"] == 0 and figures["max_in_flight"] <= figures["window"]
    assert all(b - a >= trainer_s * (1 - case.gradient_fraction) for a, b in zip(done, done[1:], strict=False))
    assert figures["discarded_trajectories"] > 0 and figures["tokens"]["discarded"] > 0
    assert set(figures["memory_stalls"]) == {"promoted", "high", "low"}  # summed over engines


def test_a_round_records_its_turns_as_a_trace_the_simulator_replays(tmp_path):
    model_dir = make_tiny_model(tmp_path / "model", layers=1)
    prompts = tasks(SMALL, 0)
    result = asyncio.run(_round(model_dir, SMALL, "action_level", 0.0, prompts, record=True)).figures
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(json.dumps(row) for row in result["trace"]))
    groups = read_trace(path)
    assert result["trace"][0]["prompt"] == prompts[0].id  # the dataset's order
    assert len(groups[0]) == len(groups[1]) == 2  # the first batch: both groups, done
    for plan in (*groups[0], *groups[1]):
        assert plan.prompt_tokens > plan.shared_prompt_tokens > 0  # the system prompt and tools are shared
        assert len(plan.turns) >= 1 and all(1 <= t.gen_tokens <= SMALL.tokens_per_turn for t in plan.turns)
    unrecorded = asyncio.run(_round(model_dir, SMALL, "action_level", 0.0, tasks(SMALL, 0))).figures
    assert "trace" not in unrecorded and "timeline" not in unrecorded
    cpu = unrecorded["cpu_s"]  # every round counts its processes' CPU seconds
    assert cpu["rollout"] > 0 and len(cpu["engines"]) == SMALL.engines
    assert cpu["rollout_threads"]["MainThread"] > 0  # the driver and worker run there
    assert all(s is None or s > 0 for s in cpu["engines"])


def test_a_recorded_round_keeps_its_timeline_on_one_clock(tmp_path):
    """Every turn, every request the worker sent and every step each engine ran, in seconds
    from the round's start: the turns' generated tokens are the requests' tokens, each
    request's first output comes after it was sent, and the steps' outputs cover them."""
    model_dir = make_tiny_model(tmp_path / "model", layers=1)
    result = asyncio.run(_round(model_dir, SMALL, "action_level", 0.0, tasks(SMALL, 0), record=True)).figures
    timeline = result["timeline"]
    engines = timeline["engines"]
    assert len(engines) == SMALL.engines
    requests = [r for e in engines for r in e["calls"]["requests"]]
    assert all(r["called_s"] <= r["first_s"] <= r["last_s"] for r in requests if r["first_s"] is not None)
    turns = [turn for t in timeline["turns"] for turn in t["turns"]]
    assert all(0 <= started <= ended for started, ended, *_ in turns)
    assert sum(r["tokens"] for r in requests) >= sum(turn[3] for turn in turns)
    assert sum(sum(e["steps"]["decode_seqs"]) for e in engines) >= sum(r["tokens"] for r in requests)
    assert all(set(e["waits_s"]) == {"idle_no_request_s", "idle_stalled_s", "calls_s"} for e in engines)
    assert "update_weights" in {name for e in engines for name in e["calls"]["calls"]["name"]}


def test_a_backend_that_counts_no_recompute_nor_waits_gets_no_waste_bound():
    """A backend whose rounds carry no recomputed or aborted-unseen tokens and no waits (vLLM
    counts no aborted-unseen tokens and no waits): the breakdown names what it could not count
    and no waste bound is derived from it; the speedups stand."""
    figures = {"time_to_last_step_s": 2.0, "steady_step_s": 0.5, "time_to_first_batch_s": 0.5,
               "tokens": {"sampled": 40, "trained": 30, "prefill_computed": 90, "discarded": 0},
               "discarded_trajectories": 0, "engine_s": 4.0, "engine_waits_s": None,
               "cpu_s": {"rollout": 1.0, "engines": [None, None]}}
    rounds = [Round(dict(figures), [StepSample(90, 0, 90, 0.5, 0.5), StepSample(0, 40, 4000, 1.0, 1.5)])]
    summary = _summary(rounds, CostModel(0.001, 1e-4, 1e-6, 0.0, 1000))
    assert summary["breakdown"]["not_counted"] == ["recompute_s", "wasted_aborted_s"]
    assert "idle_split" not in summary["breakdown"] and summary["breakdown"]["idle_s"] == 2.5
    assert summary["cpu_s"] == {"rollout": 1.0, "engines": None}  # no engine process of ours to count
    speedups = _speedups({mode: summary for mode in MODES})
    assert speedups["end_to_end_speedup_vs_action_level"] == 1.0
    assert not any(k.startswith("waste_bound") for k in speedups)


def test_the_vllm_backend_is_refused_a_model_its_cpu_attention_cannot_run():
    with pytest.raises(ValueError, match="head_dim"):
        run(quick=True, case=replace(QUICK, engine_backend="vllm"))
    with pytest.raises(ValueError, match="engine_backend 'sglang'"):
        run(quick=True, case=replace(QUICK, engine_backend="sglang"))
