import json

import pytest

from venusrl.bench.rollout import MODES, QUICK, run


@pytest.mark.slow
def test_quick_rollout_bench_reports_every_mode(tmp_path):
    result = run(quick=True)
    assert set(MODES) <= set(result)
    for name in MODES:
        (only,) = result[name]["rounds"]  # QUICK runs every mode once
        done = only["batch_done_s"]
        assert len(done) == QUICK.steps and done == sorted(done) and only["time_to_batch_s"] == done[0] > 0
        window = QUICK.batch_groups * (QUICK.steps - 1) / (done[-1] - done[0]) * 60
        assert only["groups_per_minute"] == pytest.approx(window)
        assert result[name]["time_to_batch_s"] == only["time_to_batch_s"]
        assert result[name]["groups_per_minute"] == only["groups_per_minute"]
    assert result["trajectory_level"]["rounds"][0]["preemptions"] == result["action_level"]["rounds"][0]["preemptions"] == 0
    assert result["speedup_vs_action_level_per_repeat"] == [result["speedup_vs_action_level"]]
    assert result["speedup_vs_action_level"] > 0 and result["window_speedup_vs_trajectory_level"] > 0
    json.dumps(result)
