from hypothesis import given, settings
from hypothesis import strategies as st

from venusrl.engine.demotion import choose_demoted


def test_nothing_demoted_when_demand_fits():
    assert choose_demoted({"a": 5, "b": 5}, {"a": True, "b": True}, capacity_tokens=10) == set()


def test_shortest_context_first_until_the_rest_fit():
    contexts = {"long": 50, "short": 10, "mid": 30, "tiny": 5}
    demotable = dict.fromkeys(contexts, True)
    assert choose_demoted(contexts, demotable, capacity_tokens=80) == {"tiny", "short"}
    assert choose_demoted(contexts, demotable, capacity_tokens=60) == {"tiny", "short", "mid"}


def test_promoted_trajectories_are_never_demoted():
    contexts = {"promoted": 5, "high": 40}
    demotable = {"promoted": False, "high": True}
    assert choose_demoted(contexts, demotable, capacity_tokens=20) == {"high"}


def test_shared_prompt_pages_count_once():
    """Four trajectories of a group share a 100-token prompt and own 10 tokens each: the
    demand is 140, not 440, so nothing is demoted in a 150-token pool."""
    contexts = dict.fromkeys("abcd", 110)
    demotable = dict.fromkeys("abcd", True)
    exclusive = dict.fromkeys("abcd", 10)
    assert choose_demoted(contexts, demotable, 150, exclusive, demand=140) == set()
    # in a 125-token pool, demoting two frees their 20 private tokens and the rest fits
    assert choose_demoted(contexts, demotable, 125, exclusive, demand=140) == {"a", "b"}


def test_idle_first_pauses_tool_waiting_trajectories_before_generating_ones():
    """ThunderAgent's order: programs with no request in the engine (waiting on a tool) go
    first, smallest first, even when a generating one is shorter."""
    contexts = {"gen_short": 10, "gen_long": 50, "idle_mid": 30, "idle_long": 40}
    demotable = dict.fromkeys(contexts, True)
    active = {"gen_short", "gen_long"}
    assert choose_demoted(contexts, demotable, 100, active=active) == {"idle_mid"}
    assert choose_demoted(contexts, demotable, 60, active=active) == {"idle_mid", "idle_long"}
    assert choose_demoted(contexts, demotable, 50, active=active) == {"idle_mid", "idle_long", "gen_short"}
    # without `active`, shortest first regardless of activity (the paper's order)
    assert choose_demoted(contexts, demotable, 100) == {"gen_short", "idle_mid"}


@st.composite
def demand_cases(draw):
    """HIGH/PROMOTED contexts, what demoting each frees (at most its context), the distinct
    demand (at least the largest context, at most their sum), and a capacity around it."""
    keys = draw(st.lists(st.text("abcdefgh", min_size=1, max_size=3), min_size=1, max_size=8, unique=True))
    contexts = {k: draw(st.integers(1, 60)) for k in keys}
    exclusive = {k: draw(st.integers(0, contexts[k])) for k in keys}
    demand = draw(st.integers(max(contexts.values()), sum(contexts.values())))
    demotable = {k: draw(st.booleans()) for k in keys}
    active = draw(st.none() | st.sets(st.sampled_from(keys)))
    capacity = draw(st.integers(0, sum(contexts.values()) + 10))
    return contexts, demotable, capacity, exclusive, demand, active


@settings(max_examples=300, deadline=None)
@given(case=demand_cases())
def test_demotes_the_shortest_prefix_of_its_order_that_fits(case):
    """Only HIGH ones are demoted; nothing when the demand fits; otherwise exactly the first
    m of the order (idle first with `active`, shortest context first, start order on ties)
    for the least m whose freed tokens bring the demand within capacity, or all of them."""
    contexts, demotable, capacity, exclusive, demand, active = case
    demoted = choose_demoted(contexts, demotable, capacity, exclusive, demand, active)
    assert all(demotable[k] for k in demoted)
    order = sorted((k for k in contexts if demotable[k]),
                   key=lambda k: (active is not None and k in active, contexts[k]))  # fmt: skip
    m = 0
    left = demand
    while left > capacity and m < len(order):
        left -= exclusive[order[m]]
        m += 1
    assert demoted == set(order[:m])
    if demoted:
        assert demand > capacity
    if demand - sum(exclusive[k] for k in demoted) > capacity:
        assert demoted == set(order)  # nothing HIGH left to demote
