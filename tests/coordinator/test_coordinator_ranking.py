"""GroupRanking's incremental critical set always equals the first k of the sorted order."""

from hypothesis import given, settings
from hypothesis import strategies as st

from venusrl.coordinator.ranking import GroupRanking

OPS = st.lists(
    st.tuples(st.sampled_from(["upsert", "remove", "k", "read"]), st.integers(0, 15), st.integers(0, 20)),
    max_size=120,
)


@settings(max_examples=100, deadline=None)
@given(OPS)
def test_critical_set_matches_brute_force(ops):
    ranking = GroupRanking()
    model: dict[int, tuple[float, int]] = {}
    k = 0
    published = frozenset()
    for op, group, value in ops:
        if op == "upsert":
            ranking.upsert(group, float(value), seq=group)
            model[group] = (float(value), group)
        elif op == "remove":
            ranking.remove(group)
            model.pop(group, None)
        elif op == "k":
            k = value
            ranking.set_critical_count(k)
        order = [g for g, _ in sorted(model.items(), key=lambda item: (item[1], item[0]))]
        assert ranking.order() == order
        expected = frozenset(order[:k])
        assert ranking.changed == (expected != published)
        if op == "read":
            published = ranking.critical()
            assert published == expected
            assert not ranking.changed


def test_the_ranking_gives_each_groups_current_key():
    ranking = GroupRanking()
    ranking.upsert(1, 5.0, seq=1)
    ranking.upsert(1, 3.0, seq=1)
    assert ranking.key(1) == 3.0 and ranking.key(2) is None
    ranking.remove(1)
    assert ranking.key(1) is None
