"""The validation fit measures engine steps the way the rollout benchmark runs them: its
engines stepping at once, each on its own thread."""

from __future__ import annotations

import threading

from venusrl.bench.rollout import RolloutCase
from venusrl.engine.config import EngineConfig
from venusrl.engine.engine import Engine
from venusrl.model.tiny import make_tiny_model
from venusrl.sim import validate
from venusrl.types import SamplingParams


def test_measure_steps_runs_every_engine_on_its_own_thread(tmp_path, monkeypatch):
    model_dir = make_tiny_model(tmp_path / "model", layers=1)
    case = RolloutCase(batch_groups=1, group_size=1, async_factor=1.0, engines=2, slots_per_engine=1,
                       kv_tokens_per_engine=512, tokens_per_turn=2, tool_latency_mean_s=0.0, max_turns=1, steps=1)
    engines = [Engine.from_pretrained(model_dir, EngineConfig(kv_capacity_tokens=512, page_size=1)) for _ in range(2)]
    threads: dict[int, str] = {}
    original = Engine.step

    def step(self):
        threads[id(self)] = threading.current_thread().name
        return original(self)

    monkeypatch.setattr(Engine, "step", step)
    samples = validate.measure_steps(engines, prompt_len=8, case=case, repeats=1)
    # 1 then 2 concurrent requests per engine: a prefill step and a decode step each time
    assert len(samples) >= 2 * 2 * 2
    assert all(s.seconds > 0 for s in samples)
    assert sum(s.decode_seqs for s in samples) > 0 and sum(s.prefill_tokens for s in samples) > 0
    assert len(threads) == 2 and threading.main_thread().name not in threads.values()
    assert len(set(threads.values())) == 2


def test_recorded_steps_count_the_tokens_computed_not_the_cached_prefix(tmp_path):
    model_dir = make_tiny_model(tmp_path / "model", layers=1)
    engine = Engine.from_pretrained(model_dir, EngineConfig(kv_capacity_tokens=512, page_size=1))
    prompt = list(range(10, 50))
    original = Engine.step
    sampling = SamplingParams(max_new_tokens=3, stop_token_ids=(-1,))
    first: list = []
    with validate.recording_steps(first):
        engine.generate([prompt], sampling)
    again: list = []
    with validate.recording_steps(again):
        engine.generate([prompt + [60]], sampling)  # the 40-token prefix is cached
    assert sum(s.prefill_tokens for s in first) == len(prompt)
    assert sum(s.prefill_tokens for s in again) <= 2
    assert sum(s.decode_seqs for s in first) == sum(s.decode_seqs for s in again) == 3
    assert Engine.step is original
