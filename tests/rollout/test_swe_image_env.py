"""swe-image: tasks whose repository is in an image; the agent loop (scripted, and on the
real tiny model) works in an image sandbox and the reward is a real pytest run there."""

from __future__ import annotations

import asyncio

import pytest
from tests.rollout.scripted import Scripted
from tests.rollout.test_swe_lite_env import call, fixed
from tests.sandbox.cluster_helpers import MiB, make_cluster

from venusrl.engine.async_engine import AsyncEngine
from venusrl.engine.config import EngineConfig
from venusrl.engine.engine import Engine
from venusrl.env.base import DatasetRowError
from venusrl.env.registry import environment_factory
from venusrl.env.swe_image import SweImageEnv, image_template
from venusrl.env.swe_lite import emit_images, generate_dataset
from venusrl.model.chat import load_tokenizer
from venusrl.rollout.agent_loop import run_agent_loop
from venusrl.rollout.config import RolloutConfig
from venusrl.rollout.generate import engine_generate
from venusrl.rollout.worker import create_sandbox
from venusrl.sandbox.image.store import ImageStore


@pytest.fixture(scope="module")
def swe_images(tmp_path_factory):
    """Two swe-lite repositories emitted as images into a fresh store."""
    store = tmp_path_factory.mktemp("swe-store")
    repositories = generate_dataset(2, seed=7)
    return str(store), emit_images(repositories, store), repositories


@pytest.fixture(scope="module")
def cluster(swe_images):
    c = make_cluster([1024 * MiB], image_store=swe_images[0])
    yield c
    c.close()


def test_emitted_images_share_their_base_layer(swe_images):
    store_path, rows, _ = swe_images
    store = ImageStore(store_path)
    records = [store.get(row["image"]) for row in rows]
    assert records[0].layers[0] == records[1].layers[0]  # one base: programs, Python, pytest
    assert records[0].layers[1] != records[1].layers[1]  # one repository layer each
    assert len(list(store.layers_dir.glob("*.json"))) == 3
    assert rows[0]["repo"] == records[0].working_dir == "/testbed"


def _episode(cluster, row, generate, tokenizer, config=None):
    env = SweImageEnv()

    async def main():
        sandbox = await create_sandbox(env, cluster.controller, group_id="g", row=row)  # the row picks the image
        try:
            rollout = await run_agent_loop(env, row, generate, tokenizer, config or RolloutConfig(), "swe-img-0",
                                           sandbox=sandbox)
            return rollout, cluster.controller.routes[sandbox.sandbox_id].template
        finally:
            await sandbox.kill()

    rollout, template = asyncio.run(main())
    assert template.image == row["image"]
    return env, rollout


@pytest.mark.parametrize("fixes", [True, False])
def test_scripted_agent_that_fixes_the_bug_in_the_image_is_rewarded(cluster, swe_images, tiny_model_dir, fixes):
    _, rows, repositories = swe_images
    tokenizer = load_tokenizer(tiny_model_dir)
    module = repositories[0]["files"]["utils.py"]
    model = Scripted(tokenizer, [(call("bash", cmd="ls; python3 --version"), True),
                                 (call("write_file", path="utils.py", content=fixed(module) if fixes else module), True),
                                 ("Fixed.", True)])
    env, rollout = _episode(cluster, rows[0], model, tokenizer)
    listing = next(m for m in rollout.messages if m["role"] == "tool")["content"]
    assert "test_utils.py" in listing and "Python 3" in listing
    assert rollout.reward == (1.0 if fixes else 0.0)
    assert ("3 passed" if fixes else "1 failed") in env.test_output


def test_tiny_model_through_the_agent_loop_gets_the_reward_pytest_gives(cluster, swe_images, tiny_model_dir):
    """The real tiny model cannot fix the bug: pytest really runs in the image and fails."""
    _, rows, _ = swe_images
    engine = Engine.from_pretrained(tiny_model_dir, EngineConfig(kv_capacity_tokens=8192, page_size=4))

    async def generate(ids, sampling, trajectory_id):
        async_engine = AsyncEngine(engine)
        try:
            return await engine_generate(async_engine)(ids, sampling, trajectory_id)
        finally:
            await async_engine.shutdown()

    config = RolloutConfig(max_turns=2, max_new_tokens_per_turn=24, temperature=0)
    env, rollout = _episode(cluster, rows[1], generate, engine.tokenizer, config)
    assert rollout.reward == 0.0
    assert "1 failed" in env.test_output and "2 passed" in env.test_output
    assert sum(rollout.generated_mask) > 0  # the model really generated


def test_rows_and_registry(swe_images):
    assert environment_factory("swe-image") is SweImageEnv
    with pytest.raises(DatasetRowError, match="image"):
        SweImageEnv().sandbox_template({"repo": "/testbed", "prompt": "x", "test_command": "true"})
    assert image_template("swe-lite/a:latest").name != image_template("swe-lite/a:v2").name
    assert image_template("x" * 300).name.startswith("img-x")


def test_venusrl_train_runs_on_swe_image_rows(swe_images, tiny_model_dir, tmp_path):
    """The whole loop: generated rows name images, every trajectory runs in an image
    sandbox, pytest there gives the reward, the trainer steps."""
    from tests.runtime.test_train_local import run_config

    from venusrl.metrics.writer import read_metrics
    from venusrl.runtime.local import train

    store = swe_images[0]
    config = run_config(tiny_model_dir, rollout={"environment": "swe-image", "max_turns": 1, "max_new_tokens_per_turn": 8},
                        coordinator={"group_size": 2, "batch_groups": 1}, trainer={"steps": 1},
                        sandbox={"image_store": store, "memory_limit": 256 * MiB},
                        data={"generate_train": 2, "generate_eval": 0, "generate_options": {"image_store": store}})
    summary = train(config, tmp_path, progress=False)
    assert summary["steps"] == 1
    rewards = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r.get("kind") == "step"]
    assert rewards and all(r["reward_mean"] == 0.0 for r in rewards)  # the untrained model fixes nothing
