"""`make demo` must keep working: the demo's whole path (tiny model, SFT warm start, GRPO
with the venus scheduler, held-out evaluation) run small."""

import json
from pathlib import Path

from venusrl.config import load_config
from venusrl.demo import UNGRADED_ANSWER, demonstrations, run_demo
from venusrl.env.base import Episode
from venusrl.env.calculator import CalculatorEnv, demonstration, generate_dataset

DEMO_CONFIG = Path(__file__).resolve().parents[1] / "examples" / "demo.yaml"


def test_demo_config_runs_end_to_end_small(tmp_path):
    config = load_config(DEMO_CONFIG, [
        f"demo.workdir={tmp_path}", "demo.model_hidden=32", "demo.model_layers=1", "demo.sft_examples=8",
        "demo.sft_epochs=1", "data.generate_train=8", "data.generate_eval=4", "trainer.steps=2",
        "coordinator.group_size=2", "coordinator.batch_groups=2", "rollout.max_new_tokens_per_turn=16"])
    summary = run_demo(config, progress=False)
    assert summary["parity_max_abs_diff"] < 1e-4
    assert summary["steps"] == 2 and summary["scheduler"] == "venus"
    assert 0.0 <= summary["accuracy_before"] <= 1.0 and 0.0 <= summary["accuracy_after"] <= 1.0
    assert summary["wall_s"] >= summary["train_wall_s"] > 0
    run_dir = Path(summary["run_dir"])
    assert json.loads((run_dir / "summary.json").read_text()) == summary
    assert (tmp_path / "sft" / "model.safetensors").exists()


def test_the_grader_takes_the_graded_answer_form_only():
    """The demo's SFT data mixes both forms; RL has to learn the graded one from reward."""
    env = CalculatorEnv()
    for row in generate_dataset(20, seed=3):
        graded, ungraded = demonstration(row), demonstration(row, UNGRADED_ANSWER)
        assert graded[:-1] == ungraded[:-1]
        assert ungraded[-1]["content"] == f"The result is {row['answer']}."
        assert env.reward(Episode(row, graded, "done")) == 1.0
        assert env.reward(Episode(row, ungraded, "done")) == 0.0


def test_demo_demonstrations_end_ungraded_in_the_given_fraction():
    rows = generate_dataset(40, seed=4)
    endings = [c[-1]["content"] for c in demonstrations(rows, 0.25, seed=1)]
    assert sum(e.startswith("The result is") for e in endings) == 10
    assert sum(e.startswith("Answer: ") for e in endings) == 30
    assert demonstrations(rows, 0.25, seed=1) == demonstrations(rows, 0.25, seed=1)
