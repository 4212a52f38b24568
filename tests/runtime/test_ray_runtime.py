"""`run.runtime: ray` on a one-node Ray instance the test starts: the rollout and trainer actors
train, checkpoint and resume like the local runtime; sandbox node agents run as actors."""

import json
import logging
import os
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from venusrl.config import Config, validate_config  # noqa: E402
from venusrl.env.python_exec import generate_dataset  # noqa: E402
from venusrl.runtime.ray_runtime import train  # noqa: E402
from venusrl.sandbox.cgroups import CGROUP_ROOT  # noqa: E402


def make_config(model_dir: Path, steps: int, **sections) -> Config:
    data = {
        "model": {"path": str(model_dir)},
        "run": {"runtime": "ray"},
        "coordinator": {"group_size": 4, "batch_groups": 2, "async_factor": 1.5},
        "predictor": {"kind": "group_history"},
        "rollout": {"environment": "calculator", "max_turns": 3, "max_new_tokens_per_turn": 24, "max_total_tokens": 1024},
        "engine": {"kv_capacity_tokens": 32768, "page_size": 16},
        "scheduler": {"slots_per_engine": 8},
        "trainer": {"steps": steps, "learning_rate": 1.0e-4},
        "data": {"generate_train": 12, "generate_eval": 4},
    }
    for section, values in sections.items():
        data[section] = {**data.get(section, {}), **values}
    return validate_config(data)


def trained_lines(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "trained.jsonl").read_text().splitlines()]


def actor_placement(caplog) -> dict:
    return next(r.args for r in caplog.records if r.msg == "ray actors: %s")  # a lone dict argument is args


def test_trains_in_actors_and_resumes_from_the_checkpoint(ray_on_loopback, tiny_model_dir, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="venusrl.runtime.ray_runtime")
    run_dir = tmp_path / "run"

    first = train(make_config(tiny_model_dir, steps=2), run_dir, progress=False)

    assert first["steps"] == 2 and first["weight_version"] == 2 and first["groups_trained"] == 4
    assert (run_dir / "checkpoints" / "step-000002").is_dir()
    where = actor_placement(caplog)
    assert len({os.getpid(), where["rollout"]["pid"], where["trainer"]["pid"]}) == 3
    assert ray.is_initialized()  # Ray started by the caller is left running
    caplog.clear()

    second = train(make_config(tiny_model_dir, steps=3), run_dir, progress=False)

    assert second["steps"] == 3 and second["weight_version"] == 3
    lines = trained_lines(run_dir)
    assert [line["step"] for line in lines] == [1, 2, 3]
    prompt_ids = [pid for line in lines for pid in line["prompt_ids"]]
    assert len(prompt_ids) == 6 and len(set(prompt_ids)) == 6
    assert actor_placement(caplog)["rollout"]["pid"] != where["rollout"]["pid"]  # fresh actors, same run


def test_an_error_in_an_actor_reaches_the_caller_as_itself(ray_on_loopback, tmp_path):
    not_a_model = tmp_path / "empty"
    not_a_model.mkdir()

    with pytest.raises(ValueError, match="config.json: not found"):
        train(make_config(not_a_model, steps=1), tmp_path / "run", progress=False)


def write_python_rows(path: Path, count: int, seed: int) -> str:
    # `messages` for the dataset reader, `prompt` for PythonEnv, which reads it from the row
    with path.open("w") as out:
        for row in generate_dataset(count, seed=seed):
            out.write(json.dumps({**row, "messages": [{"role": "user", "content": row["prompt"]}]}) + "\n")
    return str(path)


@pytest.mark.skipif(os.geteuid() != 0 or not Path(CGROUP_ROOT).exists(), reason="sandboxes need root and cgroups")
def test_python_environment_runs_sandboxes_on_node_agent_actors(ray_on_loopback, tiny_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    config = make_config(
        tiny_model_dir, steps=1,
        rollout={"environment": "python"}, sandbox={"memory_limit": "64MiB"},
        data={"train": write_python_rows(tmp_path / "train.jsonl", 4, 0),
              "eval": write_python_rows(tmp_path / "eval.jsonl", 2, 1)})

    summary = train(config, run_dir, progress=False)

    assert summary["steps"] == 1 and summary["trajectories_discarded"] == 0
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    samples = [r for r in records if r["kind"] == "sandbox"]
    assert samples and all(s["node"] == "node-0" for s in samples)
    assert "sandbox node agent node-0" in (run_dir / "train.log").read_text()
