"""`venusrl train` on a model directory with the official Qwen3 tokenizer and chat template:
multi-turn trajectories (thinking, a tool call, its result, a follow-up user turn) roll out,
train and checkpoint."""

import yaml
from typer.testing import CliRunner

from venusrl.cli import app
from venusrl.metrics.writer import read_metrics


def test_venusrl_train_runs_multi_turn_on_a_qwen3_directory(qwen3_tool_model_dir, tmp_path):
    config = {
        "model": {"path": str(qwen3_tool_model_dir)},
        "coordinator": {"group_size": 2, "batch_groups": 1, "async_factor": 1.0, "max_version_span": 1},
        "predictor": {"kind": "group_history"},
        "rollout": {"environment": "tests.runtime.qwen3_env:ThinkThenAddEnv", "max_turns": 3,
                    "max_new_tokens_per_turn": 40, "max_total_tokens": 1024, "temperature": 0},
        "engine": {"kv_capacity_tokens": 8192, "page_size": 16},
        "scheduler": {"slots_per_engine": 2},
        "trainer": {"learning_rate": 1e-5, "steps": 2},
        "data": {"generate_train": 2, "generate_eval": 0},
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    result = CliRunner().invoke(app, ["train", str(path), "--run-dir", str(tmp_path / "run"), "--no-progress"])
    assert result.exit_code == 0, result.output
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    groups = [r for r in records if r["kind"] == "group"]
    assert len([r for r in records if r["kind"] == "step"]) == 2 and len(groups) == 2
    # reward 1 means the model's call ran and its result came back: every trajectory went on
    # past its first turn (then the follow-up user turn)
    assert all(g["reward_mean"] == 1.0 for g in groups)
    finished = [line for line in (tmp_path / "run" / "train.log").read_text().splitlines() if " finished (" in line]
    assert len(finished) == 4 and all("finished (done): 3 turns" in line for line in finished)  # call, answer, follow-up
    assert (tmp_path / "run" / "checkpoints").is_dir()
