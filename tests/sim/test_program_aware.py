"""ThunderAgent's emulation runs under the same concurrency bound as the other systems, and a
trajectory the engine has demoted (paused) yields its generation slot."""

from __future__ import annotations

import pytest
from tests.sim.sim_helpers import small_spec

from venusrl.engine.scheduler import Scheduler
from venusrl.sim import run


@pytest.mark.parametrize("name", ["thunderagent", "venus", "+kv_residency"])
def test_running_requests_never_exceed_the_slots_and_every_step_completes(monkeypatch, name):
    most = [0]
    original = Scheduler.schedule

    def counted(self):
        batch = original(self)
        most[0] = max(most[0], len(self.running))
        return batch

    monkeypatch.setattr(Scheduler, "schedule", counted)
    spec = small_spec(name, steps=4)
    result = run.simulate(spec)
    assert result.steps == 4
    assert result.engine["demotions"] > 0  # the pool is small enough for demotion to run
    assert most[0] <= spec.config.scheduler.slots_per_engine


def test_a_paused_holder_gives_its_slot_to_a_runnable_trajectory(monkeypatch):
    built = {}
    original_result = run._result

    def keep(spec, loop, engines, worker, coordinator, trainer, first, wall):
        built.update(worker=worker, engines=engines)
        return original_result(spec, loop, engines, worker, coordinator, trainer, first, wall)

    monkeypatch.setattr(run, "_result", keep)
    run.simulate(small_spec("thunderagent", steps=1))
    worker, engines = built["worker"], built["engines"]
    for index, engine in enumerate(engines):  # what each engine reports at the next urgent request
        worker.core.demoted(index, engine.demoted_trajectories())
    worker.core.check_invariants()
    for trajectory in worker.live.values():
        engine = worker.core.engine_of[trajectory.id]
        paused = trajectory.key in engines[engine].demoted_trajectories()
        assert worker.core.slot_priority(trajectory.id).name == ("LOW" if paused else "HIGH")
        assert worker.core.declared_priority(trajectory.id).name == "HIGH"
        slots = worker.slots[engine]
        if trajectory.id in slots.holders or trajectory.id in slots.waiting:
            assert slots.priorities[trajectory.id] == worker.core.slot_priority(trajectory.id)


def test_thunderagent_engines_pause_tool_waiting_programs_first():
    from venusrl.sim.systems import system

    assert system("thunderagent").demotion_order == "idle_first"
    assert system("venus").demotion_order == "shortest"  # the paper's order stays venus's
