"""`venusrl bench rollout` with `engine.backend: vllm`: a round of each slot mode on vLLM's CPU
build, the trainer in the loop, weights pushed into the running engines, the engine-time
breakdown from vLLM's own timed iterations (recomputation counted by our scheduler class), naming
what vLLM does not count. Runs in the vLLM venv
(`make test-vllm`); skipped where vLLM is not installed."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed in this venv: `make test-vllm` runs these tests "
                                   "in .venv-vllm (built by `make vllm-venv`)")

from tests.rollout.test_rollout_bench import SMALL  # noqa: E402

from venusrl.bench.rollout import _round, _summary, tasks  # noqa: E402
from venusrl.model.tiny import make_tiny_model  # noqa: E402
from venusrl.sim.cost_model import fit  # noqa: E402

CASE = replace(SMALL, engine_backend="vllm", head_dim=64, steps=2)


@pytest.mark.parametrize("mode", ["action_level", "venus"])
def test_a_vllm_round_trains_with_the_trainer_in_the_loop_and_breaks_its_engine_time_down(tmp_path, mode):
    model_dir = make_tiny_model(tmp_path / "model", layers=1, head_dim=64, seed=1)
    measured = asyncio.run(_round(model_dir, CASE, mode, 0.05, tasks(CASE, 0)))
    figures = measured.figures
    done = figures["step_done_s"]
    assert len(done) == CASE.steps and done == sorted(done) and figures["weight_version"] == CASE.steps
    assert all(v in (CASE.steps - 1, CASE.steps) for v in figures["engine_weight_versions"])
    assert figures["turn_weight_versions"][0] == 0 and figures["turn_weight_versions"][-1] >= 1
    assert 0 < figures["time_to_first_batch_s"] <= done[0]
    tokens = figures["tokens"]
    assert tokens["trained"] > 0 and tokens["sampled"] > 0 and tokens["prefill_computed"] > 0
    assert tokens["recomputed"] >= 0 and "aborted_unseen" not in tokens  # recomputation: our scheduler's count
    assert set(figures["evicted_tokens"]) == {"low_ref", "high_ref"}  # holds released for room
    assert figures["engine_waits_s"] is None and figures["placement"].startswith("vllm")
    assert 0 < figures["hit_rate"] < 1  # each turn re-sends the trajectory's context: its blocks hit
    steps = measured.samples
    assert steps and all(s.seconds > 0 and (s.prefill_tokens or s.decode_seqs) for s in steps)
    assert all(0 <= s.kv_tokens <= CASE.kv_tokens_per_engine for s in steps)
    assert sum(s.seconds for s in steps) < figures["engine_s"]
    out = _summary([measured], fit(steps, CASE.kv_tokens_per_engine))["breakdown"]
    assert out["not_counted"] == ["wasted_aborted_s"] and "idle_split" not in out
    assert abs(sum(out["fractions"].values()) - 1) < 0.01 and out["fractions"]["idle"] < 1
