"""The `venusrl` command end to end, through its console entry point."""

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from venusrl.cli import app

runner = CliRunner()


def test_make_tiny_then_generate(tmp_path):
    result = runner.invoke(app, ["model", "make-tiny", str(tmp_path / "m"), "--layers", "1", "--no-tied", "--seed", "2"])
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["num_hidden_layers"] == 1 and config["tie_word_embeddings"] is False
    result = runner.invoke(app, ["model", "generate", "--model", str(tmp_path / "m"), "--prompt", "hi",
                                 "--max-new-tokens", "8"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout[result.stdout.index("{"):])
    assert out["completion_tokens"] == 8 and out["finish_reason"] == "length"


def test_make_tiny_rejects_bad_shape(tmp_path):
    result = runner.invoke(app, ["model", "make-tiny", str(tmp_path / "m"), "--heads", "3"])
    assert result.exit_code == 2
    assert "must divide" in result.output


def test_config_show_resolves_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("run:\n  name: exp\n")
    result = runner.invoke(app, ["config", "show", str(path), "engine.page_size=8"])
    assert result.exit_code == 0, result.output
    assert "page_size: 8" in result.stdout and "name: exp" in result.stdout


def test_config_show_reports_the_bad_key(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("engine:\n  page_sise: 8\n")
    result = runner.invoke(app, ["config", "show", str(path)])
    assert result.exit_code == 2
    assert "engine.page_sise: unknown key" in result.output


def test_console_script_and_module_entry_point():
    script = Path(sys.executable).parent / "venusrl"
    for command in ([str(script), "--help"], [sys.executable, "-m", "venusrl", "--help"]):
        out = subprocess.run(command, capture_output=True, text=True)
        assert out.returncode == 0 and "model" in out.stdout


def test_bench_rollout_refuses_case_overrides_outside_the_timed_table():
    for extra in (["--sweep"], ["--greedy-check"]):
        result = runner.invoke(app, ["bench", "rollout", "--slots-per-engine", "1", *extra])
        said = " ".join(result.output.replace("│", " ").split())  # the error box wraps its lines
        assert result.exit_code == 2 and "case overrides apply to the timed table" in said, result.output
    result = runner.invoke(app, ["bench", "rollout", "--slots-per-engine", "0"])
    assert result.exit_code == 2 and "slots-per-engine" in result.output
    result = runner.invoke(app, ["bench", "rollout", "--test-log-lines", "-1"])
    assert result.exit_code == 2 and "test-log-lines" in result.output
    result = runner.invoke(app, ["bench", "rollout", "--tool-latency-s", "-0.1"])
    assert result.exit_code == 2 and "tool-latency-s" in result.output


def test_bench_rollout_names_the_engine_backend_it_does_not_know():
    result = runner.invoke(app, ["bench", "rollout", "--engine-backend", "sglang"])
    assert result.exit_code == 2 and "choose ours or vllm" in result.output
