"""Helpers of the node-loss tests: a `venusrl train` run on a `NamespacedCluster` (its driver
in the head node's namespace), watched through its run directory."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from venusrl.config import Config
from venusrl.engine.client import EngineInfo
from venusrl.engine.remote.remote import RemoteEngine

RUN_TIMEOUT_S = 600.0


def start_run(cluster, config: Config, tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    config = config.model_copy(update={"run": config.run.model_copy(update={"ray_address": cluster.address})})
    config_path = tmp_path / "run.yaml"
    config_path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "venusrl", "train", str(config_path), "--run-dir", str(run_dir), "--no-progress"]
    return cluster.popen_in_head(command, tmp_path / "driver.log"), run_dir


def wait_for(condition, process: subprocess.Popen, what: str, log: Path, timeout_s: float = RUN_TIMEOUT_S,
             poll_s: float = 0.2) -> None:
    """Poll `condition` every `poll_s` until it holds; fail naming `what` if the run ends or
    time runs out first."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if process.poll() is not None:
            raise AssertionError(f"the run ended ({process.returncode}) before {what}: {log.read_text()[-4000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout_s:.0f} s")
        time.sleep(poll_s)


def steps_trained(run_dir: Path) -> int:
    path = run_dir / "trained.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def finish(process: subprocess.Popen, log: Path) -> None:
    try:
        code = process.wait(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    assert code == 0, log.read_text()[-6000:]


def trained_prompt_ids(run_dir: Path) -> list[str]:
    lines = [json.loads(line) for line in (run_dir / "trained.jsonl").read_text().splitlines()]
    return [pid for line in lines for pid in line["prompt_ids"]]


def stop_with_a_turn_running(node, run_dir: Path, process: subprocess.Popen, log: Path) -> None:
    """Stop the engine serving on `node` (SIGSTOP) once its own stats count a request running,
    so that request stays in flight, unanswered, until the node is killed. Its stats are read
    over a connection of this process's own, every 10 ms; the engine's address and pid are
    what its train.log line names."""
    marker = f"engine serving on {node.ip}:"
    wait_for(lambda: marker in (run_dir / "train.log").read_text(), process, "the engine on " + node.ip, log)
    line = next(line for line in (run_dir / "train.log").read_text().splitlines() if marker in line)
    port, pid = int(line.split(marker, 1)[1].split(" ", 1)[0]), int(line.rsplit(" pid ", 1)[1])
    engine = RemoteEngine((node.ip, port), EngineInfo(0, 0, 0, 0, ()))  # stats needs no model facts
    with asyncio.Runner() as runner:  # one loop for every poll: the connection is bound to it
        wait_for(lambda: runner.run(engine.stats()).running > 0, process, f"a turn running on {node.ip}", log,
                 poll_s=0.01)
        os.kill(pid, signal.SIGSTOP)  # at once, before the loop closes: the turn may be near its end
