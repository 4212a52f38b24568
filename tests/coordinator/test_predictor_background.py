"""BackgroundPredictor: submit never waits for a prediction, newest query wins, failures
are counted and skipped, its thread runs at the lowest CPU priority; and the loop into the
coordinator."""

import os
import threading
import time

from tests.coordinator.coord_harness import Ledger, config, prompts

from venusrl.coordinator import DataCoordinator
from venusrl.coordinator.predictors import BackgroundPredictor, query_from_trajectory
from venusrl.coordinator.predictors.background import BACKGROUND_NICE
from venusrl.coordinator.predictors.query import PredictionQuery


class GatedPredictor:
    """Blocks every predict until the test opens the gate; records what it was asked."""

    name = "gated"

    def __init__(self, fail_on=()):
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.asked = []
        self.observed = []
        self.fail_on = set(fail_on)

    def predict(self, query):
        self.entered.set()
        assert self.gate.wait(10)
        self.asked.append((query.trajectory_id, query.generated_tokens))
        if query.trajectory_id in self.fail_on:
            raise RuntimeError("boom")
        return 10.0 * query.generated_tokens

    def observe(self, examples):
        self.observed.append(len(examples))


def q(tid, generated):
    return PredictionQuery("p", "text", "", 1, generated, trajectory_id=tid)


def wait_for(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def test_submit_returns_while_a_prediction_is_blocked_and_newest_query_wins():
    predictor = GatedPredictor()
    bg = BackgroundPredictor(predictor)
    try:
        bg.submit(q(0, 5))
        assert predictor.entered.wait(10)  # the worker is inside predict, blocked
        bg.submit(q(1, 3))  # returns although the only worker is busy
        bg.submit(q(1, 7))  # replaces the queued query of trajectory 1
        bg.observe(["e1", "e2"])
        assert bg.pending() == 1 and bg.poll() == []
        predictor.gate.set()
        wait_for(lambda: len(predictor.asked) == 2)
        wait_for(lambda: bg.pending() == 0)
        results = []
        wait_for(lambda: results.extend(bg.poll()) or len(results) == 2)
        assert [(p.trajectory_id, p.at_generated_tokens, p.remaining_tokens) for p in results] == [
            (0, 5, 50.0), (1, 7, 70.0)
        ]
        assert predictor.asked == [(0, 5), (1, 7)]
        assert predictor.observed == [2]
    finally:
        predictor.gate.set()
        bg.close()


def test_a_failing_prediction_is_counted_and_skipped():
    predictor = GatedPredictor(fail_on={1})
    predictor.gate.set()
    bg = BackgroundPredictor(predictor)
    try:
        bg.submit(q(1, 2))
        bg.submit(q(2, 2))
        results = []
        wait_for(lambda: results.extend(bg.poll()) or len(results) == 1)
        assert results[0].trajectory_id == 2 and bg.errors == 1
    finally:
        bg.close()


def test_predictions_flow_into_the_coordinator_ranking():
    c = DataCoordinator(config(group_size=2, batch_groups=1, async_factor=2.0), prompts(4))
    ledger = Ledger(c)
    started = ledger.apply(c.start(0.0)).start
    predictor = GatedPredictor()
    predictor.gate.set()
    bg = BackgroundPredictor(predictor)
    try:
        # Group 0 gets long predictions, group 1 short ones: group 1 becomes the HIGH group.
        for t in started:
            ledger.apply(c.on_turn_start(t.id, 0.0, [1]))
            n = 50 if t.group_id == 0 else 2
            ledger.apply(c.on_turn_end(t.id, 1.0, [0] * n, [0.0] * n, 0, tool_call=True))
            group = next(g for g in c.running_groups() if g.id == t.group_id)
            bg.submit(query_from_trajectory(t, group, last_observation="ok"))
        results = []
        wait_for(lambda: results.extend(bg.poll()) or len(results) == len(started))
        for p in results:
            ledger.apply(c.on_prediction(p.trajectory_id, 2.0, p.remaining_tokens, p.at_generated_tokens))
        assert c.policy.high_groups == {1}
    finally:
        bg.close()


def test_the_serving_thread_yields_the_cpu_to_the_rollout_path():
    """Predictions are background work: the serving thread runs at the lowest CPU priority
    (its own nice value) while the caller's thread keeps its own."""
    caller = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    predictor = GatedPredictor()
    bg = BackgroundPredictor(predictor)
    try:
        bg.submit(q(0, 1))
        assert predictor.entered.wait(10)  # the thread is serving: its priority is set
        assert os.getpriority(os.PRIO_PROCESS, bg._thread.native_id) == BACKGROUND_NICE == 19
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == caller
    finally:
        predictor.gate.set()
        bg.close()
