"""The validation replays the rollout bench's own tasks: a synthetic trace follows each
episode's plan (turns and tool latencies) with the chat template's lengths."""

from __future__ import annotations

from dataclasses import asdict, replace

import pytest

from venusrl.bench import sim_validation as validate
from venusrl.bench.rollout import QUICK, tasks
from venusrl.bench.workload import plan_episode
from venusrl.model.tiny import make_tiny_model
from venusrl.sim.cost_model import CostModel


def test_a_synthetic_trace_follows_the_bench_plans(tmp_path):
    model_dir = make_tiny_model(tmp_path / "model", layers=1)
    prompts = tasks(QUICK, seed=0)[:3]
    shape = validate.chat_shape(model_dir, QUICK, prompts)
    rows = validate.trace_rows(QUICK, shape, prompts)
    assert 0 < shape.shared_prompt_tokens < min(shape.prompt_tokens.values())
    for prompt in prompts:
        for index in range(QUICK.group_size):
            plan = plan_episode(prompt.row(), index)
            turns = [r for r in rows if r["prompt"] == prompt.id and r["index"] == index]
            assert len(turns) == plan.turns
            assert [r["tool_seconds"] for r in turns[:-1]] == list(plan.latencies_s)
            assert turns[-1]["tool_seconds"] == 0.0 and turns[-1]["obs_tokens"] == 0
            assert all(1 <= r["gen_tokens"] <= QUICK.tokens_per_turn for r in turns)


def test_every_bench_mode_simulates_its_synthetic_round(tmp_path):
    """Each bench mode replays as the simulator's system of the same name in training terms
    (slime, rollflash, venus) on the bench's cluster settings, and reaches the bench's N steps."""
    prompts = tasks(QUICK, seed=0)
    shape = validate.ChatShape(prompt_tokens={p.id: 120 for p in prompts}, shared_prompt_tokens=80, obs_tokens=20,
                               stop_probability=0.05)
    rows = validate.trace_rows(QUICK, shape, prompts)
    cost = CostModel(fixed_s=0.01, token_s=1e-4, kv_token_s=1e-7, reload_token_s=0.0,
                     kv_capacity_tokens=QUICK.kv_tokens_per_engine)
    for mode in ("trajectory_level", "action_level", "venus"):
        result = validate.simulate_round(QUICK, cost, rows, mode, tmp_path / "trace.jsonl", trainer_s=0.5,
                                         predictor_spearman=0.7)
        assert 0 < result.time_to_first_batch_s < result.sim_seconds and result.steps == QUICK.steps


def test_the_predictor_accuracy_is_the_measured_one_or_an_error_naming_it():
    assert validate.measured_spearman({"predictor_spearman": {"learned": {"online": {"spearman": 0.42}}}}) == 0.42
    assert validate.measured_spearman({"predictor_spearman": {"learned": {"online": {"spearman": -0.2}}}}) == 0.01
    with pytest.raises(ValueError, match="predictor_spearman.learned.online.spearman"):
        validate.measured_spearman({"predictor_spearman": {"learned": {}}})


def test_validation_runs_differ_from_the_calibration_run_in_one_setting_each():
    runs = validate.validation_cases(QUICK)
    for case in runs.values():
        changed = {f for f in ("seed", "kv_tokens_per_engine", "slots_per_engine") if getattr(case, f) != getattr(QUICK, f)}
        assert len(changed) == 1
    assert runs["tight_kv"].kv_tokens_per_engine < QUICK.kv_tokens_per_engine


def test_out_of_sample_error_is_per_mode_over_the_validation_runs():
    def run(errors):
        return {mode: {"last_step": {"error_pct": e}} for mode, e in zip(validate.MODES, errors, strict=True)}

    error = validate.out_of_sample_error({"a": run([5.0, -3.0, 1.0]), "b": run([-7.0, -1.0, 2.0]),
                                          "c": run([1.0, -2.0, 12.0])})
    assert error["trajectory_level"] == {"median_pct": 1.0, "max_abs_pct": 7.0,
                                         "per_run_pct": {"a": 5.0, "b": -7.0, "c": 1.0}}
    assert error["venus"]["max_abs_pct"] == 12.0 and error["action_level"]["median_pct"] == -2.0


@pytest.mark.slow
def test_validate_fits_on_a_calibration_run_and_reports_the_error_on_another(tmp_path):
    """The smallest real bench case: one engine, two groups of two, two steps; one validation
    run with other tasks. The figure itself is the bench's (timing), not asserted here."""
    case = replace(QUICK, batch_groups=2, group_size=2, engines=1, slots_per_engine=2, max_turns=3, steps=2,
                   kv_tokens_per_engine=2000)
    result = validate.run(True, None, case, {"other_seed": replace(case, seed=case.seed + 100)})
    assert result["out_of_sample"]["other_seed"]["case"]["seed"] == case.seed + 100
    for mode in validate.MODES:
        assert result["in_sample"][mode]["replayed"] == "recorded"
        run = result["out_of_sample"]["other_seed"][mode]
        assert run["last_step"]["measured_s"] > 0 and run["last_step"]["simulated_s"] > 0
        assert set(run["breakdown"]) == {"recomputed_tokens", "discarded_trajectories", "idle_fraction",
                                         *(name for name, _, _ in validate.REPLAYED_COUNTS)}
        assert all(None not in figure.values() for figure in run["breakdown"].values())
        assert 0 <= run["breakdown"]["idle_fraction"]["simulated"] <= 1
        assert result["out_of_sample_error"][mode]["per_run_pct"] == {"other_seed": run["last_step"]["error_pct"]}
    assert 0 < result["predictor_spearman"] <= 1


