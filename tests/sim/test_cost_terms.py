"""Each cost term of the simulator changes which system finishes first in some cluster: the
small cluster (`sim_helpers`) with the term on and off, at the seed where the two systems
swap places by more than 1.5% either way. Deterministic per seed. The terms' formulas are
checked against hand computations in `test_cost_model.py`."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tests.sim.sim_helpers import SMALL_COST, small_spec

from venusrl.sim import run

HOST = {"engine.host_kv_capacity_tokens": 1 << 20}  # far more than the run ever evicts


def _finish(name: str, seed: int, cost=SMALL_COST, config: dict | None = None, steps: int = 3) -> float:
    return run.simulate(small_spec(name, seed=seed, cost=cost, config=config, steps=steps)).sim_seconds


def _swap(first: str, second: str, seed: int, off: dict, on: dict) -> None:
    """`first` finishes before `second` with the term off, after it with the term on."""
    before = _finish(second, seed, **off) / _finish(first, seed, **off)
    after = _finish(second, seed, **on) / _finish(first, seed, **on)
    assert before > 1.015 and after < 1 / 1.015, (before, after)


def test_prefill_attention_over_the_context_swaps_venus_and_action_level():
    """The paper's venus (`+migration`) prefills longer contexts again (its moves between
    engines): priced at their quadratic attention, action-level scheduling (ROLL Flash)
    overtakes it."""
    _swap("+migration", "rollflash", 5, {}, {"cost": replace(SMALL_COST, attention_pair_s=3e-6)})


def test_prefix_reads_of_chunked_prefill_swap_venus_and_action_level():
    _swap("+migration", "rollflash", 13, {}, {"cost": replace(SMALL_COST, prefix_read_token_s=3e-4)})


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reload_latency_prices_the_loads_of_the_programs_venus_pauses(seed):
    """With a host tier, the programs venus's live set pauses come back as loads, and each
    load's latency lengthens the run (the term once swapped venus and the paper's venus on
    seed 0; with idle engines resuming paused programs at once, no seed of 0-11 swaps). The
    live set is engaged from the start: this small cluster need not thrash enough to engage it.
    Venus up to its live set (`+live_set`): decode balance's moves would make the run's length
    turn on where each turn lands, not on the loads' latency."""
    spec = dict(seed=seed, config={**HOST, "scheduler.live_set_thrash_fraction": 0.0}, predictor_trajectory_share=0.0)
    free = run.simulate(small_spec("+live_set", **spec))
    slow = run.simulate(small_spec("+live_set", cost=replace(SMALL_COST, reload_latency_s=0.05), **spec))
    assert free.engine["reloaded_tokens"] > 0 and slow.engine["reloaded_tokens"] > 0
    assert slow.sim_seconds > free.sim_seconds


@pytest.mark.parametrize("name", ["venus", "thunderagent"])
def test_a_bounded_host_tier_turns_reloads_into_recomputation(name):
    """An unbounded host tier keeps what the pool evicts; bounded at half the device pool, part
    of it is recomputed instead."""
    unbounded = run.simulate(small_spec(name, seed=0, config=HOST)).engine
    bounded = run.simulate(small_spec(name, seed=0, config={"engine.host_kv_capacity_tokens": 2000})).engine
    assert bounded["recomputed_tokens"] > unbounded["recomputed_tokens"]
    assert bounded["reloaded_tokens"] < unbounded["reloaded_tokens"]


def test_keeping_cached_kv_at_a_weight_update_swaps_residency_tiers_and_action_level():
    """One group a step, five steps: with the cache flushed at every update (what slime, ROLL
    Flash and ThunderAgent's frameworks do) the residency tiers finish first; were the KV kept
    across updates, plain LRU would."""
    one_group = {"coordinator.batch_groups": 1}
    _swap("+kv_residency", "rollflash", 7, {"config": {**one_group, "engine.kv_after_weight_update": "recompute"},
                                            "steps": 5},
          {"config": {**one_group, "engine.kv_after_weight_update": "keep"}, "steps": 5})
