"""`venusrl train` with `engine.backend: vllm`: the local runtime's loop end to end on vLLM's
CPU build (the trainer pushes each step's weights into the running vLLM engine). Runs in the
vLLM venv (`make test-vllm`); skipped where vLLM is not installed."""

from __future__ import annotations

import logging
from collections import Counter

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed in this venv: `make test-vllm` runs these tests "
                                   "in .venv-vllm (built by `make vllm-venv`)")

from tests.runtime.test_train_local import all_prompts, run_config, trained_prompts  # noqa: E402

from venusrl.metrics.writer import read_metrics  # noqa: E402
from venusrl.model.tiny import make_tiny_model  # noqa: E402
from venusrl.runtime.local import train  # noqa: E402


def test_train_on_vllm_trains_each_prompt_once(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="venusrl.engine.vllm.backend")
    model_dir = make_tiny_model(tmp_path / "model", layers=2, hidden=128, heads=2, kv_heads=1, head_dim=64, seed=1)
    config = run_config(model_dir, engine={"backend": "vllm", "page_size": 32, "max_running_requests": 8},
                        trainer={"steps": 2, "keep_checkpoints": 1})
    summary = train(config, tmp_path / "run", progress=False)
    assert summary["steps"] == 2 and summary["weight_version"] == 2
    trained = trained_prompts(tmp_path / "run")
    assert len(trained) == 4 and set(trained.values()) == {1} and set(trained) <= set(all_prompts(config))
    kinds = Counter(r["kind"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl"))
    assert kinds["step"] == 2 and kinds["group"] == 4 and kinds["summary"] == 1
    events = [r.getMessage() for r in caplog.records if r.name == "venusrl.engine.vllm.backend"]
    assert any(m.startswith("vLLM engine started") for m in events), events
    assert any(m.startswith("weights updated to version 2") for m in events), events
