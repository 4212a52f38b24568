"""`engine.placement: process` on the embedded runtime: each rollout engine is its own OS
process, the run trains each prompt it takes once, and the greedy held-out accuracy it reports for
the initial weights is the one in-process engines give."""

import asyncio
import logging

from tests.runtime.test_train_local import (
    all_prompts,
    held_out_accuracy,
    run_config,
    trained_prompts,
)

from venusrl.runtime.local import train


def test_a_run_with_engines_in_their_own_processes_trains_like_in_process(tiny_model_dir, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="venusrl.engine.remote.remote")
    config = run_config(tiny_model_dir, trainer={"steps": 2}, engine={"placement": "process"},
                        scheduler={"engines": 2})

    summary = train(config, tmp_path, progress=False)

    assert summary["steps"] == 2 and summary["weight_version"] == 2
    trained = trained_prompts(tmp_path)
    assert len(trained) == 4 and set(trained.values()) == {1} and set(trained) <= set(all_prompts(config))
    ready = [r.getMessage() for r in caplog.records if " ready at " in r.getMessage()]
    assert len(ready) == 2 and len({m.split("pid ")[1] for m in ready}) == 2, "two engine processes handshook"
    in_process = run_config(tiny_model_dir, trainer={"steps": 2}, scheduler={"engines": 2})
    assert summary["accuracy_before"] == asyncio.run(held_out_accuracy(in_process, tiny_model_dir))
