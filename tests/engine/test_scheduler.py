from dataclasses import replace

import pytest
from tests.engine.scheduler_fakes import FakeRunner, make_scheduler, run_to_completion, step

from venusrl.engine.stats import summed_memory_stalls
from venusrl.types import Priority, SamplingParams


def params(n=3, **kw):
    return SamplingParams(max_new_tokens=n, **kw)


def test_prefill_then_decode_to_max_new_tokens():
    s, runner = make_scheduler(page_size=2), FakeRunner()
    s.add_request("r", [10, 11, 12], params(3))
    batch, _ = step(s, runner)
    (item,) = batch.items
    assert item.token_ids == [10, 11, 12] and item.positions == [0, 1, 2] and item.sample
    assert len(set(item.new_slots)) == 3 and item.context_slots == item.new_slots
    batch, _ = step(s, runner)
    (item,) = batch.items
    assert item.positions == [3] and len(item.context_slots) == 4
    _, finished = step(s, runner)
    assert [len(f.output_ids) for f in finished] == [3] and finished[0].finish_reason == "length"
    assert not s.has_work
    s.schedule()  # the boundary releases the request's implicit trajectory
    # the computed whole pages (4 tokens: 3 prompt + 1 decoded) stay cached, the rest is free
    assert s.stats().kv_tokens["unused"] == 4


def test_chunked_prefill_samples_only_after_the_last_chunk():
    s, runner = make_scheduler(page_size=2, chunked_prefill_size=4), FakeRunner()
    s.add_request("r", list(range(10)), params(1))
    sizes = []
    while s.has_work:
        batch, _ = step(s, runner)
        sizes.append([(len(i.token_ids), i.sample) for i in batch.items])
    assert sizes == [[(4, False)], [(4, False)], [(2, True)]]


def test_prefill_token_budget_splits_across_steps():
    s, runner = make_scheduler(max_prefill_tokens=5), FakeRunner()
    s.add_request("a", [1, 2, 3], params(1))
    s.add_request("b", [4, 5, 6], params(1))
    batch, _ = step(s, runner)
    assert [(i.request_id, len(i.token_ids)) for i in batch.items] == [("a", 3), ("b", 2)]


def test_shared_prefix_is_a_cache_hit():
    s, runner = make_scheduler(page_size=2), FakeRunner()
    s.add_request("a", [1, 2, 3, 4, 5], params(1))
    run_to_completion(s, runner)
    s.add_request("b", [1, 2, 3, 4, 9], params(1))
    batch, _ = step(s, runner)
    assert batch.items[0].token_ids == [9] and batch.items[0].positions == [4]
    stats = s.stats()
    assert (stats.prompt_tokens, stats.cached_tokens) == (10, 4)
    assert stats.hit_rate == pytest.approx(0.4)


def test_fully_cached_prompt_still_computes_its_last_token():
    s, runner = make_scheduler(), FakeRunner()
    s.add_request("a", [1, 2, 3], params(2))
    run_to_completion(s, runner)
    s.add_request("b", [1, 2, 3], params(1))
    batch, _ = step(s, runner)
    assert batch.items[0].token_ids == [3] and batch.items[0].sample


def test_high_is_admitted_before_earlier_low():
    s, runner = make_scheduler(max_running_requests=1), FakeRunner()
    s.add_request("low", [1, 2], params(1), priority=Priority.LOW)
    s.add_request("high", [3, 4], params(1), priority=Priority.HIGH)
    s.add_request("promoted", [5, 6], params(1), priority=Priority.PROMOTED)
    order = [step(s, runner)[0].items[0].request_id for _ in range(3)]
    assert order == ["promoted", "high", "low"]


def test_waiting_high_preempts_running_low_and_resume_hits_the_cache():
    s, runner = make_scheduler(max_running_requests=1), FakeRunner()
    s.add_request("low", [1, 2, 3, 4], params(4), priority=Priority.LOW)
    step(s, runner)
    step(s, runner)  # low has 5 computed tokens now
    s.add_request("high", [7, 8], params(1), priority=Priority.HIGH)
    batch, _ = step(s, runner)
    assert batch.retracted == ["low"] and [i.request_id for i in batch.items] == ["high"]
    assert s.stats().preemptions == 1 and s.stats().kv_tokens["low_ref"] == 5
    batch, _ = step(s, runner)
    (item,) = batch.items
    assert item.request_id == "low" and item.positions == [5]  # everything computed was cached
    assert s.stats().recomputed_tokens == 0
    outputs = run_to_completion(s, runner)
    assert len(outputs["low"].output_ids) == 4


