"""`make demo` must keep working: the demo's path run small."""

import json

from venusrl.demo import run_demo


def test_demo_runs_rollouts_on_the_engine(tmp_path):
    summary = run_demo(tmp_path, groups=1, group_size=2)
    assert summary["parity_max_abs_diff"] < 1e-4
    assert [t["id"] for t in summary["trajectories"]] == ["g0-t0", "g0-t1"]
    assert all(t["generated_tokens"] > 0 and t["tokens"] > t["generated_tokens"] for t in summary["trajectories"])
    # every prompt token of every turn went through the engine's admission
    first_prompts = sum(t["tokens"] - t["generated_tokens"] for t in summary["trajectories"])
    assert summary["engine"]["prompt_tokens"] >= first_prompts > 0
    assert json.loads((tmp_path / "demo.json").read_text()) == summary
