"""An engine node of a three-node Ray cluster killed mid-run (SIGKILL of its raylet and
every process in its namespace): the run finishes every step, trains every prompt exactly
once, and the dead engine's in-flight turns resume on the surviving engine from their
recorded tokens, counted in the summary and the metrics.

The kill must find a turn in flight on the victim, and the tiny model's rollout has moments
with no turn running (it waits on a step, a weight push): so after the first trained step the
victim's engine is stopped (SIGSTOP) once its stats count a turn running, and the node is
killed while it stays stopped."""

import json

import pytest

pytest.importorskip("ray")

from tests.runtime.node_loss import (  # noqa: E402
    finish,
    start_run,
    steps_trained,
    stop_with_a_turn_running,
    trained_prompt_ids,
    wait_for,
)
from tests.runtime.test_ray_runtime import make_config  # noqa: E402

from venusrl.metrics.report import write_report  # noqa: E402
from venusrl.metrics.writer import read_metrics  # noqa: E402


def test_a_killed_engine_node_costs_time_not_the_run(three_node_cluster, tiny_model_dir, tmp_path):
    cluster = three_node_cluster
    victim = cluster.nodes[1]
    config = make_config(tiny_model_dir, steps=4, engine={"placement": "process"}, scheduler={"engines": 2},
                         rollout={"max_new_tokens_per_turn": 48})
    process, run_dir = start_run(cluster, config, tmp_path)
    log = tmp_path / "driver.log"

    wait_for(lambda: steps_trained(run_dir) >= 1, process, "a first trained step", log)
    stop_with_a_turn_running(victim, run_dir, process, log)
    killed = cluster.kill(victim)
    finish(process, log)
    cluster.revive(victim)  # for the module's next test

    summary = json.loads((run_dir / "summary.json").read_text())
    assert killed >= 2  # the raylet and at least the engine actor's worker
    assert summary["steps"] == 4
    prompt_ids = trained_prompt_ids(run_dir)
    assert len(prompt_ids) == 8 and len(set(prompt_ids)) == 8  # each trained exactly once
    assert summary["engines_lost"] == 1
    assert summary["turns_resumed"] >= 1 and summary["tokens_recomputed"] > 0
    assert summary["trajectories_discarded"] == 0  # resumed, not re-run
    lost_at = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "step" and r["engines_lost"]]
    assert lost_at and lost_at[-1]["turns_resumed"] == summary["turns_resumed"]
    train_log = (run_dir / "train.log").read_text()
    assert "engine 0 lost" in train_log or "engine 1 lost" in train_log
    report = write_report(run_dir).read_text()  # `venusrl report`
    assert f"| turns resumed on a surviving engine | {summary['turns_resumed']} |" in report
    assert f"| tokens recomputed (the resumed turns' prefixes) | {summary['tokens_recomputed']} |" in report
    print(f"\nengine node loss: {summary['turns_resumed']} turns resumed, {summary['tokens_recomputed']} tokens "
          f"recomputed, recovery {summary['engine_recovery_s']} s")
