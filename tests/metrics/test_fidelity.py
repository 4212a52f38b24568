"""The fidelity report's version-span heatmap (the paper's Fig. 12) and its long-tail
discard rate."""

from hypothesis import given
from hypothesis import strategies as st

from venusrl.metrics.fidelity import BIN_LABELS, Attempt, attempts, version_span_heatmap
from venusrl.metrics.figures import draw_reward_curves, draw_version_heatmaps

run = st.lists(st.builds(Attempt, st.integers(1, 5000), st.one_of(st.none(), st.integers(0, 4))),
               min_size=1, max_size=200)


@given(st.lists(run, min_size=1, max_size=3))
def test_every_attempt_lands_in_one_cell_and_columns_are_fractions(runs):
    heatmap = version_span_heatmap(runs, max_version_span=2)
    assert heatmap["rows"] == ["0", "1", "2", "discarded"] and heatmap["columns"] == list(BIN_LABELS)
    assert sum(map(sum, heatmap["counts"])) == sum(len(r) for r in runs)
    assert sum(1 for r in runs for a in r if a.span is None) == sum(heatmap["counts"][-1])
    for column, total in enumerate(heatmap["column_totals"]):
        if total:
            assert abs(sum(row[column] for row in heatmap["fractions"]) - 1.0) < 1e-9


def test_the_longest_five_percent_and_their_discards():
    """100 attempts of lengths 1..100: the longest five (96..100) are the last column; two
    of them discarded is a 40% long-tail discard rate, 2% over all."""
    attempts_ = [Attempt(n, None if n in (97, 100) else 1) for n in range(1, 101)]
    heatmap = version_span_heatmap([attempts_], max_version_span=2)
    assert heatmap["column_totals"] == [80, 10, 5, 5]
    assert heatmap["long_tail_discard_rate"] == 0.4 and heatmap["discard_rate"] == 0.02
    assert heatmap["counts"][1] == [80, 10, 5, 3]


def test_attempts_pair_spans_with_lengths_and_add_the_stale_discards():
    groups = [{"kind": "group", "version_spans": [0, 1], "trajectory_tokens": [30, 70]},
              {"kind": "group", "version_spans": [2]}]  # an older record without lengths is left out
    assert attempts(groups, [500]) == [Attempt(30, 0), Attempt(70, 1), Attempt(500, None)]


def test_heatmap_png_is_written(tmp_path):
    heatmap = version_span_heatmap([[Attempt(n, n % 3) for n in range(1, 50)]], max_version_span=2)
    draw_version_heatmaps({"venus": heatmap, "action_level": heatmap}, tmp_path / "h.png")
    assert (tmp_path / "h.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_reward_curves_png_is_written_one_line_per_seed(tmp_path):
    curves = {"venus": {"seed 0": [(1, 0.5), (2, 0.75)], "seed 4": [(1, 0.25), (2, 0.5)]},
              "action_level": {"seed 0": [(1, 0.5), (2, 0.5)], "seed 4": [(1, 0.0), (2, 0.25)]}}
    draw_reward_curves(curves, tmp_path / "r.png")
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
