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
