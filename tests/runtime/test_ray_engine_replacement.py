"""A killed engine node that comes back is used again without a restart: the lost engine's
replacement actor waits for room on an engine node (each has room for one engine), lands on
the revived node, takes the current weights at the next push and serves from then on."""

import json

import pytest

pytest.importorskip("ray")

from tests.runtime.node_loss import finish, start_run, steps_trained, trained_prompt_ids, wait_for  # noqa: E402
from tests.runtime.test_ray_runtime import make_config  # noqa: E402

STEPS = 240


@pytest.mark.slow
def test_a_revived_engine_node_takes_the_lost_engines_place(three_node_cluster, tiny_model_dir, tmp_path):
    cluster = three_node_cluster
    victim = cluster.nodes[1]
    # long enough (about 6 steps a second here) that the node is back while steps remain:
    # 240 steps over 20 epochs of 24 prompts
    config = make_config(tiny_model_dir, steps=STEPS, engine={"placement": "process"}, scheduler={"engines": 2},
                         trainer={"epochs": 20}, data={"generate_train": 24})
    process, run_dir = start_run(cluster, config, tmp_path)
    log, train_log = tmp_path / "driver.log", run_dir / "train.log"

    wait_for(lambda: steps_trained(run_dir) >= 1, process, "a first trained step", log)
    cluster.kill(victim)
    wait_for(lambda: " lost (" in train_log.read_text(), process, "the engine's loss", log)
    wait_for(lambda: cluster.alive_nodes() == 2, process, "Ray declaring the node dead", log)  # it died, then it is back
    cluster.revive(victim)
    wait_for(lambda: " replaced: " in train_log.read_text(), process, "the replacement's admission", log)
    replaced_at = steps_trained(run_dir)
    finish(process, log)

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == STEPS and replaced_at < STEPS
    prompt_ids = trained_prompt_ids(run_dir)
    assert len(prompt_ids) == 2 * STEPS and all(prompt_ids.count(p) == 20 for p in set(prompt_ids))  # once an epoch
    assert summary["engines_lost"] == 1 and summary["engines_replaced"] == 1
    text = train_log.read_text()
    lost = next(line for line in text.splitlines() if " lost (" in line).split("engine ")[1].split(" ")[0]
    assert f"engine {lost} replaced: engine {lost} ({victim.ip}," in text  # on the revived node
    assert summary["engine_prompt_tokens"][lost] > 0  # and it served
