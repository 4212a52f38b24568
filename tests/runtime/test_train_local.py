"""`venusrl train` on the local runtime: the loop end to end, checkpoints and resume, and
faults (an engine request, a sandbox, a node agent, the whole trainer process killed
mid-run). In every case the run finishes and every prompt is trained exactly once."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import shutil
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
from venusrl.runtime.data import load_prompts
from venusrl.runtime.ledger import TrainedLedger
from venusrl.runtime.local import build, train
from venusrl.runtime.rollout_service import RolloutService


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


async def held_out_accuracy(config: Config, model_dir: Path) -> float:
    """The held-out accuracy of the weights in `model_dir`, evaluated on its own (greedy, so
    it must equal what the run reported for the same weights)."""
    prompts = load_prompts(config.data, config.rollout.environment, "eval")
    service = RolloutService(config, model_dir, iter(()))
    try:
        return await service.evaluate(prompts)
    finally:
        await service.close()


def test_train_then_resume_trains_each_prompt_once(tiny_model_dir, tmp_path):
    config = run_config(tiny_model_dir, trainer={"steps": 2, "keep_checkpoints": 1})
    summary = train(config, tmp_path, progress=False)
    assert summary["steps"] == 2 and summary["weight_version"] == 2
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-000002"]
    records = read_metrics(tmp_path / "metrics.jsonl")
    kinds = Counter(r["kind"] for r in records)
    assert kinds["step"] == 2 and kinds["group"] == 4 and kinds["eval"] == 2 and kinds["summary"] == 1
    # the accuracies reported are those of the initial and the trained weights
    assert [r["accuracy"] for r in records if r["kind"] == "eval"] == [summary["accuracy_before"],
                                                                      summary["accuracy_after"]]
    assert summary["accuracy_before"] == asyncio.run(held_out_accuracy(config, tiny_model_dir))
    trained_weights = tmp_path / "checkpoints" / "step-000002" / "model"
    assert summary["accuracy_after"] == asyncio.run(held_out_accuracy(config, trained_weights))
    step = next(r for r in records if r["kind"] == "step")
    assert {"reward_mean", "tokens_per_s", "kv_hit_rate", "grad_norm", "groups_ready", "engine_restarts",
            "engine_live_trajectories", "engine_memory_stalls", "moves_by_reason", "moves_unlanded",
            "room_readings"} <= step.keys()
    assert set(step["engine_memory_stalls"]) == {"promoted", "high", "low"}
    assert summary["engine_restarts"] == 0
    group = next(r for r in records if r["kind"] == "group")  # the fidelity report pairs spans with lengths
    assert len(group["trajectory_tokens"]) == len(group["version_spans"]) and min(group["trajectory_tokens"]) > 0
    assert isinstance(summary["stale_discard_tokens"], list)

    resumed = train(run_config(tiny_model_dir, trainer={"steps": None}), tmp_path, progress=False)
    assert resumed["steps"] == 4  # 8 prompts / B=2, two of the steps done before
    assert trained_prompts(tmp_path) == all_prompts(config)
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == 4


TRAIN_ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def train_command(config: Config, tmp_path: Path) -> tuple[list[str], Path]:
    config_path = tmp_path / "run.yaml"
    config_path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    run_dir = tmp_path / "run"
    return [sys.executable, "-m", "venusrl", "train", str(config_path), "--run-dir", str(run_dir), "--no-progress"], run_dir


def kill_once_checkpointed(command: list[str], run_dir: Path, step: int) -> None:
    """Run `venusrl train` in its own process and SIGKILL it once checkpoint `step` is in place
    (polling the run directory: a file appearing is the event, there is no signal to wait on)."""
    process = subprocess.Popen(command, env=TRAIN_ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not (run_dir / "checkpoints" / f"step-{step:06d}").exists():
            assert process.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
    finally:
        process.wait()


def test_killed_trainer_process_resumes_and_trains_every_prompt_once(tiny_model_dir, tmp_path):
    config = run_config(tiny_model_dir, data={"generate_train": 12})
    command, run_dir = train_command(config, tmp_path)
    kill_once_checkpointed(command, run_dir, step=2)
    finished = subprocess.run(command, env=TRAIN_ENV, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stderr[-2000:]
    assert trained_prompts(run_dir) == all_prompts(config)
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 6


def corrupt(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncate":
        path.write_bytes(data[: len(data) // 2])
    else:  # one byte flipped in the middle: same size, wrong checksum
        middle = len(data) // 2
        path.write_bytes(data[:middle] + bytes([data[middle] ^ 0x5A]) + data[middle + 1 :])


def test_a_corrupt_newest_checkpoint_resumes_from_the_previous_one(tiny_model_dir, tmp_path, caplog):
    """Killed after checkpoint 3; each file of checkpoint 3 corrupted in turn (truncated or a
    byte flipped), the resume skips it with one line naming the file and goes on from
    checkpoint 2, and every prompt is trained exactly once."""
    config = run_config(tiny_model_dir, data={"generate_train": 12, "generate_eval": 0},
                        trainer={"keep_checkpoints": 2})
    command, killed = train_command(config, tmp_path)
    kill_once_checkpointed(command, killed, step=3)
    checkpoints = sorted(p.name for p in (killed / "checkpoints").iterdir() if p.name.startswith("step-"))
    newest, previous = checkpoints[-1], checkpoints[-2]
    files = sorted(p.relative_to(killed / "checkpoints" / newest).as_posix()
                   for p in (killed / "checkpoints" / newest).rglob("*") if p.is_file())
    assert {"manifest.json", "state.json", "coordinator.json", "optimizer.pt", "model/config.json",
            "model/model.safetensors"} <= set(files)
    for index, name in enumerate(files):
        run_dir = tmp_path / f"resume-{index}"
        shutil.copytree(killed, run_dir)
        corrupt(run_dir / "checkpoints" / newest / name, "truncate" if index % 2 else "flip")
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="venusrl.trainer.checkpoint"):
            summary = train(config, run_dir, progress=False)
        skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
        assert len(skipped) == 1 and skipped[0].startswith(f"resuming from {previous}; skipped {newest}")
        assert name in skipped[0], skipped[0]
        assert summary["steps"] == 6, name
        assert trained_prompts(run_dir) == all_prompts(config), name


def test_a_run_killed_before_its_first_checkpoint_starts_over_with_a_clean_ledger(tiny_model_dir, tmp_path):
    """The ledger had a step but no checkpoint was written: the run starts from the
    beginning and the ledger says each prompt was trained once."""
    config = run_config(tiny_model_dir, data={"generate_eval": 0})
    TrainedLedger(tmp_path / "trained.jsonl").record(1, 1, ["calc-0-6", "calc-0-7"])
    summary = train(config, tmp_path, progress=False)
    assert summary["steps"] == 4
    assert trained_prompts(tmp_path) == all_prompts(config)


def test_a_run_whose_every_checkpoint_is_corrupt_stops_with_the_list(tiny_model_dir, tmp_path):
    config = run_config(tiny_model_dir, trainer={"steps": 2}, data={"generate_eval": 0})
    train(config, tmp_path, progress=False)
    for checkpoint in (tmp_path / "checkpoints").iterdir():
        corrupt(checkpoint / "optimizer.pt", "truncate")
    try:
        train(run_config(tiny_model_dir, trainer={"steps": None}), tmp_path, progress=False)
    except ValueError as err:
        assert "no intact checkpoint" in str(err) and "step-000001 (optimizer.pt is" in str(err)
    else:
        raise AssertionError("a run with only corrupt checkpoints was resumed")


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
        engine = rollout.async_engines[0]
        while True:  # one abort every 10 engine iterations: paced by the engine, not a clock
            await asyncio.to_thread(engine.wait_iterations, 10, 30)
            running = sorted(await engine.acall(lambda e: e.request_ids()))
            if running:
                output = await engine.abort(rng.choice(running))
                if output is not None:
                    aborted.append(output.finish_reason)

    config = run_config(tiny_model_dir, rollout={"max_new_tokens_per_turn": 24})
    summary = asyncio.run(_run_with(config, tmp_path, abort_requests))
    assert aborted and set(aborted) == {"abort"}
    assert summary["steps"] == 4
    assert trained_prompts(tmp_path) == all_prompts(config)


def test_a_crashed_engine_is_rebuilt_and_its_turns_resume_without_failing(tiny_model_dir, tmp_path, caplog):
    """The engine's forward raises once mid-run (an injected fault no request owns): the
    embedded runtime rebuilds the engine, re-issues its in-flight turns from their partial
    outputs, no trajectory fails, and every prompt is trained exactly once."""
    in_flight_at_crash = []

    async def crash_the_engine_once(rollout) -> None:
        engine = rollout.async_engines[0]
        while not await engine.acall(lambda e: e.request_ids()):
            await asyncio.to_thread(engine.wait_iterations, 1, 30)

        def arm(e) -> None:  # on the engine thread, between steps
            model = e.runner.model

            def crash(*args, **kwargs):
                del model.hidden_states  # once: the rebuilt engine runs the real forward
                in_flight_at_crash.extend(e.request_ids())
                raise RuntimeError("injected engine crash")

            model.hidden_states = crash

        await engine.acall(arm)

    config = run_config(tiny_model_dir, rollout={"max_new_tokens_per_turn": 24})
    with caplog.at_level(logging.WARNING):
        summary = asyncio.run(_run_with(config, tmp_path, crash_the_engine_once))
    assert in_flight_at_crash
    assert [r.getMessage() for r in caplog.records if "rebuilt" in r.getMessage()]
    assert not [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert summary["steps"] == 4 and summary["engine_restarts"] == 1
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
