"""The link between the rollout (head node) and an engine node cut mid-run (its veth down:
nothing errs, everything to it hangs): the failover's watchdog declares the engine lost
within WATCH_INTERVAL_S + PROBE_TIMEOUT_S, its turns resume on the other engine, and once
the link is back nothing arrives twice (its connection was dropped at the loss)."""

import json

import pytest

pytest.importorskip("ray")

from tests.runtime.node_loss import finish, start_run, steps_trained, trained_prompt_ids, wait_for  # noqa: E402
from tests.runtime.test_ray_runtime import make_config  # noqa: E402

from venusrl.runtime.engine_failover import PROBE_TIMEOUT_S, WATCH_INTERVAL_S  # noqa: E402


@pytest.mark.slow
def test_a_cut_link_is_an_engine_loss_and_its_return_duplicates_nothing(three_node_cluster, tiny_model_dir,
                                                                         tmp_path):
    cluster = three_node_cluster
    victim = cluster.nodes[1]
    config = make_config(tiny_model_dir, steps=4, engine={"placement": "process"}, scheduler={"engines": 2},
                         rollout={"max_new_tokens_per_turn": 48})
    process, run_dir = start_run(cluster, config, tmp_path)
    log = tmp_path / "driver.log"
    train_log = run_dir / "train.log"

    wait_for(lambda: steps_trained(run_dir) >= 1, process, "a first trained step", log)
    cluster.set_link(victim, up=False)
    try:
        wait_for(lambda: "lost (watchdog" in train_log.read_text(), process, "the engine's loss", log,
                 timeout_s=WATCH_INTERVAL_S + PROBE_TIMEOUT_S + 30)
    finally:
        cluster.set_link(victim, up=True)
    finish(process, log)
    cluster.kill(victim)  # Ray declared the node dead meanwhile: start it anew for the module's next test
    cluster.revive(victim)

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 4
    prompt_ids = trained_prompt_ids(run_dir)
    assert len(prompt_ids) == 8 and len(set(prompt_ids)) == 8
    assert summary["engines_lost"] == 1
    text = train_log.read_text()
    assert f"no answer within {PROBE_TIMEOUT_S:g} s" in text
    assert "WireError" not in text and "failed:" not in text  # no stream saw a token twice, no turn failed
    print(f"\nlink cut: {summary['turns_resumed']} turns resumed, {summary['tokens_recomputed']} tokens "
          f"recomputed, recovery {summary['engine_recovery_s']} s")
