"""The live set in the simulator: ThunderAgent's and venus's run under the same concurrency
bound as the other systems, every step completes, and a paused program never waits in a
slot queue (the core's invariants, checked at the end of a run)."""

from __future__ import annotations

import pytest
from tests.sim.sim_helpers import small_spec

from venusrl.engine.scheduler import Scheduler
from venusrl.sim import run
from venusrl.sim.systems import system


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
    assert most[0] <= spec.config.scheduler.slots_per_engine


@pytest.mark.parametrize("name", ["thunderagent", "venus"])
def test_the_live_set_pauses_and_resumes_programs_on_a_small_pool(monkeypatch, name):
    built = {}
    original_result = run._result

    def keep(spec, loop, engines, worker, coordinator, trainer, first, wall):
        built.update(worker=worker)
        return original_result(spec, loop, engines, worker, coordinator, trainer, first, wall)

    monkeypatch.setattr(run, "_result", keep)
    run.simulate(small_spec(name, steps=2))
    core = built["worker"].core
    assert core.live_set.pauses > 0 and core.live_set.resumes > 0  # the 4,000-token pool binds
    core.check_invariants()


def test_thunderagent_is_its_scheduler_policy_on_sglang_s_cache():
    thunderagent, venus = system("thunderagent").config, system("venus").config
    assert thunderagent.scheduler.live_set_rule == "thunderagent" and thunderagent.scheduler.live_set_interval_s == 5.0
    assert thunderagent.scheduler.slot_mode == "action_level" and thunderagent.coordinator.policy == "action_level"
    assert (thunderagent.engine.cache_policy, thunderagent.engine.demotion) == ("lru", False)
    assert venus.scheduler.live_set_rule == "venus"
    assert system("+migration").config.scheduler.live_set_rule is None


def test_each_live_program_reserves_the_configured_headroom(monkeypatch):
    """`scheduler.live_set_buffer_tokens` reaches the simulator's live set in its units (what a
    buffer does to the room left is `tests/rollout/test_live_set.py`'s)."""
    built = []
    original_result = run._result

    def keep(spec, loop, engines, worker, coordinator, trainer, first, wall):
        built.append(worker.core.live_set)
        return original_result(spec, loop, engines, worker, coordinator, trainer, first, wall)

    monkeypatch.setattr(run, "_result", keep)
    for tokens in (0, 320):
        run.simulate(small_spec("venus", config={"scheduler.live_set_buffer_tokens": tokens}, steps=2))
    none, reserved = built
    assert (none.buffer, reserved.buffer) == (1, 320 // 16)  # at least one unit, in 16-token units
    assert none.pauses > 0 and reserved.pauses > 0
