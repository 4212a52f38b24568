import json

import pytest

from venusrl.bench.rollout import MODES, QUICK, run


@pytest.mark.slow
def test_quick_rollout_bench_reports_every_mode(tmp_path):
    result = run(quick=True)
    assert set(MODES) <= set(result)
    for name in MODES:
        assert result[name]["time_to_batch_s"] > 0
        assert result[name]["groups_per_minute"] == pytest.approx(QUICK.batch_groups / result[name]["time_to_batch_s"] * 60)
    assert result["trajectory_level"]["preemptions"] == result["action_level"]["preemptions"] == 0
    assert result["speedup_vs_action_level"] > 0
    json.dumps(result)
