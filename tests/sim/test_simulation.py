"""Whole-cluster invariants, for every system."""

from __future__ import annotations

import pytest
from tests.sim.sim_helpers import SMALL_WORKLOAD, small_spec

from venusrl.coordinator.coordinator import DataCoordinator
from venusrl.sim import run
from venusrl.sim.systems import SYSTEMS


@pytest.mark.parametrize(("name", "policy"), [*((name, None) for name in sorted(SYSTEMS)), ("venus", "critical_path")])
def test_every_trajectory_ends_exactly_once_and_the_engines_stay_consistent(monkeypatch, name, policy):
    done: list[int] = []
    original = DataCoordinator.on_trajectory_done

    def recorded(self, trajectory_id, now, reward, record=None):
        assert record is not None, "the simulator hands over its record of the trajectory"
        done.append(trajectory_id)
        return original(self, trajectory_id, now, reward, record)

    monkeypatch.setattr(DataCoordinator, "on_trajectory_done", recorded)
    built = {}
    original_result = run._result

    def keep(spec, loop, engines, worker, coordinator, trainer, first, wall):
        built.update(engines=engines, worker=worker, coordinator=coordinator)
        return original_result(spec, loop, engines, worker, coordinator, trainer, first, wall)

    monkeypatch.setattr(run, "_result", keep)
    result = run.simulate(small_spec(name, policy))

    worker, coordinator = built["worker"], built["coordinator"]
    assert result.steps == 3
    assert len(done) == len(set(done)) == worker.counts.finished
    started = coordinator._next_trajectory_id
    assert worker.counts.finished + worker.counts.discarded + len(worker.live) == started
    assert coordinator.counts.ready * 4 <= worker.counts.finished
    for engine in built["engines"]:
        engine.scheduler.check_integrity()
    assert result.step_times == sorted(result.step_times)


def test_the_same_seed_gives_the_same_run():
    first, second = run.simulate(small_spec("venus")), run.simulate(small_spec("venus"))
    assert first.step_times == second.step_times
    assert first.engine == second.engine


def test_the_engines_busy_time_is_told_by_term_and_each_step_by_the_groups_it_trained():
    """The breakdown sums to the busy time; the trainer takes groups in the order they got
    ready, B a step, so step k ends after its k*B-th group was ready; each group is ready
    once, after it was admitted."""
    spec = small_spec("venus")
    result = run.simulate(spec)
    engine, batch = result.engine, spec.config.coordinator.batch_groups
    busy_s = engine["busy_fraction"] * result.sim_seconds * engine["engines"]
    assert sum(engine["busy_s_by_term"].values()) == pytest.approx(busy_s, rel=1e-3)
    assert engine["busy_s_by_term"]["fixed"] > 0 and engine["busy_s_by_term"]["kv_read"] > 0
    assert set(engine["memory_stalls"]) == {"promoted", "high", "low"}
    # each engine stalls for each weight version it takes up (the last may end the run first)
    assert 0 < engine["busy_s_by_term"]["weight_sync"] <= spec.weight_sync_s * engine["engines"] * result.steps + 1e-9
    ready = result.groups_ready
    assert len(ready) == result.coordinator["ready"] >= batch * result.steps
    assert len({group for group, _, _ in ready}) == len(ready)  # each group once
    assert all(admitted <= at for _, admitted, at in ready)
    assert [at for _, _, at in ready] == sorted(at for _, _, at in ready)
    assert result.time_to_first_batch_s == ready[batch - 1][2]
    for k, step_at in enumerate(result.step_times):
        assert ready[(k + 1) * batch - 1][2] < step_at
    group, admitted, at = ready[0]
    assert result.to_dict()["groups_ready"][0] == [group, round(admitted, 3), round(at, 3)]


