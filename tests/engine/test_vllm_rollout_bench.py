"""`venusrl bench rollout` with `engine.backend: vllm`: a round of each slot mode on vLLM's CPU
build, the trainer in the loop, weights pushed into the running engines; no engine-time
breakdown (vLLM reports no step durations) and the JSON says why. Runs in the vLLM venv
(`make test-vllm`); skipped where vLLM is not installed."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed in this venv: `make test-vllm` runs these tests "
                                   "in .venv-vllm (built by `make vllm-venv`)")

from tests.rollout.test_rollout_bench import SMALL  # noqa: E402

from venusrl.bench.rollout import _round, _summary, tasks  # noqa: E402
from venusrl.engine.vllm_backend import NO_STEP_LOG  # noqa: E402
from venusrl.model.tiny import make_tiny_model  # noqa: E402

CASE = replace(SMALL, engine_backend="vllm", head_dim=64, steps=2)


@pytest.mark.parametrize("mode", ["action_level", "venus"])
def test_a_vllm_round_trains_with_the_trainer_in_the_loop_and_says_why_it_has_no_breakdown(tmp_path, mode):
    model_dir = make_tiny_model(tmp_path / "model", layers=1, head_dim=64, seed=1)
    measured = asyncio.run(_round(model_dir, CASE, mode, 0.05, tasks(CASE, 0)))
    figures = measured.figures
    done = figures["step_done_s"]
    assert len(done) == CASE.steps and done == sorted(done) and figures["weight_version"] == CASE.steps
    assert all(v in (CASE.steps - 1, CASE.steps) for v in figures["engine_weight_versions"])
    assert figures["turn_weight_versions"][0] == 0 and figures["turn_weight_versions"][-1] >= 1
    assert 0 < figures["time_to_first_batch_s"] <= done[0]
    tokens = figures["tokens"]
    assert tokens["trained"] > 0 and tokens["prefill_computed"] > 0 and "sampled" not in tokens
    assert figures["engine_waits_s"] is None and figures["placement"].startswith("vllm")
    assert 0 < figures["hit_rate"] < 1  # each turn re-sends the trajectory's context: its blocks hit
    assert measured.samples is None and measured.no_step_log == NO_STEP_LOG
    summary = _summary([measured], None)
    assert summary["breakdown"] == {"available": False, "reason": NO_STEP_LOG}
