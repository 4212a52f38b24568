"""`venusrl predictor synth|train|eval`."""

import json

import pytest
from typer.testing import CliRunner

from venusrl.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("pred") / "ex.jsonl"
    result = runner.invoke(app, ["predictor", "synth", str(path), "--prompts", "25", "--group-size", "3"])
    assert result.exit_code == 0, result.output
    return path


@pytest.mark.parametrize(("kind", "name"), [("group_history", "gh.json"), ("learned", "m.safetensors")])
def test_train_then_eval(data, tmp_path, kind, name):
    model = tmp_path / name
    result = runner.invoke(app, ["predictor", "train", str(data), "--out", str(model), "--kind", kind, "--iterations", "40"])
    assert result.exit_code == 0, result.output
    out = tmp_path / "eval.json"
    result = runner.invoke(app, ["predictor", "eval", str(data), "--path", str(model), "--kind", kind, "--json", str(out)])
    assert result.exit_code == 0, result.output
    figures = json.loads(out.read_text())
    assert figures["examples"] == len(data.read_text().splitlines())
    assert figures["spearman"] > 0.5


def test_malformed_rows_and_bad_kind_exit_2_with_the_reason(data, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(data.read_text().splitlines()[0] + "\n" + '{"messages": [], "remaining_tokens": 1}\n')
    result = runner.invoke(app, ["predictor", "train", str(bad), "--out", str(tmp_path / "x.safetensors")])
    assert result.exit_code == 2
    assert "bad.jsonl:2: field 'messages' must be a non-empty list" in result.output
    result = runner.invoke(app, ["predictor", "train", str(data), "--out", str(tmp_path / "x"), "--kind", "magic"])
    assert result.exit_code == 2 and "kind" in result.output
