"""`venusrl bench trainer`: the tensor-memory count is exact on a known computation and the same
on the meta device; the chunked loss path peaks below a quarter of the full one and grows with
the chunk; the command runs a step end to end and names bad options."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from venusrl.bench.tensor_memory import TensorMemory
from venusrl.bench.trainer import SHAPES, StepCase, build_model, model_flops
from venusrl.cli import app


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_tensor_memory_counts_new_storages_while_they_live(device):
    weight = torch.zeros(10, 4, device=device)  # allocated outside: not counted (no grad: autograd keeps no `a`)
    with TensorMemory() as memory:
        a = torch.ones(100, 4, device=device)  # 1,600 bytes
        b = a @ weight.T  # 4,000
        view = b.view(-1)  # shares b's storage
        b.mul_(2)  # in place: nothing new
        assert memory.live_bytes == 5_600
        del a
        assert memory.live_bytes == 4_000
        c = b.exp()  # 4,000 more
        del b, view, c
    assert (memory.peak_bytes, memory.live_bytes) == (8_000, 0)  # b and c together


def test_the_step_case_parses_and_refuses_what_it_cannot_run():
    assert StepCase.parse("8x2048") == StepCase(8, 2048) and str(StepCase(8, 2048)) == "8x2048"
    for text in ("8", "8x1", "0x64", "ax64"):
        with pytest.raises(ValueError, match=text):
            StepCase.parse(text)


def test_model_flops_are_six_per_parameter_and_token_plus_attention():
    shape = SHAPES["tiny"]
    model = build_model(shape, torch.device("meta"))
    params = sum(p.numel() for p in model.parameters())
    case = StepCase(2, 10)
    attention = 6 * shape["layers"] * 10 ** 2 * shape["heads"] * shape["head_dim"]
    assert model_flops(shape, params, case) == 6 * params * 20 + 2 * attention


def test_bench_trainer_on_the_cpu(tmp_path):
    out = tmp_path / "trainer.json"
    result = CliRunner().invoke(app, [
        "bench", "trainer", "--device", "cpu", "--cases", "2x48", "--prompt-tokens", "16", "--steps", "1",
        "--loss-tokens", "512", "--loss-vocab", "6000", "--loss-hidden", "32", "--chunk-tokens", "64",
        "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    loss = report["loss_path"]
    assert loss["chunked_over_full"] < 0.25
    # the meta device counts what the CPU allocates, byte for byte
    check = loss["cross_check"]
    assert check["chunked_device"] == check["chunked_meta"] and check["full_device"] == check["full_meta"]
    paired = loss["seconds_paired"]
    assert len(paired["full_s"]) == len(paired["chunked_s"]) == 3 and min(paired["chunked_s"]) > 0
    # the chunked peak grows with the chunk, the full one with the tokens
    by_chunk, by_tokens = list(loss["chunked_peak_by_chunk"].values()), list(loss["full_peak_by_tokens"].values())
    assert by_chunk == sorted(by_chunk) and by_tokens == sorted(by_tokens)
    step = report["steps"]["2x48"]
    assert step["tokens"] == 96 and step["tokens_per_s"] > 0 and step["peak_memory_bytes"] > 0
    assert step["engine_weights_dtype"] == "torch.bfloat16" and "mfu" not in step  # no GPU, no peak to divide by


@pytest.mark.parametrize(("options", "named"), [
    (["--model-shape", "qwen3-9b"], "--model-shape"), (["--cases", "8by64"], "--cases"),
    (["--dtype", "float8"], "--dtype"),
])
def test_bad_options_are_named(options, named):
    result = CliRunner().invoke(app, ["bench", "trainer", *options])
    assert result.exit_code == 2 and named in result.output