def test_decode_retracts_low_first_and_counts_recomputation():
    # 12 slots: two requests of 4 prompt tokens grow until they collide
    s, runner = make_scheduler(kv_capacity_tokens=12, max_running_requests=2), FakeRunner()
    s.add_request("high", [1, 2, 3, 4], params(6), priority=Priority.HIGH)
    s.add_request("low", [5, 6, 7, 8], params(6), priority=Priority.LOW)
    retracted = []
    for _ in range(4):
        batch, _ = step(s, runner)
        retracted += batch.retracted
    assert retracted == ["low"]
    outputs = run_to_completion(s, runner)
    assert set(outputs) == {"high", "low"}
    stats = s.stats()
    assert stats.retractions == 1
    # HIGH evicted low's returned tokens to keep decoding: they were prefilled again
    assert stats.recomputed_tokens > 0 and stats.evicted_tokens["low_ref"] > 0
    assert stats.evicted_tokens["high_ref"] == 0


def test_low_request_cannot_evict_a_high_trajectory_while_other_work_runs():
    s, runner = make_scheduler(kv_capacity_tokens=10), FakeRunner()
    s.start_trajectory("t", Priority.HIGH)
    s.add_request("h", [1, 2, 3, 4, 5], params(1), priority=Priority.HIGH, trajectory_id="t")
    run_to_completion(s, runner)  # 5 tokens cached as high_ref, 5 free
    s.add_request("busy", [7], params(3), priority=Priority.LOW)
    step(s, runner)  # running, 2 of the free 5 taken
    s.add_request("l", [9, 9, 9, 9, 9], params(1), priority=Priority.LOW)
    batch, _ = step(s, runner)
    assert [i.request_id for i in batch.items] == ["busy"]  # l fits only by evicting high_ref
    assert s.stats().kv_tokens["high_ref"] == 5
    # each iteration whose admission stopped at l is a memory stall at LOW, until l runs alone
    # and may evict (work conservation)
    assert s.stats().memory_stalls == {"promoted": 0, "high": 0, "low": 1}
    ran = [[i.request_id for i in step(s, runner)[0].items] for _ in range(4)]
    stalls = 1 + next(k for k, ids in enumerate(ran) if "l" in ids)
    assert stalls > 1 and s.stats().memory_stalls == {"promoted": 0, "high": 0, "low": stalls}


def test_low_request_that_is_the_only_work_evicts_high_kv_instead_of_idling():
    """Work conservation: with nothing else to run, a LOW request may evict a HIGH trajectory's
    KV. Idling for that KV deadlocks when the trajectory's next turn waits on the slot this
    request holds (the rollout bench's one-slot, KV-bound case did)."""
    s, runner = make_scheduler(kv_capacity_tokens=8), FakeRunner()
    s.start_trajectory("t", Priority.HIGH)
    s.add_request("h", [1, 2, 3, 4, 5], params(1), priority=Priority.HIGH, trajectory_id="t")
    run_to_completion(s, runner)  # 5 tokens cached as high_ref, 3 free
    s.add_request("l", [9, 9, 9, 9, 9], params(1), priority=Priority.LOW)
    batch, _ = step(s, runner)
    assert [i.request_id for i in batch.items] == ["l"]
    assert s.stats().evicted_tokens["high_ref"] > 0


def test_without_work_conservation_a_lone_low_request_waits_for_high_kv_to_be_released():
    """The paper's rule alone (`work_conservation: false`, venus's engines): a LOW request
    never evicts a HIGH trajectory's KV, even as the only work; it is admitted once that
    trajectory is released (or demoted, or its priority drops)."""
    s, runner = make_scheduler(kv_capacity_tokens=8, work_conservation=False), FakeRunner()
    s.start_trajectory("t", Priority.HIGH)
    s.add_request("h", [1, 2, 3, 4, 5], params(1), priority=Priority.HIGH, trajectory_id="t")
    run_to_completion(s, runner)  # 5 tokens cached as high_ref, 3 free
    s.add_request("l", [9, 9, 9, 9, 9], params(1), priority=Priority.LOW)
    for _ in range(3):
        batch, _ = step(s, runner)
        assert batch.items == []
    assert s.stats().kv_tokens["high_ref"] == 5 and s.stats().evicted_tokens["high_ref"] == 0
    s.release_trajectory("t")
    assert "l" in run_to_completion(s, runner)
    assert s.stats().evicted_tokens["high_ref"] == 0


