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
