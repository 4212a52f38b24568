"""Random multi-turn workloads through the scheduler with a fake runner; integrity every step."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.engine.scheduler_fakes import FakeRunner, make_scheduler, step

from venusrl.engine.radix_cache import Tier
from venusrl.types import Priority, SamplingParams


def watch_grow(s):
    """Check the growth contract on every allocation: a request gets pages only when the
    budget of the tier it is given (free pages plus what it may evict) covers them; a refusal
    changes nothing; memory for a LOW request is taken from the high_ref tier only when no
    other request runs and the engine conserves work (`Step.eviction_tier`), never otherwise."""
    grow, evict = s.kv.grow, s.cache.evict
    current = {}

    def tracked_grow(request, count, tier):
        if request.priority == Priority.LOW and tier > Tier.LOW_REF:
            assert s.config.work_conservation and all(other is request for other in s.running)
        budget, (_, need) = s.kv.available_pages(tier), s.kv.room_and_pages(request, count)
        before = (list(request.kv_slots), s.allocator.free_pages, list(s.cache.evicted_tokens))
        current["priority"] = request.priority if tier <= Tier.LOW_REF else None
        try:
            granted = grow(request, count, tier)
        finally:
            current["priority"] = None
        assert granted == (budget >= need)
        if not granted:
            assert before == (request.kv_slots, s.allocator.free_pages, list(s.cache.evicted_tokens))
        return granted

    def checked_evict(num_tokens, max_tier, on_evict=None):
        before = s.cache.evicted_tokens[Tier.HIGH_REF]
        freed = evict(num_tokens, max_tier, on_evict)
        if current.get("priority") == Priority.LOW:
            assert max_tier <= Tier.LOW_REF
            assert s.cache.evicted_tokens[Tier.HIGH_REF] == before
        return freed

    s.kv.grow, s.cache.evict = tracked_grow, checked_evict


def check_batch(s, batch, max_prefill_tokens, waiting_before):
    """What one batch promises the runner: no slot written twice, only running requests
    computed (a request retracted as a victim may be admitted again in the same batch), and
    prefill within the token budget (a chunk of more than one token is always prefill;
    decode tokens are not budgeted)."""
    written = [slot for item in batch.items for slot in item.new_slots]
    assert len(written) == len(set(written))
    assert all(s.requests[item.request_id] in s.running for item in batch.items)
    assert sum(len(i.token_ids) for i in batch.items if len(i.token_ids) > 1) <= max_prefill_tokens
    assert len(s.running) <= s.config.max_running_requests
    for key in s.demoted_trajectories():  # demotion touches only declared-HIGH trajectories
        assert s.config.demotion and s.cache.trajectories[key].priority == Priority.HIGH
    # no priority inversion in admission (§4.3): a LOW request is admitted only when no
    # PROMOTED/HIGH one is left waiting
    admitted = [r for r in s.running if r.request_id in waiting_before]
    if any(r.priority == Priority.LOW for r in admitted):
        assert all(r.priority == Priority.LOW for r in s.waiting)


def import_prefix(s, runner, rng, histories, live):
    """Migrate a known context in, as an engine importing exported KV does: reserve (whole
    pages, evicting no high_ref KV), write the KV the way the runner would, commit; sometimes
    for a new caller trajectory."""
    tokens = rng.choice(sorted(histories.values()))
    traj = None
    if rng.random() < 0.5:
        traj = f"m{rng.randrange(3)}"
        s.start_trajectory(traj, Priority(rng.randrange(3)))
        live.add(traj)
    high_ref_evicted = s.cache.evicted_tokens[Tier.HIGH_REF]
    new_slots, offset = s.reserve_prefix(tokens)
    assert s.cache.evicted_tokens[Tier.HIGH_REF] == high_ref_evicted  # imports evict unused/low_ref only
    assert offset % s.allocator.page_size == 0 and len(new_slots) % s.allocator.page_size == 0
    runner.apply_copies(s.take_kv_copies())  # what the reservation evicted to the host
    for i, slot in enumerate(new_slots, start=offset):
        runner.kv[slot] = (i, tokens[i])
    assert s.commit_prefix(tokens, new_slots, offset, traj) == offset + len(new_slots)
    s.check_integrity()


def drive(seed: int, steps: int, lifecycle: bool = False, **config):
    """``lifecycle`` adds prefix imports, idle-TTL releases and weight-update KV drops to the
    mix (off for the fixed-seed workloads below, whose figures their assertions compare)."""
    rng = random.Random(seed)
    s, runner = make_scheduler(**config), FakeRunner(seed, vocab=6)
    watch_grow(s)
    histories: dict[str, list[int]] = {}  # trajectory -> context so far (multi-turn)
    live: set[str] = set()
    serial = 0
    for clock in range(steps):
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
        elif not lifecycle:
            pass
        elif roll < 0.43 and histories:
            import_prefix(s, runner, rng, histories, live)
        elif roll < 0.45:
            for traj in s.release_idle(now=clock, ttl=rng.randrange(1, 20)):
                live.discard(traj)
                histories.pop(traj, None)
        elif roll < 0.455:
            s.drop_all_kv()  # new weights: every computed token is stale
            s.check_integrity()
        stopped = {rid for rid in s.requests if rng.random() < 0.02}
        waiting_before = {r.request_id for r in s.waiting}
        batch = s.schedule()
        check_batch(s, batch, config.get("max_prefill_tokens", 64), waiting_before)
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
        "work_conservation": st.booleans(),
    }
)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), config=configs)
def test_random_workload_keeps_every_invariant(seed, config):
    drive(seed, steps=60, **config)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**16), config=configs)
def test_imports_idle_releases_and_kv_drops_keep_every_invariant(seed, config):
    drive(seed, steps=80, lifecycle=True, **config)


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
    drive(seed, steps=2000, lifecycle=seed % 2 == 1, page_size=1 + seed % 4, kv_capacity_tokens=48 + 8 * seed,
          max_running_requests=1 + seed % 8, max_prefill_tokens=32, chunked_prefill_size=8,
          cache_policy="lru" if seed % 3 == 0 else "tiers", demotion=seed % 2 == 0,
          host_kv_capacity_tokens=32 * (seed % 3))  # fmt: skip
