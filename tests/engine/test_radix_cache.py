from hypothesis import given, settings
from hypothesis import strategies as st

from venusrl.engine.kv_slots import PageAllocator
from venusrl.engine.radix_cache import RadixCache, Tier
from venusrl.types import Priority


def make_cache(capacity=64, page=2, policy="tiers"):
    return RadixCache(PageAllocator(capacity, page), policy)


def put(cache, tokens):
    """Allocate private pages for ``tokens`` and insert them; frees the duplicate pages like
    the scheduler does. Returns the deepest node."""
    pages = cache.allocator.alloc(cache.allocator.pages_for(len(tokens)))
    slots = [s for p in pages for s in cache.allocator.page_slots(p)]
    existing, node = cache.insert(tokens, slots)
    cache.allocator.free(cache.allocator.pages_of(slots[:existing]))
    return node


def held(cache, locks=None):
    pages = cache.check_integrity(locks or {})
    cache.allocator.check_integrity(pages)
    return pages


def start(cache, key, priority, tokens):
    cache.queue_start(key, priority)
    cache.apply_pending()
    cache.set_anchor(key, put(cache, tokens))


def test_match_is_page_aligned_and_shares_prefixes():
    cache = make_cache(page=2)
    put(cache, [1, 2, 3, 4, 5, 6])
    match = cache.match_prefix([1, 2, 3, 4, 5, 9, 9])
    assert len(match.slots) == 4  # tokens 1..4; token 5 alone is half a page
    first_slots = match.slots
    existing, _ = cache.insert([1, 2, 3, 4, 7, 8], [40, 41, 42, 43, 44, 45])
    assert existing == 4  # the caller keeps (and frees) its slots 40..43
    assert cache.match_prefix([1, 2, 3, 4, 7, 8]).slots == first_slots + [44, 45]
    assert sorted(cache.check_integrity({})) == sorted([s // 2 for s in first_slots[::2]] + [0, 22])


def test_lock_protects_and_counts_are_incremental():
    cache = make_cache(page=2)
    node = put(cache, [1, 2, 3, 4])
    assert cache.evictable_tokens(Tier.UNUSED) == 4
    cache.lock(node)
    assert cache.evictable_tokens(Tier.HIGH_REF) == 0
    assert cache.evict(4, Tier.HIGH_REF) == 0
    held(cache, {node: 1})
    cache.unlock(node)
    assert cache.evict(4, Tier.UNUSED) == 4
    assert cache.allocator.free_pages == cache.allocator.num_pages
    held(cache)


def test_tiers_order_and_low_request_never_evicts_high_ref():
    cache = make_cache(capacity=64, page=1)
    start(cache, "hi", Priority.HIGH, [1, 1])
    start(cache, "lo", Priority.LOW, [2, 2])
    put(cache, [3, 3])
    assert cache.tier_tokens() == [2, 2, 2]
    assert cache.evict(100, Tier.LOW_REF) == 4  # a LOW request: unused and low_ref only
    assert cache.evicted_tokens == [2, 2, 0]
    assert len(cache.match_prefix([1, 1]).slots) == 2
    assert cache.trajectories["lo"].anchor is None and cache.trajectories["lo"].context_tokens == 0
    assert cache.evict(1, Tier.HIGH_REF) == 2
    assert cache.evicted_tokens == [2, 2, 2]
    held(cache)


def test_lru_inside_a_tier():
    cache = make_cache(page=1)
    put(cache, [1])
    put(cache, [2])
    put(cache, [3])
    cache.match_prefix([1])  # touch: now [2] is least recently used
    cache.evict(1, Tier.UNUSED)
    assert [len(cache.match_prefix([t]).slots) for t in (1, 2, 3)] == [1, 0, 1]


def test_mutations_wait_for_the_iteration_boundary():
    cache = make_cache(page=1)
    start(cache, "t", Priority.HIGH, [5, 6])
    cache.queue_set_priority("t", Priority.LOW)
    assert cache.tier_tokens() == [0, 0, 2]
    cache.apply_pending()
    assert cache.tier_tokens() == [0, 2, 0]
    cache.queue_release("t")
    assert cache.tier_tokens() == [0, 2, 0]
    assert cache.apply_pending() == ["t"]
    assert cache.tier_tokens() == [2, 0, 0]
    held(cache)


def test_demotion_moves_references_to_low_ref():
    cache = make_cache(page=1)
    start(cache, "t", Priority.HIGH, [5, 6])
    cache.set_demoted("t", True)
    assert cache.trajectories["t"].effective == Priority.LOW
    assert cache.tier_tokens() == [0, 2, 0]
    cache.set_demoted("t", False)
    assert cache.tier_tokens() == [0, 0, 2]


def test_demoted_changes_counts_every_change_of_the_demoted_set_and_nothing_else():
    """Readers of the demoted set (the engine publishing it) rescan only when this moved."""
    cache = make_cache(page=1)
    start(cache, "t", Priority.HIGH, [5, 6])
    cache.set_demoted("t", False)  # already not demoted
    cache.queue_set_priority("t", Priority.LOW)
    cache.apply_pending()
    assert cache.demoted_changes == 0
    cache.set_demoted("t", True)
    cache.set_demoted("t", True)
    cache.queue_set_priority("t", Priority.HIGH)  # stays demoted
    cache.apply_pending()
    assert cache.demoted_changes == 1
    cache.set_demoted("t", False)
    cache.set_demoted("t", True)
    assert cache.demoted_changes == 3
    cache.queue_release("t")  # a demoted one leaves the set
    cache.apply_pending()
    assert cache.demoted_changes == 4 and not cache.trajectories


def test_lru_policy_ignores_trajectory_references():
    cache = make_cache(page=1, policy="lru")
    start(cache, "hi", Priority.HIGH, [1])
    put(cache, [2])
    assert cache.tier_tokens() == [2, 0, 0]
    cache.evict(1, Tier.UNUSED)  # plain LRU: the older HIGH-referenced node goes first
    assert cache.match_prefix([1]).slots == [] and len(cache.match_prefix([2]).slots) == 1


def test_split_keeps_counts_and_anchor():
    cache = make_cache(page=1)
    start(cache, "t", Priority.LOW, [1, 2, 3, 4])
    node = cache.match_prefix([1, 2, 9]).node  # splits [1,2,3,4] after two tokens
    cache.lock(node)
    assert cache.trajectories["t"].context_tokens == 4
    assert cache.tier_tokens() == [0, 2, 0]  # [3,4] evictable, [1,2] locked
    held(cache, {node: 1})
    assert cache.evict(10, Tier.LOW_REF) == 2
    assert cache.trajectories["t"].anchor is node and cache.trajectories["t"].context_tokens == 2
    cache.unlock(node)
    held(cache)


ops = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "insert",
                "lock",
                "unlock",
                "evict_low",
                "evict_high",
                "traj",
                "prio",
                "release",
                "apply",
            ]
        ),
        st.lists(st.integers(0, 2), min_size=1, max_size=8),
        st.integers(0, 3),
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(ops=ops, page=st.integers(1, 3), policy=st.sampled_from(["tiers", "lru"]))
def test_random_operations_keep_invariants(ops, page, policy):
    cache = make_cache(capacity=48, page=page, policy=policy)
    locks: dict = {}
    for op, tokens, n in ops:
        tokens = tokens[: len(tokens) - len(tokens) % page]
        key = f"t{n}"
        if op == "insert" and tokens and cache.allocator.free_pages * page >= len(tokens):
            put(cache, tokens)
        elif op == "lock":
            node = cache.match_prefix(tokens).node
            if node is not cache.root:
                cache.lock(node)
                locks[node] = locks.get(node, 0) + 1
        elif op == "unlock" and locks:
            node = next(iter(locks))
            cache.unlock(node)
            locks[node] -= 1
            if not locks[node]:
                del locks[node]
        elif op in ("evict_low", "evict_high"):
            max_tier = Tier.LOW_REF if op == "evict_low" else Tier.HIGH_REF
            high_before = cache.evicted_tokens[Tier.HIGH_REF]
            budget = cache.evictable_tokens(max_tier)
            freed = cache.evict(n * page, max_tier)
            assert freed <= budget and (freed >= n * page or freed == budget)
            if max_tier == Tier.LOW_REF:
                assert cache.evicted_tokens[Tier.HIGH_REF] == high_before
        elif op == "traj":
            cache.queue_start(key, Priority(n % 3))
        elif op == "prio":
            cache.queue_set_priority(key, Priority(n % 3))
        elif op == "release":
            cache.queue_release(key)
        elif op == "apply":
            cache.apply_pending()
            node = cache.match_prefix(tokens).node
            if key in cache.trajectories and node is not cache.root:
                cache.set_anchor(key, node)
        held(cache, locks)


@settings(max_examples=40, deadline=None)
@given(
    touches=st.lists(st.integers(0, 7), max_size=30),
    refs=st.lists(st.tuples(st.integers(0, 7), st.sampled_from(list(Priority))), max_size=8),
    evict=st.integers(1, 8),
)
def test_lru_policy_matches_a_reference_lru(touches, refs, evict):
    """With policy "lru", trajectory references change nothing: eviction takes the least
    recently used unlocked entries, exactly like a plain LRU list."""
    cache = make_cache(capacity=16, page=1, policy="lru")
    recency = list(range(8))  # least recent first
    for key in range(8):
        put(cache, [key])
    for i, (key, priority) in enumerate(refs):
        cache.queue_start(i, priority)
        cache.apply_pending()
        cache.set_anchor(i, cache.match_prefix([key]).node)
        recency.remove(key)
        recency.append(key)
    for key in touches:
        cache.match_prefix([key])
        recency.remove(key)
        recency.append(key)
    cache.evict(evict, Tier.UNUSED)
    survivors = [key for key in range(8) if cache.match_prefix([key]).slots]
    assert sorted(survivors) == sorted(recency[evict:])
