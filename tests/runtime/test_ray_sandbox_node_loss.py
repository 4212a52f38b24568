"""A sandbox node of a three-node Ray cluster killed mid-run (SIGKILL of its raylet, its node
agent actor and everything else in its namespace), while trajectories run commands in their
sandboxes every turn: no trajectory hangs, the lost node's sandboxes are recovered on the
other node or their trajectories discarded and their groups refilled, nothing is trained
twice, and the loss is counted."""

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("ray")

from tests.runtime.node_loss import finish, start_run, trained_prompt_ids, wait_for  # noqa: E402
from tests.runtime.test_ray_runtime import make_config  # noqa: E402

from venusrl.sandbox.cgroups import CGROUP_ROOT  # noqa: E402

MiB = 2**20


@pytest.mark.skipif(os.geteuid() != 0 or not Path(CGROUP_ROOT).exists(), reason="sandboxes need root and cgroups")
def test_a_killed_sandbox_node_loses_no_prompt_and_trains_none_twice(three_node_cluster, tiny_model_dir, tmp_path):
    cluster = three_node_cluster
    victim = cluster.nodes[2]
    rows = tmp_path / "train.jsonl"
    # six sandbox commands a trajectory: its sandbox lives for seconds, so the kill finds some
    rows.write_text("".join(json.dumps({"id": f"s-{i}", "prompt": "go", "turns": 6,
                                        "messages": [{"role": "user", "content": "go"}]}) + "\n" for i in range(6)))
    config = make_config(
        tiny_model_dir, steps=3,
        rollout={"environment": "tests.runtime.sandbox_env:SandboxTurnsEnv", "max_turns": 8},
        # a trajectory whose sandbox is lost fails and is re-run; the group may not run out of re-runs
        coordinator={"max_reruns": 20},
        sandbox={"nodes": 2, "node_memory": 512 * MiB, "cold_start_default": 16 * MiB, "oom_grace_s": 20.0},
        data={"train": str(rows), "generate_eval": 0})
    process, run_dir = start_run(cluster, config, tmp_path)
    log = tmp_path / "driver.log"

    wait_for(lambda: _live_sandboxes_on(victim, run_dir) > 0, process, "sandboxes live on the victim's node", log)
    cluster.kill(victim)
    finish(process, log)
    cluster.revive(victim)

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["groups_dropped"] == 0
    prompt_ids = trained_prompt_ids(run_dir)
    assert sorted(prompt_ids) == [f"s-{i}" for i in range(6)]  # each trained exactly once
    assert summary["sandbox_nodes_lost"] == 1
    assert summary["sandboxes_recovered"] + summary["trajectories_discarded"] >= 1  # the loss hit live sandboxes
    train_log = (run_dir / "train.log").read_text()
    assert "lost; recovering its sandboxes" in train_log
    print(f"\nsandbox node loss: {summary['sandboxes_recovered']} sandboxes recovered, "
          f"{summary['trajectories_discarded']} trajectories discarded and re-run")


def _live_sandboxes_on(node, run_dir: Path) -> int:
    """Live sandboxes of the node agent on `node`, as the newest step's sandbox sample says
    (train.log names each agent's address)."""
    log, metrics = run_dir / "train.log", run_dir / "metrics.jsonl"
    if not log.exists() or not metrics.exists():
        return 0
    agents = [line.split("sandbox node agent ")[1].split(" ")[0] for line in log.read_text().splitlines()
              if "sandbox node agent " in line and f" on {node.ip} " in line]
    samples = [json.loads(line) for line in metrics.read_text().splitlines() if '"kind": "sandbox"' in line]
    return sum(s["live"] for s in samples[-2:] if s["node"] in agents)
