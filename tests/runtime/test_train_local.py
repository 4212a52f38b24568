"""`venusrl train` on the local runtime: the loop end to end, checkpoints and resume, and
faults (an engine request, a sandbox, a node agent, the whole trainer process killed
mid-run). In every case the run finishes and every prompt is trained exactly once."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import yaml
from tests.sandbox.cluster_helpers import MiB

from venusrl.config import Config, validate_config
from venusrl.metrics.writer import read_metrics
from venusrl.runtime.ledger import TrainedLedger
from venusrl.runtime.local import build, train


def run_config(model_dir: Path, **sections) -> Config:
    data = {
        "model": {"path": str(model_dir)},
        "coordinator": {"group_size": 3, "batch_groups": 2, "async_factor": 1.5, "max_version_span": 2},
        "predictor": {"kind": "group_history"},
        "rollout": {"environment": "calculator", "max_turns": 2, "max_new_tokens_per_turn": 12, "max_total_tokens": 1024},
        "engine": {"kv_capacity_tokens": 16384, "page_size": 16},
        "scheduler": {"slots_per_engine": 4},
        "trainer": {"learning_rate": 1e-4},
        "data": {"generate_train": 8, "generate_eval": 2},
    }
    for section, values in sections.items():
        data[section] = {**data.get(section, {}), **values}
    return validate_config(data)


def trained_prompts(run_dir: Path) -> Counter:
    entries = TrainedLedger(run_dir / "trained.jsonl").entries()
    assert [e["step"] for e in entries] == list(range(1, len(entries) + 1))
    return Counter(p for e in entries for p in e["prompt_ids"])


def all_prompts(config: Config) -> Counter:
    return Counter(f"calc-{config.data.generate_seed}-{i}" for i in range(config.data.generate_train))


def test_train_then_resume_trains_each_prompt_once(tiny_model_dir, tmp_path):
    config = run_config(tiny_model_dir, trainer={"steps": 2, "keep_checkpoints": 1})
    summary = train(config, tmp_path, progress=False)
    assert summary["steps"] == 2 and summary["weight_version"] == 2
    assert 0.0 <= summary["accuracy_before"] <= 1.0 and 0.0 <= summary["accuracy_after"] <= 1.0
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-000002"]
    records = read_metrics(tmp_path / "metrics.jsonl")
    kinds = Counter(r["kind"] for r in records)
    assert kinds["step"] == 2 and kinds["group"] == 4 and kinds["eval"] == 2 and kinds["summary"] == 1
    step = next(r for r in records if r["kind"] == "step")
    assert {"reward_mean", "tokens_per_s", "kv_hit_rate", "grad_norm", "groups_ready"} <= step.keys()
    group = next(r for r in records if r["kind"] == "group")  # the fidelity report pairs spans with lengths
    assert len(group["trajectory_tokens"]) == len(group["version_spans"]) and min(group["trajectory_tokens"]) > 0
    assert isinstance(summary["stale_discard_tokens"], list)

    resumed = train(run_config(tiny_model_dir, trainer={"steps": None}), tmp_path, progress=False)
    assert resumed["steps"] == 4  # 8 prompts / B=2, two of the steps done before
    assert trained_prompts(tmp_path) == all_prompts(config)
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == 4


def test_killed_trainer_process_resumes_and_trains_every_prompt_once(tiny_model_dir, tmp_path):
    config = run_config(tiny_model_dir, data={"generate_train": 12})
    config_path = tmp_path / "run.yaml"
    config_path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "venusrl", "train", str(config_path), "--run-dir", str(run_dir), "--no-progress"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not (run_dir / "checkpoints" / "step-000002").exists():
            assert process.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
    finally:
        process.wait()
    finished = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stderr[-2000:]
    assert trained_prompts(run_dir) == all_prompts(config)
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 6


async def _run_with(config: Config, run_dir: Path, saboteur) -> dict:
    driver = await build(config, run_dir, progress=False)
    try:
        sabotage = asyncio.create_task(saboteur(driver.rollout))
        summary = await driver.run()
        sabotage.cancel()
        return summary
    finally:
        await driver.rollout.close()


def test_aborted_engine_requests_resume_and_the_run_loses_nothing(tiny_model_dir, tmp_path):
    aborted = []

    async def abort_requests(rollout) -> None:
        rng = random.Random(0)
        while True:
            await asyncio.sleep(0.05)

            engine = rollout.async_engines[0]
            running = sorted(await engine.acall(lambda e: e.request_ids()))
            if running:
                output = await asyncio.wrap_future(engine.abort(rng.choice(running)))
                if output is not None:
                    aborted.append(output.finish_reason)

    config = run_config(tiny_model_dir, rollout={"max_new_tokens_per_turn": 24})
    summary = asyncio.run(_run_with(config, tmp_path, abort_requests))
    assert aborted and set(aborted) == {"abort"}
    assert summary["steps"] == 4
    assert trained_prompts(tmp_path) == all_prompts(config)


def test_killed_sandboxes_and_node_agent_lose_no_prompt(tiny_model_dir, tmp_path):
    killed = {"sandboxes": 0, "node": None}

    async def kill_sandboxes_then_a_node(rollout) -> None:
        controller = rollout.cluster.controller
        while killed["sandboxes"] < 2:
            await asyncio.sleep(0.2)
            live = sorted(controller.routes)
            if live:
                await asyncio.to_thread(controller.kill, live[0])
                killed["sandboxes"] += 1
        while killed["node"] is None:
            await asyncio.sleep(0.2)
            busy = {route.node_id for route in controller.routes.values()}
            if busy:
                killed["node"] = sorted(busy)[0]
                await asyncio.to_thread(rollout.cluster.kill_node, killed["node"])

    config = run_config(
        tiny_model_dir,
        rollout={"environment": "tests.runtime.sandbox_env:SandboxTurnsEnv"},
        # a trajectory on the killed node fails until its sandbox is recovered; each failure
        # is a re-run, and the group may not run out of them
        coordinator={"max_reruns": 20},
        sandbox={"nodes": 2, "node_memory": 512 * MiB, "cold_start_default": 16 * MiB, "oom_grace_s": 20.0},
        data={"generate_train": 6, "generate_eval": 0})
    summary = asyncio.run(_run_with(config, tmp_path, kill_sandboxes_then_a_node))
    assert killed["sandboxes"] == 2 and killed["node"] is not None
    assert summary["groups_dropped"] == 0, summary
    assert summary["steps"] == 3 and summary["accuracy_before"] is None
    assert trained_prompts(tmp_path) == Counter(f"s0-{i}" for i in range(6))


def test_bad_dataset_row_stops_the_run_before_any_work(tiny_model_dir, tmp_path):
    rows = tmp_path / "train.jsonl"
    rows.write_text('{"prompt": "Compute 1 + 1.", "answer": 2, "question": "Compute 1 + 1."}\n{"prompt": "no answer"}\n')
    config = run_config(tiny_model_dir, data={"train": str(rows)})
    try:
        train(config, tmp_path / "run", progress=False)
    except ValueError as err:
        assert "prompt '2'" in str(err) and "answer" in str(err)
    else:
        raise AssertionError("a row without 'answer' was accepted")
    assert not (tmp_path / "run" / "checkpoints").exists()