def test_lone_low_request_behind_high_kv_grows_into_it_instead_of_being_cut_short():
    """A lone LOW request that can grow only by evicting a HIGH trajectory's KV has not
    outgrown the pool: it is neither ended with "length" nor left waiting; it evicts that KV
    (it is the only work) and runs to max_new_tokens."""
    s, runner = make_scheduler(kv_capacity_tokens=8), FakeRunner()
    s.start_trajectory("t", Priority.HIGH)
    s.add_request("h", [1, 2, 3, 4], params(1), priority=Priority.HIGH, trajectory_id="t")
    run_to_completion(s, runner)  # 4 tokens cached as high_ref, 4 free
    s.add_request("l", [9, 9], params(5), priority=Priority.LOW)
    outputs = run_to_completion(s, runner)
    assert outputs["l"].finish_reason == "length" and len(outputs["l"].output_ids) == 5  # max_new_tokens
    assert s.stats().retractions == 0 and s.stats().evicted_tokens["high_ref"] > 0


def test_abort_returns_partial_output_and_keeps_kv():
    s, runner = make_scheduler(), FakeRunner()
    s.add_request("r", [1, 2, 3], params(10), trajectory_id="t")
    for _ in range(3):
        step(s, runner)
    batch = s.schedule()  # in flight when the abort arrives
    partial = s.abort("r")
    assert partial.finish_reason == "abort" and len(partial.output_ids) == 3
    assert s.on_batch_done(batch, {"r": 0}) == []
    s.check_integrity()
    s.add_request("r2", partial.prompt_ids + partial.output_ids, params(1), trajectory_id="t")
    batch, _ = step(s, runner)
    assert batch.aborted == ["r"] and batch.items[0].positions == [5]


def test_stop_token_and_stop_string_finish():
    s, runner = make_scheduler(), FakeRunner()
    s.add_request("tok", [1], params(50, stop_token_ids=tuple(range(5))))  # every sample stops
    s.add_request("str", [2], params(50))
    batch = s.schedule()
    finished = runner.run(s, batch, stopped={"str"})
    assert {f.request_id: f.finish_reason for f in finished} == {"tok": "stop", "str": "stop"}
    s.check_integrity()


def test_priority_change_applies_at_the_next_boundary():
    s, runner = make_scheduler(), FakeRunner()
    s.add_request("r", [1, 2], params(5), priority=Priority.LOW, trajectory_id="t")
    step(s, runner)
    s.set_priority("t", Priority.HIGH)
    assert s.requests["r"].priority == Priority.LOW
    step(s, runner)
    assert s.requests["r"].priority == Priority.HIGH


def test_demotion_is_shortest_context_first_and_promotes_back():
    s, runner = (
        make_scheduler(kv_capacity_tokens=24, demotion=True, max_running_requests=1),
        FakeRunner(),
    )
    s.add_request("long", list(range(12)), params(3), priority=Priority.HIGH, trajectory_id="long")
    s.add_request(
        "short", [1, 2, 3, 4, 5, 6], params(3), priority=Priority.HIGH, trajectory_id="short"
    )
    s.add_request("mid", list(range(8)), params(3), priority=Priority.HIGH, trajectory_id="mid")
    finished = []
    while "long" not in finished:
        batch, done = step(s, runner)
        # demand 26..29 > 24: demoting "short" (6) is enough while "long" grows to 15
        assert {k for k, t in s.cache.trajectories.items() if t.demoted} == {"short"}
        assert s.requests["short"].priority == Priority.LOW
        finished += [f.request_id for f in done]
    s.release_trajectory("long")
    step(s, runner)
    assert not any(t.demoted for t in s.cache.trajectories.values())
    assert s.requests["short"].priority == Priority.HIGH
    assert (s.stats().demotions, s.stats().promotions) == (1, 1)


def test_lone_request_that_outgrows_the_pool_ends_with_length():
    s, runner = make_scheduler(kv_capacity_tokens=8), FakeRunner()
    s.add_request("r", [1, 2, 3, 4], params(100))
    outputs = run_to_completion(s, runner)
    assert outputs["r"].finish_reason == "length" and len(outputs["r"].output_ids) == 5


def test_request_validation():
    s = make_scheduler(kv_capacity_tokens=8)
    with pytest.raises(ValueError, match="exceeds"):
        s.add_request("big", list(range(20)), params())
    with pytest.raises(ValueError, match="empty"):
        s.add_request("e", [], params())
    s.add_request("a", [1], params())
    with pytest.raises(ValueError, match="duplicate"):
        s.add_request("a", [1], params())
    s.schedule()
    with pytest.raises(RuntimeError):
        s.schedule()


