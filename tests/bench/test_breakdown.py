"""The bench's engine-time accounting: engine-seconds split so that the parts add up to the
whole (the steps themselves: tests/engine/test_step_log.py)."""

from hypothesis import given
from hypothesis import strategies as st

from venusrl.bench.breakdown import breakdown, split_busy
from venusrl.engine.step_log import StepSample
from venusrl.sim.cost_model import CostModel

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


@given(samples, costs, st.floats(0, 10), st.floats(0, 10), st.floats(0, 10))
def test_the_idle_split_adds_up_to_the_idle_whatever_the_engines_report(steps, cost, no_request, stalled, calls):
    """Waits an engine reports beyond the idle the wall clock leaves (counted to a later
    read of its stats) are cut to it: the split's parts are never negative and add up."""
    tokens = {"sampled": 0, "prefill_computed": 0, "recomputed": 0, "discarded": 0, "aborted_unseen": 0}
    engine_s = sum(s.seconds for s in steps) + 1.0
    out = breakdown(steps, cost, engine_s, tokens,
                    {"idle_no_request_s": no_request, "idle_stalled_s": stalled, "calls_s": calls})
    split = out["idle_split"]
    parts = [split["no_request_s"], split["stalled_s"], split["calls_s"], split["between_steps_s"]]
    assert all(v >= 0 for v in parts) and abs(sum(parts) - out["idle_s"]) < 2e-3
    assert split["no_request_s"] <= round(no_request, 3) and split["stalled_s"] <= round(stalled, 3)
    assert split["calls_s"] <= round(calls, 3)


@given(samples, costs, st.integers(0, 5000))
def test_what_an_engine_does_not_count_is_named_and_the_rest_still_adds_up(steps, cost, discarded):
    """An engine that counts neither recomputed tokens nor tokens sampled for aborted requests,
    nor its waits (vLLM counts the last two; our scheduler class counts its recomputation):
    those parts are absent (their time stays in prefill and decode), named, and the
    parts present still add up to the engine time."""
    tokens = {"sampled": sum(s.decode_seqs for s in steps), "prefill_computed": sum(s.prefill_tokens for s in steps),
              "discarded": discarded}
    engine_s = 2 * sum(s.seconds for s in steps) + 1.0
    out = breakdown(steps, cost, engine_s, tokens, None)
    assert out["not_counted"] == ["recompute_s", "wasted_aborted_s"] and "idle_split" not in out
    assert "recompute" not in out["fractions"] and "wasted_aborted" not in out["fractions"]
    assert abs(sum(out["fractions"].values()) - 1.0) < 1e-2


@given(samples)
def test_the_step_shape_counts_every_step_and_averages_the_decoding_ones(steps):
    shape = breakdown(steps, CostModel(1e-3, 1e-5, 1e-7, 0.0, 1000), 100.0,
                      {"sampled": 0, "prefill_computed": 0, "recomputed": 0, "discarded": 0})["steps"]
    decoding = [s.decode_seqs for s in steps if s.decode_seqs > 0]
    assert shape["count"] == len(steps)
    assert shape["mean_decode_seqs"] == (round(sum(decoding) / len(decoding), 3) if decoding else 0.0)
    assert min(s.seconds for s in steps) - 1e-6 <= shape["mean_step_s"] <= max(s.seconds for s in steps) + 1e-6


def test_the_same_decodes_in_half_full_steps_show_as_twice_the_steps_at_half_the_batch():
    full = [StepSample(0, 4, 400, 0.01)] * 10
    half = [StepSample(0, 2, 200, 0.01)] * 20
    cost = CostModel(1e-3, 1e-5, 1e-7, 0.0, 1000)
    tokens = {"sampled": 40, "prefill_computed": 0, "recomputed": 0, "discarded": 0}
    assert breakdown(full, cost, 1.0, tokens)["steps"] == {"count": 10, "mean_decode_seqs": 4.0, "mean_step_s": 0.01}
    assert breakdown(half, cost, 1.0, tokens)["steps"] == {"count": 20, "mean_decode_seqs": 2.0, "mean_step_s": 0.01}
