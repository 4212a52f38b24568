"""`venusrl train` turns bad input into an exit status 2 and a message naming the field."""

from __future__ import annotations

from typer.testing import CliRunner

from venusrl.cli import app


def test_train_without_a_model_path_names_the_key(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("data: {generate_train: 2, generate_eval: 0}\n")
    result = CliRunner().invoke(app, ["train", str(config), "--run-dir", str(tmp_path / "run"), "--no-progress"])
    assert result.exit_code == 2
    assert "model.path" in result.output


def test_train_with_a_malformed_config_names_the_key(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("trainer: {learning_rate: fast}\n")
    result = CliRunner().invoke(app, ["train", str(config)])
    assert result.exit_code == 2
    assert "trainer.learning_rate" in result.output


def test_train_with_a_dataset_row_missing_a_field_names_the_row(tiny_model_dir, tmp_path):
    rows = tmp_path / "train.jsonl"
    rows.write_text('{"id": "ok", "question": "Compute (1 + 1).", "answer": 2, "prompt": "Compute (1 + 1)."}\n'
                    '{"id": "broken", "prompt": "Compute (2 + 2)."}\n')
    config = tmp_path / "run.yaml"
    config.write_text(f"model: {{path: {tiny_model_dir}}}\ndata: {{train: {rows}, generate_eval: 0}}\n")
    result = CliRunner().invoke(app, ["train", str(config), "--run-dir", str(tmp_path / "run"), "--no-progress"])
    assert result.exit_code == 2
    assert "'broken'" in result.output and "answer" in result.output


def test_train_with_more_steps_than_the_data_gives_names_the_key(tiny_model_dir, tmp_path):
    """3 steps of 2 groups need 6 prompts; 4 prompts x 1 epoch would end the run after step 2."""
    config = tmp_path / "run.yaml"
    config.write_text(f"model: {{path: {tiny_model_dir}}}\ndata: {{generate_train: 4, generate_eval: 0}}\n"
                      "coordinator: {batch_groups: 2}\ntrainer: {steps: 3}\n")
    result = CliRunner().invoke(app, ["train", str(config), "--run-dir", str(tmp_path / "run"), "--no-progress"])
    assert result.exit_code == 2
    assert "trainer.steps" in result.output and "trainer.epochs" in result.output
    assert not (tmp_path / "run" / "checkpoints").exists()
