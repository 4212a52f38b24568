"""A sandbox node of a three-node Ray cluster killed mid-run (SIGKILL of its raylet, its node
agent actor and everything else in its namespace), while trajectories run commands in their
sandboxes every turn: no trajectory hangs, the lost node's sandboxes are recovered on the
other node or their trajectories discarded and their groups refilled, nothing is trained
twice, and the loss is counted."""

import contextlib
import json
import os
import signal
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

    stopped: list[int] = []
    wait_for(lambda: stopped.extend(_stop_sandboxes_on(victim, run_dir)) or stopped, process,
             "a sandbox command running on the victim's node", log, poll_s=0.01)
    cluster.kill(victim)
    for pid in stopped:  # they die with their node: a sandbox has namespaces of its own, not the node's
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
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


def _stop_sandboxes_on(node, run_dir: Path) -> list[int]:
    """Once a sandbox of the node agents on `node` runs a command (a process of its own
    beside the sandbox's init: the sandbox was created and is in use), stop (SIGSTOP) every
    process of every sandbox there, so they stay live, their commands unfinished, until the
    node is killed; returns their pids, none while no command runs there. Read from the
    sandboxes' cgroups (`venusrl-<run>/<node id>/sb-*`; train.log names each agent's node id
    and host), not from the run's metrics: a step's sandbox sample may be a step old, and
    sandboxes have network namespaces of their own, so the node's does not list them."""
    log = run_dir / "train.log"
    if not log.exists():
        return []
    agents = [line.split("sandbox node agent ")[1].split(" ")[0] for line in log.read_text().splitlines()
              if "sandbox node agent " in line and f" on {node.ip} " in line]
    patterns = [f"{parent}venusrl-*/{agent}/sb-*/cgroup.procs" for agent in agents for parent in ("", "*/")]  # v2, v1
    pids = {int(pid) for pattern in patterns for path in Path(CGROUP_ROOT).glob(pattern)
            for pid in _read_bytes(path).split()}
    if not any(b"venusrl.sandbox." not in _read_bytes(Path(f"/proc/{pid}/cmdline")) for pid in pids):
        return []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
    return sorted(pids)


def _read_bytes(path: Path) -> bytes:
    """The file's bytes, or none where it is gone (a sandbox or process ended meanwhile)."""
    try:
        return path.read_bytes()
    except OSError:
        return b""