def test_a_prompt_prefix_every_prompt_shares_is_computed_once_per_engine():
    """Without moves between engines (+kv_residency: venus less orchestration), whose
    recompute on the target would blur the count."""
    prompts = {"prompt_tokens_median": 1500, "prompt_tokens_sigma": 0.0}  # long prompts, all the same length
    own = run.simulate(small_spec("+kv_residency", steps=1, workload=SMALL_WORKLOAD.model_copy(update=prompts)))
    shared = run.simulate(small_spec("+kv_residency", steps=1, workload=SMALL_WORKLOAD.model_copy(
        update={**prompts, "shared_prompt_tokens": 1500})))  # the whole prompt is the dataset's shared prefix
    assert shared.engine["hit_rate"] > own.engine["hit_rate"]
    # A group's trajectories are spread over both engines: its own prompt is computed on each,
    # where a shared one is computed once per engine, by the first group there; evictions
    # recompute prompts in both runs, more where more distinct prompts compete for the pool.
    groups, engines = own.coordinator["admitted"], own.engine["engines"]
    assert own.engine["prefill_tokens"] - shared.engine["prefill_tokens"] >= (groups - 1) * engines * 1500


def test_tokens_reloaded_from_the_host_tier_are_hits_not_recomputation():
    with_host = run.simulate(small_spec("rollflash", config={"engine.host_kv_capacity_tokens": 1 << 20})).engine
    without = run.simulate(small_spec("rollflash")).engine
    assert with_host["reloaded_tokens"] > 0 and without["reloaded_tokens"] == 0
    assert without["recomputed_tokens"] > 0  # the small pool evicts
    assert with_host["recomputed_tokens"] < without["recomputed_tokens"]
    assert with_host["hit_rate"] > without["hit_rate"]


def test_venus_reaches_the_last_step_no_later_than_action_level_on_a_contended_cluster():
    """Two slots per engine for 24 trajectories in flight, a trainer in the loop, 4 steps:
    the paper's venus (`+migration`: length-prediction priority, the next batch ranked while
    the trainer steps, idle slots take queued turns) against action-level scheduling (ROLL
    Flash). Deterministic per seed; one seed of six goes to action_level by 4%, so the claim
    is the median and a bound on the worst. Venus with its live set loses this slot-bound
    cell (0.90-1.04x, median 0.98x: pausing programs only delays turns the two slots would
    serve anyway), a cell kept in `results/sim-thunderagent/`."""
    ratios = []
    for seed in range(6):
        fields = {"steps": 4, "seed": seed, "config": {"coordinator.batch_groups": 4, "scheduler.slots_per_engine": 2}}
        action_level = run.simulate(small_spec("rollflash", **fields))
        venus = run.simulate(small_spec("+migration", **fields))
        assert action_level.steps == venus.steps == 4
        ratios.append(action_level.sim_seconds / venus.sim_seconds)
    assert sorted(ratios)[len(ratios) // 2] >= 1.05 and min(ratios) >= 0.95, ratios


def test_a_move_lands_its_fixed_latency_after_it_was_decided(monkeypatch):
    """`SimSpec.move_latency_s` (what the validation measures for a move between engine
    processes) delays every moved turn's arrival by exactly that much beyond its KV bytes."""
    from venusrl.sim.worker import SimWorker

    decided, landed = {}, []
    move, arrive = SimWorker._move, SimWorker._arrive

    def recording_move(self, t, source, target):
        decided[t.id] = self.loop.now
        move(self, t, source, target)

    def recording_arrive(self, t, prefix):
        landed.append((self.loop.now - decided.pop(t.id), len(prefix) * self.transfer_s_per_unit))
        arrive(self, t, prefix)

    monkeypatch.setattr(SimWorker, "_move", recording_move)
    monkeypatch.setattr(SimWorker, "_arrive", recording_arrive)
    result = run.simulate(small_spec("venus", move_latency_s=0.25))
    assert result.worker["migrations"] == len(landed) + len(decided) > 0
    assert sum(result.worker["moves_by_reason"].values()) == result.worker["migrations"]  # each counted once, by reason
    assert 0 < result.worker["room_readings"]["with_room"] <= result.worker["room_readings"]["all"]
    assert all(abs(waited - (0.25 + copy)) < 1e-9 for waited, copy in landed)
