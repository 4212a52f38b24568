"""`venusrl bench engine --backends`: a bad backend name is refused before anything runs."""

from typer.testing import CliRunner

from venusrl.bench.engine_backends import parse_backends
from venusrl.cli import app


def test_unknown_backend_is_refused_naming_the_option():
    result = CliRunner().invoke(app, ["bench", "engine", "--backends", "ours,sglang"])
    assert result.exit_code == 2
    assert "--backends: sglang not among ours, vllm, hf" in result.output


def test_backends_parse_in_order():
    assert parse_backends(" vllm, ours ,hf") == ["vllm", "ours", "hf"]