def test_replay_compares_each_mode_with_its_measured_rounds(tmp_path):
    """A bench JSON's shape with one round per mode (the turns drawn from the bench's plans):
    every figure compared is the measured one against the simulation of that round."""
    prompts = tasks(QUICK, seed=QUICK.seed)
    shape = validate.ChatShape(prompt_tokens={p.id: 120 for p in prompts}, shared_prompt_tokens=80, obs_tokens=20,
                               stop_probability=0.05)
    rows = validate.trace_rows(QUICK, shape, prompts)
    measured_round = {"trace": rows, "time_to_first_batch_s": 1.0, "time_to_last_step_s": 4.0,
                      "tokens": {"recomputed": 7}, "discarded_trajectories": 1, "preemptions": 3, "migrations": 2,
                      "dropped_at_weight_update_tokens": 90, "evicted_tokens": {"high_ref": 11}}
    measured = {"case": asdict(QUICK), "trainer": {"step_s": {str(QUICK.headline_factor): 0.5}},
                **{mode: {"rounds": [measured_round], "breakdown": {"fractions": {"idle": 0.25}}}
                   for mode in validate.MODES}}
    cost = CostModel(fixed_s=0.01, token_s=1e-4, kv_token_s=1e-7, reload_token_s=0.0,
                     kv_capacity_tokens=QUICK.kv_tokens_per_engine)
    out = validate.replay(measured, cost, 0.7, tmp_path)
    for mode in validate.MODES:
        last = out[mode]["last_step"]
        assert last["measured_s"] == 4.0 and last["error_pct"] == round(100 * (last["simulated_s"] - 4.0) / 4.0, 1)
        assert out[mode]["breakdown"]["recomputed_tokens"]["measured"] == 7
        assert out[mode]["breakdown"]["idle_fraction"]["measured"] == 0.25
        counts = out[mode]["breakdown"]
        assert (counts["preemptions"]["measured"], counts["migrations"]["measured"]) == (3, 2)
        assert counts["dropped_at_weight_update_tokens"]["measured"] == 90
        assert counts["evicted_high_ref_tokens"]["measured"] == 11
        assert counts["dropped_at_weight_update_tokens"]["simulated"] > 0, "the replay drops KV at its weight updates"
    older = {**measured, "venus": {**measured["venus"], "rounds": [
        {k: v for k, v in measured_round.items() if k not in ("evicted_tokens", "preemptions")}]}}
    counts = validate.replay(older, cost, 0.7, tmp_path)["venus"]["breakdown"]
    assert counts["evicted_high_ref_tokens"]["measured"] is None and counts["preemptions"]["measured"] is None
    without_trace = {**measured, "venus": {**measured["venus"], "rounds": [{**measured_round, "trace": None}]}}
    with pytest.raises(ValueError, match="no trace"):
        validate.replay(without_trace, cost, 0.7, tmp_path)


def test_the_move_latency_is_the_mean_venus_measured_or_zero_when_it_was_not():
    rounds = [{"move_s": {"count": 3, "mean": 0.06}}, {"move_s": {"count": 0, "mean": None}},
              {"move_s": {"count": 1, "mean": 0.02}}, {}]
    assert abs(validate.measured_move_latency({"venus": {"rounds": rounds}}) - 0.05) < 1e-12
    assert validate.measured_move_latency({"venus": {"rounds": [{}]}}) == 0.0


def test_the_machine_speed_is_a_rounds_step_seconds_over_what_the_cost_model_prices_them():
    """Hand computation: at fixed 1 ms + 0.1 ms a token + 1 us a KV token, a step of 10
    prefill tokens prices 2 ms and a decode step of 2 sequences over 500 KV tokens 1.7 ms;
    taking 3 ms and 5.1 ms they ran 8.1 / 3.7 as long. A step after the round's last step
    (ended past `time_to_last_step_s`) is not the round's."""
    cost = CostModel(fixed_s=1e-3, token_s=1e-4, kv_token_s=1e-6, reload_token_s=0.0, kv_capacity_tokens=1000)
    steps = {"prefill_tokens": [10, 0, 0], "decode_seqs": [0, 2, 2], "kv_tokens": [0, 500, 500],
             "seconds": [3e-3, 5.1e-3, 1.0], "ended_s": [0.5, 1.0, 9.0]}
    measured_round = {"time_to_last_step_s": 2.0, "timeline": {"engines": [{"steps": steps}]}}
    assert validate.machine_speed(measured_round, cost) == pytest.approx(8.1 / 3.7)


def test_a_slowed_cost_model_prices_the_engines_work_factor_times_as_long():
    cost = CostModel(fixed_s=1e-3, token_s=1e-4, kv_token_s=1e-6, reload_token_s=2e-6, kv_capacity_tokens=1000,
                     output_s=1e-4, call_s=2e-4)
    slow = validate.slowed(cost, 1.5)
    assert slow.step_seconds(10, 2, 500) == pytest.approx(1.5 * cost.step_seconds(10, 2, 500))
    assert (slow.handover_seconds(1, 4), slow.call_s) == pytest.approx((1.5 * cost.handover_seconds(1, 4), 3e-4))
    assert slow.kv_capacity_tokens == 1000 and slow.reload_token_s == 2e-6, "not the machine's CPU work"
