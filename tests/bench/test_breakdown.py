"""The bench's engine-time accounting: steps timed and shaped as the runner saw them, and
engine-seconds split so that the parts add up to the whole."""

from hypothesis import given
from hypothesis import strategies as st

from venusrl.bench.breakdown import StepLog, breakdown, split_busy
from venusrl.engine.config import EngineConfig
from venusrl.engine.engine import Engine
from venusrl.model.tiny import make_tiny_model
from venusrl.sim.cost_model import CostModel, StepSample
from venusrl.types import SamplingParams


def test_steps_count_the_tokens_computed_not_the_cached_prefix(tmp_path):
    model_dir = make_tiny_model(tmp_path / "model", layers=1)
    engine = Engine.from_pretrained(model_dir, EngineConfig(kv_capacity_tokens=512, page_size=1))
    log = StepLog(engine)
    prompt = list(range(10, 50))
    sampling = SamplingParams(max_new_tokens=3, stop_token_ids=(-1,))
    engine.generate([prompt], sampling)
    first = list(log.samples)
    engine.generate([prompt + [60]], sampling)  # the 40-token prefix is cached
    again = log.samples[len(first):]
    assert sum(s.prefill_tokens for s in first) == len(prompt)
    assert sum(s.prefill_tokens for s in again) <= 2
    assert sum(s.decode_seqs for s in first) == sum(s.decode_seqs for s in again) == 3
    assert log.sampled_tokens == 6 and len(log.ended) == len(log.samples)
    assert all(s.seconds > 0 for s in log.samples) and log.busy_s > 0


samples = st.lists(st.builds(StepSample, st.integers(0, 500), st.integers(0, 8), st.integers(0, 4000),
                             st.floats(1e-4, 0.1)), min_size=1, max_size=30)
costs = st.builds(CostModel, st.floats(0, 0.01), st.floats(0, 1e-3), st.floats(0, 1e-5), st.just(0.0), st.just(1000))


@given(samples, costs, st.integers(0, 5000), st.integers(0, 5000), st.integers(0, 5000))
def test_the_parts_add_up_to_the_engine_time(steps, cost, recomputed, discarded, unseen):
    busy = sum(s.seconds for s in steps)
    prefill_s, decode_s = split_busy(steps, cost)
    assert abs(prefill_s + decode_s - busy) < 1e-9
    tokens = {"sampled": sum(s.decode_seqs for s in steps), "prefill_computed": sum(s.prefill_tokens for s in steps),
              "recomputed": recomputed, "discarded": discarded, "aborted_unseen": unseen}
    engine_s = 2 * busy + 1.0
    out = breakdown(steps, cost, engine_s, tokens)
    parts = [v for k, v in out.items() if k.endswith("_s") and k != "engine_s"]
    assert all(v >= -1e-9 for v in parts)
    assert abs(sum(out["fractions"].values()) - 1.0) < 1e-2
