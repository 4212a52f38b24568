"""The controller terms fitted from a round's timeline, against a hand computation."""

from __future__ import annotations

import pytest

from venusrl.bench import controller_terms


def _round():
    """A 1-second round on one engine: three steps (prefill with its first token, then two
    decode steps of two sequences) of 0.1 s each, one after the run's end; waits of 0.2 s
    with no request and 0.05 s in calls."""
    steps = {"prefill_tokens": [10, 0, 0, 0], "decode_seqs": [1, 2, 2, 2], "kv_tokens": [10, 22, 24, 26],
             "seconds": [0.1, 0.1, 0.1, 0.1], "ended_s": [0.3, 0.5, 0.7, 1.2]}
    calls = {"name": ["demoted_trajectories", "set_priority", "demoted_trajectories", "stats"],
             "started_s": [0.1, 0.15, 0.4, 1.1], "ended_s": [0.108, 0.15, 0.414, 1.12]}
    requests = [{"called_s": 0.1, "first_s": 0.302, "finish_reason": "length"},  # sampled by the step ending 0.3
                {"called_s": 0.4, "first_s": None, "finish_reason": None}]  # left before any output: an abort
    engine = {"steps": steps, "calls": {"calls": calls, "requests": requests},
              "waits_s": {"idle_no_request_s": 0.2, "idle_stalled_s": 0.0, "calls_s": 0.05}}
    return {"time_to_last_step_s": 1.0, "timeline": {"engines": [engine], "prediction_latencies_s": [0.01, 0.03]}}


def test_every_term_by_hand():
    terms = controller_terms.fit({"venus": {"rounds": [_round()]}}, ["venus"])
    # 1 s - 0.3 s of steps - 0.25 s of waits, over the 1 + 2 + 2 outputs of the steps by then
    assert terms.output_s == pytest.approx(0.45 / 5)
    # 0.05 s over 3 calls by then, 2 requests added and 1 left early
    assert terms.call_s == pytest.approx(0.05 / 6)
    assert terms.delivery_latency_s == pytest.approx(0.002)
    assert terms.demoted_query_s == pytest.approx((0.008 + 0.014) / 2)
    assert terms.prediction_latency_s == pytest.approx(0.02)


def test_a_round_without_a_timeline_is_an_error_naming_its_mode():
    with pytest.raises(ValueError, match="action_level: a measured round has no timeline"):
        controller_terms.fit({"action_level": {"rounds": [{"time_to_last_step_s": 1.0}]}, "venus": {"rounds": []}},
                             ["action_level"])
