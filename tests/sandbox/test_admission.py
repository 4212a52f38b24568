"""Algorithm 1 and placement as pure functions: exact cases and properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from venusrl.sandbox.admission import (
    SandboxMemory,
    decide,
    decide_declared,
    estimate_active_growth,
    growth_rate,
    safe_after_oom,
)
from venusrl.sandbox.placement import NodeView, choose_migration, rank_nodes
from venusrl.sandbox.profiles import ColdStartProfiles

MiB = float(1 << 20)
sizes = st.floats(min_value=0, max_value=1e12, allow_nan=False)
positive = st.floats(min_value=1.0, max_value=1e12, allow_nan=False)
alphas = st.floats(min_value=0.01, max_value=10, allow_nan=False)


def test_threshold_matches_the_paper_formula():
    d = decide(m_total=1000 * MiB, m_used=500 * MiB, g_active=100 * MiB, g_candidate=50 * MiB, alpha=2.0)
    assert d.headroom == pytest.approx(300 * MiB)
    assert d.threshold == pytest.approx(0.7)
    assert d.admit  # 500 < 700
    assert not decide(1000 * MiB, 700 * MiB, 100 * MiB, 50 * MiB, 2.0).admit  # 700 is not < 700


@given(positive, sizes, sizes, sizes, alphas)
def test_admit_iff_used_below_threshold(m_total, m_used, g_active, g_candidate, alpha):
    d = decide(m_total, m_used, g_active, g_candidate, alpha)
    assert d.admit == (m_used < d.threshold * m_total)
    assert d.threshold <= 1.0
    if m_used >= m_total:
        assert not d.admit


@given(positive, sizes, sizes, sizes, sizes, alphas)
def test_more_predicted_growth_never_admits_more(m_total, m_used, g_active, g_candidate, extra, alpha):
    low = decide(m_total, m_used, g_active, g_candidate, alpha)
    high = decide(m_total, m_used, g_active + extra, g_candidate, alpha)
    assert high.threshold <= low.threshold
    assert not (high.admit and not low.admit)


@given(positive, sizes, sizes, sizes, alphas)
def test_admission_and_oom_recovery_agree(m_total, m_used, g_active, g_candidate, alpha):
    """A node that would admit a candidate is, without it, safe after an OOM."""
    if decide(m_total, m_used, g_active, g_candidate, alpha).admit:
        assert safe_after_oom(m_total, m_used, g_active, alpha)


def test_headroom_floor_caps_the_threshold():
    d = decide(m_total=1000.0, m_used=900.0, g_active=0.0, g_candidate=1.0, alpha=1.0, floor=0.05)
    assert d.threshold == pytest.approx(0.95) and d.admit
    assert not decide(1000.0, 960.0, 0.0, 1.0, 1.0, floor=0.05).admit
    assert decide(1000.0, 960.0, 0.0, 1.0, 1.0).admit  # floor 0: Algorithm 1 as printed
    assert not safe_after_oom(1000.0, 960.0, 0.0, 1.0, floor=0.05)


@given(positive, sizes, sizes, sizes, alphas, st.floats(min_value=0, max_value=0.99))
def test_floor_never_admits_more_and_agrees_with_recovery(m_total, m_used, g_active, g_candidate, alpha, floor):
    with_floor = decide(m_total, m_used, g_active, g_candidate, alpha, floor)
    assert not (with_floor.admit and not decide(m_total, m_used, g_active, g_candidate, alpha).admit)
    assert with_floor.threshold <= 1.0 - floor + 1e-12
    if with_floor.admit:
        assert safe_after_oom(m_total, m_used, g_active, alpha, floor)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        (dict(m_total=0, m_used=0, g_active=0, g_candidate=0, alpha=1), "m_total"),
        (dict(m_total=1, m_used=-1, g_active=0, g_candidate=0, alpha=1), "m_used"),
        (dict(m_total=1, m_used=0, g_active=-1, g_candidate=0, alpha=1), "g_active"),
        (dict(m_total=1, m_used=0, g_active=0, g_candidate=-1, alpha=1), "g_candidate"),
        (dict(m_total=1, m_used=0, g_active=0, g_candidate=0, alpha=0), "alpha"),
        (dict(m_total=1, m_used=0, g_active=0, g_candidate=0, alpha=1, floor=1.0), "floor"),
    ],
)
def test_bad_measurements_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        decide(**kwargs)


def test_declared_admission_is_the_static_baseline():
    assert decide_declared(2048 * MiB, 1536 * MiB, 512 * MiB).admit
    assert not decide_declared(2048 * MiB, 2048 * MiB, 512 * MiB).admit


@given(st.floats(min_value=-1e9, max_value=1e9), st.floats(min_value=0, max_value=1e9),
       st.integers(min_value=2, max_value=20))
def test_growth_rate_recovers_a_linear_slope(slope, start, n):
    samples = [(t * 0.1, start + slope * t * 0.1) for t in range(n)]
    rate = growth_rate(samples, now=(n - 1) * 0.1, window=10.0)
    assert rate == pytest.approx(max(0.0, slope), rel=1e-6, abs=1e-3)


def test_growth_rate_ignores_samples_outside_the_window():
    samples = [(0.0, 0.0), (1.0, 1000.0), (10.0, 5000.0), (11.0, 5000.0)]
    assert growth_rate(samples, now=11.0, window=2.0) == 0.0
    assert growth_rate(samples[:2], now=1.0, window=2.0) == pytest.approx(1000.0)
    assert growth_rate([(0.0, 5.0)], now=0.0, window=1.0) == 0.0


def test_active_growth_counts_cold_starts_and_running_rates():
    cold = SandboxMemory(((0.0, 10 * MiB),), started_at=0.0, cold_start_bytes=50 * MiB, cold_start_s=2.0)
    warm = SandboxMemory(((8.0, 100 * MiB), (9.0, 110 * MiB), (10.0, 120 * MiB)), 0.0, 50 * MiB, 2.0)
    assert estimate_active_growth([cold], now=1.0, window=2.0, t_react=1.0) == pytest.approx(40 * MiB)
    assert estimate_active_growth([warm], now=10.0, window=2.0, t_react=0.5) == pytest.approx(5 * MiB)
    assert estimate_active_growth([], now=0.0, window=1.0, t_react=1.0) == 0.0


def _node(node_id, used, groups=(), alive=True, total=1000.0, threshold=0.9):
    return NodeView(node_id, alive, total, used, threshold, frozenset(groups))


def test_placement_prefers_the_groups_node_then_headroom():
    nodes = [_node("a", 100), _node("b", 800, groups={"g"}), _node("c", 50), _node("d", 0, alive=False)]
    assert rank_nodes(nodes, "g") == ["b", "c", "a"]
    assert rank_nodes(nodes, None) == ["c", "a", "b"]


node_views = st.lists(
    st.builds(_node, st.text("abcdef", min_size=1, max_size=3), st.floats(0, 1000), st.just(()), st.booleans()),
    max_size=6,
    unique_by=lambda n: n.node_id,
)


@given(node_views, st.one_of(st.none(), st.sampled_from(["g"])))
def test_placement_ranks_exactly_the_live_nodes(nodes, group):
    assert sorted(rank_nodes(nodes, group)) == sorted(n.node_id for n in nodes if n.alive)


@given(st.lists(st.tuples(st.text("xyz", min_size=1, max_size=4), st.floats(0, 1000)), max_size=8,
                unique_by=lambda s: s[0]), node_views)
def test_migration_moves_the_largest_to_a_node_that_fits(sandboxes, targets):
    choice = choose_migration(sandboxes, targets)
    if choice is None:
        if sandboxes:
            largest = max(size for _, size in sandboxes)
            assert all(not t.alive or t.headroom < largest for t in targets)
        return
    sandbox_id, node_id = choice
    size = dict(sandboxes)[sandbox_id]
    assert size == max(s for _, s in sandboxes)
    target = next(t for t in targets if t.node_id == node_id)
    assert target.alive and target.headroom >= size


def test_profiles_learn_persist_and_reject_bad_input(tmp_path):
    profiles = ColdStartProfiles()
    key = ColdStartProfiles.key("numpy", share_pages=True)
    assert profiles.estimate(key, default=7.0) == 7.0
    for grown in (3.0, 9.0, 4.0):
        profiles.observe(key, grown)
    assert profiles.estimate(key, default=7.0) == 9.0
    path = tmp_path / "profiles.json"
    profiles.save(path)
    assert ColdStartProfiles.load(path).estimate(key, 0.0) == 9.0
    assert ColdStartProfiles.load(tmp_path / "missing.json").observations == {}
    with pytest.raises(ValueError, match="grown_bytes"):
        profiles.observe(key, -1.0)
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="profile file"):
        ColdStartProfiles.load(path)
