"""Random multi-turn workloads through the scheduler with a fake runner; integrity every step."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.engine.scheduler_fakes import FakeRunner, make_scheduler, step

from venusrl.engine.radix_cache import Tier
from venusrl.types import Priority, SamplingParams


def watch_high_ref_evictions(s):
    """Fail if memory for a LOW request is ever taken from the high_ref tier."""
    grow, evict = s._grow, s.cache.evict
    current = {}

    def tracked_grow(request, count):
        current["priority"] = request.priority
        return grow(request, count)

    def checked_evict(num_tokens, max_tier, on_evict=None):
        before = s.cache.evicted_tokens[Tier.HIGH_REF]
        freed = evict(num_tokens, max_tier, on_evict)
        if current["priority"] == Priority.LOW:
            assert max_tier <= Tier.LOW_REF
            assert s.cache.evicted_tokens[Tier.HIGH_REF] == before
        return freed

    s._grow, s.cache.evict = tracked_grow, checked_evict


def drive(seed: int, steps: int, **config):
    rng = random.Random(seed)
    s, runner = make_scheduler(**config), FakeRunner(seed, vocab=6)
    watch_high_ref_evictions(s)
    histories: dict[str, list[int]] = {}  # trajectory -> context so far (multi-turn)
    live: set[str] = set()
    serial = 0
    for _ in range(steps):
        roll = rng.random()
        if roll < 0.25 and len(s.requests) < 12:
            serial += 1
            traj = f"t{rng.randrange(6)}"
            busy = any(r.trajectory_id == traj for r in s.requests.values())
            if busy or rng.random() < 0.2:
                traj = None  # a plain request with its own implicit trajectory
            base = histories.get(traj, [rng.randrange(3)] * rng.randrange(1, 4)) if traj else []
            prompt = base + [rng.randrange(6) for _ in range(rng.randrange(1, 12))]
            if len(prompt) > s.allocator.capacity_tokens // 2:
                prompt = prompt[-rng.randrange(1, 12) :]  # a context too long: start over
            params = SamplingParams(max_new_tokens=rng.randrange(1, 10), stop_token_ids=(5,))
            s.add_request(f"r{serial}", prompt, params, Priority(rng.randrange(3)), traj)
            if traj:
                live.add(traj)
        elif roll < 0.3 and s.requests:
            s.abort(rng.choice(sorted(s.requests)))
        elif roll < 0.35 and live:
            s.set_priority(rng.choice(sorted(live)), Priority(rng.randrange(3)))
        elif roll < 0.4 and live:
            traj = rng.choice(sorted(live))
            s.release_trajectory(traj)
            live.discard(traj)
            histories.pop(traj, None)
        stopped = {rid for rid in s.requests if rng.random() < 0.02}
        batch = s.schedule()
        for done in runner.run(s, batch, stopped) + batch.finished:
            if done.trajectory_id in live:
                histories[done.trajectory_id] = done.prompt_ids + done.output_ids
        s.check_integrity()
        stats = s.stats()
        assert stats.running <= config.get("max_running_requests", 8)
        assert sum(stats.kv_tokens.values()) == stats.kv_capacity_tokens
    # drain: everything left finishes
    for traj in live:
        s.release_trajectory(traj)
    for _ in range(2000):
        if not s.has_work:
            break
        step(s, runner)
    assert not s.has_work
    s.schedule()
    s.check_integrity()
    assert s.stats().kv_tokens["in_use"] == 0 and s.cache.trajectories == {}
    return s.stats()


configs = st.fixed_dictionaries(
    {
        "page_size": st.integers(1, 4),
        "kv_capacity_tokens": st.integers(24, 96),
        "max_running_requests": st.integers(1, 6),
        "max_prefill_tokens": st.integers(4, 40),
        "chunked_prefill_size": st.integers(2, 16),
        "cache_policy": st.sampled_from(["tiers", "lru"]),
        "demotion": st.booleans(),
        "host_kv_capacity_tokens": st.sampled_from([0, 16, 64]),
    }
)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), config=configs)
def test_random_workload_keeps_every_invariant(seed, config):
    drive(seed, steps=60, **config)


def test_tight_memory_workload_retracts_and_recomputes():
    stats = drive(7, steps=300, page_size=2, kv_capacity_tokens=32, max_running_requests=6,
                  max_prefill_tokens=32, chunked_prefill_size=8, demotion=True)  # fmt: skip
    assert stats.retractions > 0 and stats.cached_tokens > 0


def test_host_tier_turns_recomputation_into_loads():
    """The same tight workload with a host tier: evicted KV comes back from host memory (the
    fake runner checks every loaded slot holds the right token at the right position)."""
    config = dict(page_size=2, kv_capacity_tokens=32, max_running_requests=6, max_prefill_tokens=32,
                  chunked_prefill_size=8, demotion=True)  # fmt: skip
    without = drive(7, steps=300, **config)
    with_host = drive(7, steps=300, host_kv_capacity_tokens=128, **config)
    assert with_host.host_saved_tokens > 0 and with_host.host_loaded_tokens > 0
    assert with_host.recomputed_tokens < without.recomputed_tokens


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(20))
def test_long_random_workloads(seed):
    drive(seed, steps=2000, page_size=1 + seed % 4, kv_capacity_tokens=48 + 8 * seed,
          max_running_requests=1 + seed % 8, max_prefill_tokens=32, chunked_prefill_size=8,
          cache_policy="lru" if seed % 3 == 0 else "tiers", demotion=seed % 2 == 0,
          host_kv_capacity_tokens=32 * (seed % 3))  # fmt: skip
