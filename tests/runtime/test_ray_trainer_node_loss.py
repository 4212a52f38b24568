"""The trainer's node (rollout and trainer actors) killed mid-run: the run stops cleanly,
naming what was lost and the checkpoint it resumes from (exit 3); once the node is back,
`venusrl train` on the same run directory resumes from that checkpoint, says so in one line,
and trains every prompt exactly once."""

import json

import pytest

pytest.importorskip("ray")

from tests.runtime.node_loss import finish, start_run, trained_prompt_ids, wait_for  # noqa: E402
from tests.runtime.test_ray_runtime import make_config  # noqa: E402


@pytest.mark.slow
def test_a_lost_trainer_node_stops_the_run_and_train_resumes_it(trainer_apart_cluster, tiny_model_dir, tmp_path):
    cluster = trainer_apart_cluster
    trainer_node = cluster.nodes[1]
    config = make_config(tiny_model_dir, steps=6, engine={"placement": "process"}, scheduler={"engines": 1})
    process, run_dir = start_run(cluster, config, tmp_path)
    log = tmp_path / "driver.log"

    wait_for(lambda: (run_dir / "checkpoints" / "step-000001").is_dir(), process, "checkpoint 1", log)
    cluster.kill(trainer_node)
    code = process.wait(timeout=300)
    stopped = log.read_text()
    assert code == 3, stopped[-4000:]
    assert "interrupted: the " in stopped and "actor was lost" in stopped
    newest = sorted(p.name for p in (run_dir / "checkpoints").glob("step-*"))[-1]
    assert f"resumes it from its newest checkpoint ({newest})" in stopped

    cluster.revive(trainer_node)
    resumed, run_dir = start_run(cluster, config, tmp_path)
    finish(resumed, log)

    out = log.read_text()
    assert f"resumed from checkpoint {newest}" in out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 6 and summary["resumed_from"] == newest
    prompt_ids = trained_prompt_ids(run_dir)
    assert len(prompt_ids) == 12 and len(set(prompt_ids)) == 12