def test_group_with_one_prompt_shares_its_pages():
    s, runner = make_scheduler(page_size=2, kv_capacity_tokens=64), FakeRunner()
    prompt = [7, 7, 8, 8, 9, 9, 1, 2]
    for i in range(4):
        s.add_request(f"g{i}", prompt, params(3), priority=Priority.HIGH)
    step(s, runner)  # all four prefill in one batch, then their whole pages are deduplicated
    batch, _ = step(s, runner)
    prefixes = {tuple(item.context_slots[:8]) for item in batch.items}
    assert len(batch.items) == 4 and len(prefixes) == 1
    # 8 shared prompt tokens + per request one private page for the decoded tokens
    assert s.stats().kv_tokens["in_use"] == 8 + 4 * 2
    s.add_request("late", prompt, params(1))
    batch, _ = step(s, runner)
    late = next(i for i in batch.items if i.request_id == "late")
    # the last token must be computed for its logits, so only 3 of the 4 pages can hit
    assert late.positions == [6, 7]


def test_lru_baseline_lets_a_low_request_evict_high_kv():
    s, runner = make_scheduler(kv_capacity_tokens=8, cache_policy="lru"), FakeRunner()
    s.start_trajectory("t", Priority.HIGH)
    s.add_request("h", [1, 2, 3, 4, 5], params(1), priority=Priority.HIGH, trajectory_id="t")
    run_to_completion(s, runner)
    s.add_request("l", [9, 9, 9, 9, 9], params(1), priority=Priority.LOW)
    batch, _ = step(s, runner)
    assert [i.request_id for i in batch.items] == ["l"]
    assert s.stats().evicted_tokens == {"unused": 5, "low_ref": 0, "high_ref": 0}


def test_prefix_export_and_import_between_schedulers():
    source, runner = make_scheduler(page_size=2), FakeRunner()
    source.add_request("a", [1, 2, 3, 4, 5, 6, 7], params(1))
    run_to_completion(source, runner)
    exported = source.cached_prefix_slots([1, 2, 3, 4, 5, 6, 7, 8])
    assert len(exported) == 6

    target = make_scheduler(page_size=2)
    target.add_request("warm", [1, 2, 9], params(1))
    run_to_completion(target, FakeRunner())  # caches [1, 2]: only 4 tokens are new here
    target.start_trajectory("t", Priority.HIGH)
    new_slots, offset = target.reserve_prefix([1, 2, 3, 4, 5, 6])
    assert offset == 2 and len(new_slots) == 4
    with pytest.raises(RuntimeError):
        target.schedule()  # no batch while a reservation is open
    assert target.commit_prefix([1, 2, 3, 4, 5, 6], new_slots, offset, trajectory_id="t") == 6
    assert target.cached_prefix_slots([1, 2, 3, 4, 5, 6])[2:] == new_slots
    target.schedule()  # the boundary applies the trajectory's reference
    assert target.stats().kv_tokens["high_ref"] == 6
    target.check_integrity()


def test_import_reserves_only_what_unused_and_low_ref_kv_allow():
    s, runner = make_scheduler(kv_capacity_tokens=8), FakeRunner()
    s.start_trajectory("t", Priority.HIGH)
    s.add_request("h", [1, 2, 3, 4, 5], params(1), priority=Priority.HIGH, trajectory_id="t")
    run_to_completion(s, runner)  # 5 high_ref tokens, 3 free slots
    new_slots, offset = s.reserve_prefix([9] * 6)
    assert (len(new_slots), offset) == (3, 0)
    assert s.commit_prefix([9] * 6, new_slots, offset) == 3
    s.check_integrity()


def test_request_without_priority_keeps_its_trajectorys():
    s, runner = make_scheduler(), FakeRunner()
    s.start_trajectory("t", Priority.PROMOTED)
    s.add_request("a", [1], params(5), trajectory_id="t")
    s.add_request("b", [2], params(5), priority=Priority.PROMOTED)
    s.add_request("c", [3], params(5))
    step(s, runner)
    assert [s.requests[r].priority for r in "abc"] == [
        Priority.PROMOTED,
        Priority.PROMOTED,
        Priority.LOW,
    ]


def test_memory_stalls_sum_over_engines_by_priority():
    """vLLM's stats have none (empty): they add nothing rather than zeros under other keys."""
    a, b, runner = make_scheduler(kv_capacity_tokens=4), make_scheduler(kv_capacity_tokens=4), FakeRunner()
    for s in (a, b):
        s.add_request("busy", [1, 2], params(2), priority=Priority.LOW)
        step(s, runner)
        s.add_request("big", [3, 4, 5], params(1), priority=Priority.LOW)  # 2 + 1 running, 3 more: no room
        step(s, runner)
    vllm_like = replace(a.stats(), memory_stalls={})
    assert summed_memory_stalls([a.stats(), b.stats(), vllm_like]) == {"promoted": 0, "high": 0, "low": 2}
    assert summed_memory_stalls([]) == {}
