"""The simulator runs the production scheduling code, not copies of it."""

from __future__ import annotations

import ast
import inspect
from collections import Counter

import pytest
from tests.sim.sim_helpers import small_spec

from venusrl.coordinator import policies
from venusrl.coordinator.coordinator import DataCoordinator
from venusrl.engine.radix_cache import RadixCache
from venusrl.engine.scheduler import Scheduler
from venusrl.rollout import core, orchestrator
from venusrl.rollout import worker as real_worker
from venusrl.rollout.slots import SlotScheduler
from venusrl.sim import run, worker
from venusrl.sim.run import simulate


def _count_calls(monkeypatch, owner, name: str, calls: Counter) -> None:
    original = getattr(owner, name)

    def counted(*args, **kwargs):
        calls[f"{owner.__name__}.{name}"] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)


def test_simulator_calls_the_real_scheduler_cache_slots_coordinator_and_policy(monkeypatch):
    calls: Counter = Counter()
    for owner, name in [
        (Scheduler, "schedule"), (Scheduler, "on_batch_done"), (Scheduler, "add_request"),
        (RadixCache, "match_prefix"), (RadixCache, "evict"), (SlotScheduler, "request"),
        (DataCoordinator, "on_turn_end"), (DataCoordinator, "on_weight_version"),
        (policies.LengthPredictionRule, "group_key"),
    ]:  # fmt: skip
        _count_calls(monkeypatch, owner, name, calls)
    moves: list = []
    real_choose = orchestrator.choose_moves
    monkeypatch.setattr(core, "choose_moves", lambda *a, **k: moves.append(1) or real_choose(*a, **k))

    result = simulate(small_spec("venus"))

    assert result.steps == 3
    for key in ("Scheduler.schedule", "Scheduler.on_batch_done", "Scheduler.add_request", "RadixCache.match_prefix",
                "RadixCache.evict", "SlotScheduler.request", "DataCoordinator.on_turn_end",
                "DataCoordinator.on_weight_version", "LengthPredictionRule.group_key"):
        assert calls[key] > 0, key
    assert moves, "the orchestrator's choose_moves was never asked"


def test_the_modules_import_the_production_objects():
    assert worker.SlotScheduler is SlotScheduler
    assert worker.DataCoordinator is DataCoordinator
    assert run.make_rule is policies.make_rule
    from venusrl.sim import engine

    assert engine.Scheduler is Scheduler


def core_methods_called(module) -> set[str]:
    """The `RolloutCore` attributes a driver module reads through `self.core`."""
    names = set()
    for node in ast.walk(ast.parse(inspect.getsource(module))):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr == "core"
                and isinstance(node.value.value, ast.Name) and node.value.value.id == "self"):
            names.add(node.attr)
    return names


def test_the_simulated_and_the_real_worker_drive_the_same_rollout_core():
    assert worker.RolloutCore is real_worker.RolloutCore is core.RolloutCore
    sim_calls, real_calls = core_methods_called(worker), core_methods_called(real_worker)
    assert sim_calls == real_calls, (sim_calls ^ real_calls)
    for name in sim_calls:  # the same objects: methods and state of the one class
        assert hasattr(core.RolloutCore, name) or name in ("slots", "engine_of", "moving", "orchestration",
                                                           "live_set"), name
    assert {"place", "wants_demoted", "demoted", "request_slot", "release_slot", "finish", "policy_changed",
            "orchestrate", "arrived", "declared_priority", "check_live_set"} <= sim_calls
    # no decision code left in either driver: neither reaches the pieces the core composes
    for module in (worker, real_worker):
        for name in ("steal_candidate", "choose_moves", "LeastLoaded"):
            assert not hasattr(module, name), f"{module.__name__} still uses {name}"


@pytest.mark.parametrize("name", ["venus", "thunderagent", "slime"])
def test_the_simulated_worker_calls_every_core_event_and_keeps_its_invariants(monkeypatch, name):
    calls: Counter = Counter()
    for method in core_methods_called(worker) & {n for n, v in vars(core.RolloutCore).items() if callable(v)}:
        original = getattr(core.RolloutCore, method)

        def checked(self, *args, _original=original, _method=method, **kwargs):
            calls[f"RolloutCore.{_method}"] += 1
            result = _original(self, *args, **kwargs)
            self.check_invariants()
            return result

        monkeypatch.setattr(core.RolloutCore, method, checked)
    assert simulate(small_spec(name)).steps == 3
    if name != "venus":
        return
    missing = {n for n in ("place", "wants_demoted", "demoted", "request_slot", "release_slot", "finish",
                           "policy_changed", "orchestrate", "arrived") if not calls[f"RolloutCore.{n}"]}
    assert not missing, missing


def test_a_preempted_turn_reports_its_action_over_and_asks_anew_as_the_real_worker_does(monkeypatch):
    """The real worker's turn, once its aborted stream returns, calls `release_slot` (which
    takes it out of the queue the core put it in) and asks again through `_acquire`: the
    simulated worker reports the same two events, in that order, for every preemption."""
    events: list[tuple[str, int]] = []
    for method in ("release_slot", "request_slot"):
        original = getattr(core.RolloutCore, method)

        def logged(self, trajectory_id, *args, _original=original, _method=method, **kwargs):
            events.append((_method, trajectory_id))
            return _original(self, trajectory_id, *args, **kwargs)

        monkeypatch.setattr(core.RolloutCore, method, logged)
    preempt = worker.SimWorker._preempt

    def preempted(self, t):
        if self._in_engine(t):
            events.append(("preempted", t.id))
            assert t.id in self.core.slots[self.core.engine_of[t.id]].waiting, "the core queued it"
        preempt(self, t)

    monkeypatch.setattr(worker.SimWorker, "_preempt", preempted)
    assert simulate(small_spec("venus")).worker["preemptions"] > 0
    for at, (event, trajectory_id) in enumerate(events):
        if event == "preempted":
            assert events[at + 1] == ("release_slot", trajectory_id), "reported with the abort, before anything else"
            after = [e for e, t in events[at + 2:] if t == trajectory_id][:1]
            assert after in (["request_slot"], []), after  # asks anew, unless it ended meanwhile


def test_a_turn_moved_while_its_finished_output_is_on_its_way_ends_once_and_asks_at_its_next_turn(monkeypatch):
    """A preemption that finds the turn's request finished, its output still on its way to
    the worker, aborts nothing but leaves the turn queued in the core, which may move it as a
    waiter. The output then ends the turn before the move lands: the landing must not ask a
    slot for the ended turn (the coordinator would see that turn end twice); the next turn asks
    on the target. Every such preemption is followed here by a move to the other engine."""
    preempt, forced = worker.SimWorker._preempt, []

    def preempted_then_moved(self, t):
        on_its_way = t.request_id is not None and not self._in_engine(t)
        preempt(self, t)
        source = self.core.engine_of[t.id]
        if on_its_way and t.id in self.core.slots[source].waiting:
            move = core.Move(t.id, source, 1 - source)
            self.core._commit_move(move)
            forced.append(t.id)
            self._act([move])

    monkeypatch.setattr(worker.SimWorker, "_preempt", preempted_then_moved)
    result = simulate(small_spec("venus", delivery_latency_s=1.0, move_latency_s=0.2))
    assert forced, "no preemption found a turn's output on its way: the case is not exercised"
    assert result.steps == 3
