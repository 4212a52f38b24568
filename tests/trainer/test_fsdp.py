"""The FSDP2 trainer, two ranks on the CPU over gloo: a step equals the single-process
streaming trainer's step (weights, stats, checkpoint), and a rank that dies is named."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from functools import partial
from types import SimpleNamespace

import pytest
import torch
import transformers
from tests.trainer.test_streaming import _group

from venusrl.config import validate_config
from venusrl.model.tiny import make_tiny_model
from venusrl.runtime.trainer_service import TrainerService, load_policy
from venusrl.trainer.checkpoint import save_policy
from venusrl.trainer.fsdp import ShardedTrainer
from venusrl.trainer.streaming import StreamingTrainer

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("fsdp-tiny"), layers=2, hidden=64, seed=3)


def _config(model_dir):
    return validate_config({"model": {"path": str(model_dir), "dtype": "float32"},
                            "trainer": {"learning_rate": 1e-2, "micro_batch_tokens": 64, "world_size": 2}})


def _groups(model_dir):
    """With micro_batch_tokens=64, in group 0 rank 0 has two passes and rank 1 one; in group 1
    rank 0's pass shares the prompt and rank 1's single row does not; group 2 has no signal."""
    behaviour = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return [_group(behaviour, 0, [1.0, 0.0, 0.0, 1.0, 0.5], seed=10), _group(behaviour, 1, [0.0, 0.5, 1.0], seed=11),
            _group(behaviour, 2, [1.0, 1.0], seed=12)]


@pytest.fixture(scope="module")
def runs(model_dir, tmp_path_factory):
    """The same groups and one step, on the single-process trainer and on two FSDP ranks
    (through TrainerService, as a run builds them)."""
    config, groups = _config(model_dir), _groups(model_dir)
    single = StreamingTrainer(load_policy(config, model_dir, CPU)[0], config.trainer)
    single_groups = [single.accumulate(g) for g in groups]
    single_step = single.step()
    service = TrainerService(config, model_dir)
    try:
        sharded_groups = [asyncio.run(service.accumulate(g)) for g in groups]
        sharded_step = asyncio.run(service.step())
        weights = asyncio.run(service.weights())
        checkpoint = tmp_path_factory.mktemp("fsdp-checkpoint")
        asyncio.run(service.save(checkpoint))
    finally:
        service.trainer.close()
    return SimpleNamespace(single=single, single_groups=single_groups, single_step=single_step,
                           sharded_groups=sharded_groups, sharded_step=sharded_step, weights=weights,
                           checkpoint=checkpoint)


def test_a_sharded_step_equals_the_single_process_step(runs):
    for single, sharded in zip(runs.single_groups, runs.sharded_groups, strict=True):
        assert (sharded.tokens, sharded.skipped, sharded.stats.tokens) == (single.tokens, single.skipped, single.stats.tokens)
        assert sharded.loss_sum == pytest.approx(single.loss_sum, rel=1e-5, abs=1e-6)
    one, two = runs.single_step, runs.sharded_step
    assert (two.version, two.groups, two.trajectories, two.tokens, two.skipped_groups) == (
        one.version, one.groups, one.trajectories, one.tokens, one.skipped_groups)
    assert two.loss == pytest.approx(one.loss, rel=1e-5, abs=1e-7)
    assert two.grad_norm == pytest.approx(one.grad_norm, rel=1e-5) and one.grad_norm > 0
    assert two.stats == pytest.approx(one.stats, rel=1e-5)
    # Adam's first update is about lr·sign(g), so an element whose gradient is float noise may
    # move by up to 2·lr = 2e-2 either way; 1e-4 still catches a wrong weight anywhere. The
    # gradients themselves are compared tightly through the checkpoint's exp_avg below.
    expected = runs.single.engine_weights()
    for name, tensor in runs.weights.items():
        torch.testing.assert_close(tensor, expected[name], atol=1e-4, rtol=0, msg=name)


def test_engine_weights_have_the_single_process_names_and_shapes(runs):
    expected = runs.single.engine_weights()
    assert {n: t.shape for n, t in runs.weights.items()} == {n: t.shape for n, t in expected.items()}
    assert all(t.device == CPU for t in runs.weights.values())


def test_a_sharded_checkpoint_is_the_single_process_checkpoint(runs):
    saved = transformers.AutoModelForCausalLM.from_pretrained(runs.checkpoint / "model", dtype=torch.float32)
    assert saved.state_dict().keys() == runs.weights.keys()
    for name, tensor in runs.weights.items():
        assert torch.equal(saved.state_dict()[name], tensor), name
    assert (runs.checkpoint / "model" / "tokenizer.json").exists()
    optimizer = torch.load(runs.checkpoint / "optimizer.pt", weights_only=True)
    expected = runs.single.optimizer.state_dict()
    assert optimizer["param_groups"] == expected["param_groups"]
    assert optimizer["state"].keys() == expected["state"].keys()
    for index, state in expected["state"].items():  # exp_avg = (1 − β1)·g: the step's gradient
        assert optimizer["state"][index].keys() == state.keys()
        torch.testing.assert_close(optimizer["state"][index]["step"], state["step"])
        torch.testing.assert_close(optimizer["state"][index]["exp_avg"], state["exp_avg"], atol=1e-9, rtol=1e-4)
        torch.testing.assert_close(optimizer["state"][index]["exp_avg_sq"], state["exp_avg_sq"], atol=1e-15, rtol=1e-3)


def test_a_single_process_checkpoint_resumes_on_two_ranks(model_dir, tmp_path):
    config, groups = _config(model_dir), _groups(model_dir)
    single = StreamingTrainer(load_policy(config, model_dir, CPU)[0], config.trainer)
    single.accumulate(groups[0])
    single.step()
    save_policy(tmp_path, single.model, model_dir, single.optimizer)
    single.accumulate(groups[1])
    expected = single.step()
    trainer = ShardedTrainer(2, partial(load_policy, config, tmp_path / "model"), config.trainer, version=1,
                             optimizer_state=tmp_path / "optimizer.pt")
    try:
        trainer.accumulate(groups[1])
        result = trainer.step()
        weights = trainer.engine_weights()
    finally:
        trainer.close()
    assert result.version == 2 and result.grad_norm == pytest.approx(expected.grad_norm, rel=1e-5)
    # without the optimizer state the second update would be a first one, about lr·sign(g)
    for name, tensor in single.engine_weights().items():
        torch.testing.assert_close(weights[name], tensor, atol=1e-4, rtol=0, msg=name)


def test_a_killed_rank_is_named_within_the_timeout(model_dir):
    config, timeout = _config(model_dir), 30.0
    config.trainer.collective_timeout_s = timeout
    group = _groups(model_dir)[0]
    trainer = ShardedTrainer(2, partial(load_policy, config, model_dir), config.trainer)
    failure: list[BaseException] = []
    groups_in = threading.Semaphore(0)

    def train() -> None:
        try:
            while True:
                trainer.accumulate(group)
                groups_in.release()
        except Exception as err:
            failure.append(err)
            groups_in.release()

    thread = threading.Thread(target=train, daemon=True)
    thread.start()
    for _ in range(2):  # two groups in; the loop is then inside the third call when the rank is killed
        assert groups_in.acquire(timeout=120) and not failure, failure
    pid = trainer.worker_pids[0]
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    thread.join(timeout + 10)
    assert not thread.is_alive(), "rank 0 hangs on a dead rank"
    assert time.monotonic() - killed < timeout
    assert isinstance(failure[0], RuntimeError)
    assert f"rank 1 (pid {pid}, exit code -9) died" in str(failure[0])
    with pytest.raises(RuntimeError, match="stopped"):
        trainer.step()


def test_sharded_ranks_with_checkpointed_layers_and_packed_rows_step_as_one_process(model_dir):
    """Layers recomputed in backward (inside FSDP2's hooks) and packed rows (no prefix sharing
    then) give the plain single-process step; the idle passes of a rank with no rows left too."""
    config = _config(model_dir)
    config.trainer.activation_checkpointing = True
    config.trainer.pack_rows = "on"
    groups = _groups(model_dir)
    single = StreamingTrainer(load_policy(_config(model_dir), model_dir, CPU)[0], _config(model_dir).trainer)
    for group in groups:
        single.accumulate(group)
    expected = single.step()
    trainer = ShardedTrainer(2, partial(load_policy, config, model_dir), config.trainer)
    try:
        for group in groups:
            trainer.accumulate(group)
        result = trainer.step()
        weights = trainer.engine_weights()
    finally:
        trainer.close()
    assert result.loss == pytest.approx(expected.loss, rel=1e-5, abs=1e-7)
    assert result.grad_norm == pytest.approx(expected.grad_norm, rel=1e-5)
    for name, tensor in single.engine_weights().items():
        torch.testing.assert_close(weights[name], tensor, atol=1e-4, rtol=0, msg=name)
