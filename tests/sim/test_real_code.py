"""The simulator runs the production scheduling code, not copies of it."""

from __future__ import annotations

from collections import Counter

from tests.sim.sim_helpers import small_spec

from venusrl.coordinator import policies
from venusrl.coordinator.coordinator import DataCoordinator
from venusrl.engine.radix_cache import RadixCache
from venusrl.engine.scheduler import Scheduler
from venusrl.rollout import orchestrator
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
    monkeypatch.setattr(worker, "choose_moves", lambda *a, **k: moves.append(1) or real_choose(*a, **k))

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
