"""The hold book behind vLLM's three-tier residency (engine/kv_holds.py), without vLLM: what a
hold hands back, the eviction order, demotion and the recomputation count; and, as property
tests, that no block is handed back more often than it was held and that eviction order
respects the tiers."""

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from venusrl.engine.kv_holds import HoldBook, HoldTier, high_demand, max_hold_tier
from venusrl.types import Priority


def test_a_hold_replaces_the_last_and_ends_when_taken_or_released():
    book = HoldBook()
    book.start("t", Priority.HIGH)
    assert book.keep("t", (1, 2), 64) == ()
    assert book.keep("t", (1, 2, 3), 96) == (1, 2)  # the caller took (1, 2, 3) first, then hands (1, 2) back
    assert book.held_tokens == [0, 96]
    assert book.take("t") == (1, 2, 3) and book.take("t") == ()
    book.keep("t", (4,), 32)
    assert book.release("t") == (4,) and "t" not in book and book.release("t") == ()
    book.check()


def test_low_holds_go_before_high_ones_least_recently_used_first():
    book = HoldBook()
    for key, priority in [("h1", Priority.HIGH), ("l1", Priority.LOW), ("p", Priority.PROMOTED),
                          ("l2", Priority.LOW), ("h2", Priority.HIGH)]:
        book.start(key, priority)
    for block, key in enumerate(["h1", "l1", "p", "l2", "h2"]):
        book.keep(key, (block,), 32)
    assert list(book.victims(HoldTier.HIGH)) == ["l1", "l2", "h1", "p", "h2"]
    assert list(book.victims(HoldTier.LOW)) == ["l1", "l2"]  # a LOW request never releases a HIGH hold
    assert list(book.victims(HoldTier.HIGH, exclude="l1")) == ["l2", "h1", "p", "h2"]
    assert book.evict("l1") == (1,) and book.evicted_tokens == [32, 0]


def test_who_may_release_what():
    assert max_hold_tier(Priority.LOW) == HoldTier.LOW
    assert max_hold_tier(Priority.HIGH) == max_hold_tier(Priority.PROMOTED) == HoldTier.HIGH
    assert max_hold_tier(Priority.LOW, alone=True) == HoldTier.HIGH  # the iteration's only work


def test_a_priority_change_or_a_demotion_moves_the_hold_between_tiers():
    book = HoldBook()
    book.start("t", Priority.LOW)
    book.keep("t", (7, 8), 64)
    assert book.held_tokens == [64, 0]
    book.start("t", Priority.HIGH)  # set_priority
    assert book.held_tokens == [0, 64] and book.effective("t") == Priority.HIGH
    assert book.rebalance({"t": 64}, {"t": 64}, demand=64, capacity_tokens=32) == {"t"}
    assert book.held_tokens == [64, 0] and book.effective("t") == Priority.LOW and book.demoted() == {"t"}
    assert book.rebalance({"t": 64}, {"t": 64}, demand=64, capacity_tokens=64) == {"t"}  # promoted back
    assert book.held_tokens == [0, 64] and (book.demotions, book.promotions) == (1, 1)
    book.check()


def test_shortest_high_context_is_demoted_and_promoted_never():
    book = HoldBook()
    for key, priority in [("short", Priority.HIGH), ("long", Priority.HIGH), ("promoted", Priority.PROMOTED)]:
        book.start(key, priority)
    contexts = {"short": 64, "long": 256, "promoted": 32}
    assert book.rebalance(contexts, contexts, demand=352, capacity_tokens=300) == {"short"}
    assert book.rebalance(contexts, contexts, demand=352, capacity_tokens=40) == {"long"}  # "short" stays demoted
    assert book.demoted() == {"short", "long"}


def test_shared_blocks_count_once_in_the_high_demand():
    """Two trajectories of a group share prompt blocks 1 and 2: the demand counts them once;
    demoting one frees only its own block and its uncached tail."""
    demand, exclusive = high_demand({"a": {1, 2, 3}, "b": {1, 2, 4}}, {"a": 5, "b": 0}, block_size=32)
    assert demand == 4 * 32 + 5 and exclusive == {"a": 37, "b": 32}


def test_recomputed_tokens_are_those_computed_before_beyond_the_hits():
    book = HoldBook()
    book.start("t", Priority.HIGH)
    assert book.admitted("t", 100, 0) == 0  # first turn: nothing computed before
    book.computed("t", 150)
    book.keep("t", (1, 2, 3, 4), 128)
    assert book.context_tokens("t") == 150  # its demand: all it computed, not only what is held
    assert book.admitted("t", 200, 128) == 22  # 150 computed before, 128 of them hit
    book.clear()  # the prefix cache was reset: nothing counts as computed
    assert book.admitted("t", 200, 0) == 0 and book.recomputed_tokens == 22


keys = st.sampled_from("abcde")
priorities = st.sampled_from(list(Priority))
ops = st.lists(st.one_of(
    st.tuples(st.just("start"), keys, priorities),
    st.tuples(st.just("release"), keys),
    st.tuples(st.just("keep"), keys, st.lists(st.integers(0, 12), max_size=5, unique=True)),
    st.tuples(st.just("take"), keys),
    st.tuples(st.just("evict"), st.sampled_from(list(HoldTier)), st.one_of(st.none(), keys), st.integers(1, 3)),
    st.tuples(st.just("demote"), st.sets(keys), st.integers(0, 400)),
    st.tuples(st.just("clear"),),
), max_size=60)


@settings(max_examples=150, deadline=None)
@given(ops=ops)
def test_holds_are_never_handed_back_twice_and_eviction_respects_tiers(ops):
    """The caller's side of the references (what vLLM's block pool would see from the book:
    one per block held, one less per block handed back) never goes negative and always equals
    the book's; every eviction order is LOW before HIGH, LRU inside a tier, within the
    requester's tier and never its own trajectory."""
    book, pool = HoldBook(), Counter()

    def hand_back(blocks):
        pool.subtract(blocks)
        assert all(n >= 0 for n in pool.values()), f"a block handed back more often than held: {pool}"

    for op in ops:
        kind = op[0]
        if kind == "start":
            book.start(op[1], op[2])
        elif kind == "release":
            hand_back(book.release(op[1]))
        elif kind == "keep" and op[1] in book:
            pool.update(op[2])  # the caller references the new blocks before the old are handed back
            hand_back(book.keep(op[1], tuple(op[2]), 32 * len(op[2])))
        elif kind == "take":
            hand_back(book.take(op[1]))
        elif kind == "evict":
            _, max_tier, exclude, count = op
            order = list(book.victims(max_tier, exclude))
            tiers = [book.trajectories[k].tier for k in order]
            assert tiers == sorted(tiers) and all(t <= max_tier for t in tiers) and exclude not in order
            for tier in set(tiers):
                uses = [book.trajectories[k].last_use for k in order if book.trajectories[k].tier == tier]
                assert uses == sorted(uses)
            for key in order[:count]:
                hand_back(book.evict(key))
        elif kind == "demote":
            contexts = {k: book.held(k)[1] + 1 for k in op[1] if k in book and book.trajectories[k].priority != Priority.LOW}
            book.rebalance(contexts, contexts, sum(contexts.values()), op[2])
        elif kind == "clear":
            hand_back(book.clear())
        book.check()
        assert +pool == book.refs
