"""The fidelity report's version-span heatmap (the paper's Fig. 12) and its long-tail
discard rate; reward per 10 steps; which prompts each step trained, as percentiles against
the dataset."""

import random
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from venusrl.bench.fidelity import composition_curves, prompt_percentiles, table
from venusrl.env.calculator import generate_dataset
from venusrl.metrics.fidelity import (
    BIN_LABELS,
    Attempt,
    attempts,
    half_means,
    midrank_percentiles,
    reward_per_window,
    trained_composition,
    version_span_heatmap,
)
from venusrl.metrics.figures import (
    draw_reward_curves,
    draw_trained_composition,
    draw_version_heatmaps,
)

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


def test_midrank_percentiles_share_ties_and_stay_inside_0_100():
    assert midrank_percentiles({"a": 1, "b": 2, "c": 2, "d": 3}) == {"a": 12.5, "b": 50.0, "c": 50.0, "d": 87.5}
    assert midrank_percentiles({"only": (1, 0)}) == {"only": 50.0}


def test_trained_composition_per_step_and_its_halves():
    """Four prompts ranked 12.5 / 37.5 / 62.5 / 87.5 by difficulty; four steps: the first half
    trains the two easiest twice, the second the two hardest."""
    percentiles = {"difficulty": {"p0": 12.5, "p1": 37.5, "p2": 62.5, "p3": 87.5},
                   "length": {"p0": 50.0, "p1": 50.0, "p2": 50.0, "p3": 50.0}}
    ledger = [{"step": 1, "weight_version": 1, "prompt_ids": ["p0", "p1"]},
              {"step": 2, "weight_version": 2, "prompt_ids": ["p1", "p0"]},
              {"step": 3, "weight_version": 3, "prompt_ids": ["p2", "p3"]},
              {"step": 4, "weight_version": 4, "prompt_ids": ["p3", "p3"]}]
    steps = trained_composition(ledger, percentiles)
    assert steps[0] == {"step": 1, "prompt_ids": ["p0", "p1"], "difficulty_percentiles": [12.5, 37.5],
                        "difficulty_median": 25.0, "difficulty_mean": 25.0, "length_percentiles": [50.0, 50.0],
                        "length_median": 50.0, "length_mean": 50.0}
    assert steps[3]["difficulty_mean"] == 87.5
    assert half_means([steps], "difficulty") == {"first_half_mean": 25.0, "second_half_mean": 81.25,
                                                 "first_half_mean_per_seed": [25.0],
                                                 "second_half_mean_per_seed": [81.25]}
    # two seeds pool group by group; an odd step count puts the middle step in the second half
    odd = trained_composition(ledger[:3], percentiles)
    assert half_means([steps, odd], "difficulty")["first_half_mean"] == 25.0  # steps 1-2 and step 1
    assert half_means([steps, odd], "difficulty")["second_half_mean_per_seed"] == [81.25, 50.0]


def test_a_trained_prompt_missing_from_the_dataset_is_named():
    with pytest.raises(ValueError, match="'gone'"):
        trained_composition([{"step": 1, "prompt_ids": ["gone"]}], {"length": {"p0": 50.0}})


@given(st.lists(st.integers(0, 20), min_size=1, max_size=120), st.integers(1, 8), st.randoms(use_true_random=False))
def test_training_the_whole_dataset_once_scores_50(lengths, batch, rng):
    """Any dataset, trained once in any order and batch size: every percentile in (0, 100)
    and the trained groups' mean exactly the dataset's 50 (up to the 2-decimal rounding)."""
    keys = {f"p{i}": length for i, length in enumerate(lengths)}
    percentiles = midrank_percentiles(keys)
    assert all(0 < v < 100 for v in percentiles.values())
    order = list(keys)
    rng.shuffle(order)
    ledger = [{"step": i // batch + 1, "prompt_ids": order[i:i + batch]} for i in range(0, len(order), batch)]
    trained = [v for s in trained_composition(ledger, {"length": percentiles}) for v in s["length_percentiles"]]
    assert abs(statistics.fmean(trained) - 50.0) < 0.01


def test_the_demos_rows_drawn_uniformly_score_about_50_each_half():
    """The demo's 512 training rows, 80 steps of 4 groups drawn at random (what a scheduler
    with no bias trains): each half's mean within 8 of 50 (its standard error is about 2)."""
    rows = generate_dataset(512, seed=0, min_steps=1, max_steps=1, max_start=20, max_operand=50, operators=["+", "-"])
    percentiles = prompt_percentiles(rows)
    order = random.Random(1).sample([r["id"] for r in rows], 320)
    ledger = [{"step": s + 1, "prompt_ids": order[4 * s:4 * s + 4]} for s in range(80)]
    steps = trained_composition(ledger, percentiles)
    for measure in ("difficulty", "length"):
        halves = half_means([steps], measure)
        assert abs(halves["first_half_mean"] - 50) < 8 and abs(halves["second_half_mean"] - 50) < 8


def test_demo_difficulty_ranks_subtractions_above_additions_and_length_follows_the_question():
    rows = [{"id": "add", "question": "Compute (3 + 4).", "steps": 1, "operations": "+"},
            {"id": "sub", "question": "Compute (3 - 4).", "steps": 1, "operations": "-"},
            {"id": "long", "question": "Compute (13 + 44).", "steps": 1, "operations": "+"},
            {"id": "two", "question": "Compute ((1 + 2) + 4).", "steps": 2, "operations": "++"}]
    percentiles = prompt_percentiles(rows)
    assert percentiles["difficulty"] == {"add": 25.0, "long": 25.0, "sub": 62.5, "two": 87.5}
    assert percentiles["length"] == {"add": 25.0, "sub": 25.0, "long": 62.5, "two": 87.5}


def test_reward_per_10_steps():
    rewards = [(s, 1.0 if s <= 10 else 0.5) for s in range(1, 26)]
    assert reward_per_window(rewards) == [1.0, 0.5, 0.5]
    assert reward_per_window([(5, 0.25), (25, 0.75)]) == [0.25, None, 0.75]  # a window without a record
    assert reward_per_window([]) == []


def test_composition_table_and_figure(tmp_path):
    percentiles = {"difficulty": {"p0": 25.0, "p1": 75.0}, "length": {"p0": 40.0, "p1": 60.0}}
    steps = trained_composition([{"step": s, "prompt_ids": ["p0" if s <= 10 else "p1"]} for s in range(1, 21)],
                                percentiles)
    scheduler = {"accuracy_after_per_seed": [0.9], "gain_over_control_per_seed": [0.1], "long_tail_discard_rate": 0.0,
                 "reward_per_10_steps_per_seed": [[0.5, 0.75]],
                 "trained_composition_summary": {m: half_means([steps], m) for m in percentiles}}
    report = {"seeds": [0], "schedulers": {"venus": scheduler}, "binomial_standard_error": 0.03, "figures": []}
    text = table(report)
    assert "25.0 / 75.0" in text and "40.0 / 60.0" in text and "venus seed 0" in text and "0.50 0.75" in text
    curves = composition_curves([steps])
    assert curves == {"difficulty": [(10, 25.0), (20, 75.0)], "length": [(10, 40.0), (20, 60.0)]}
    draw_trained_composition({"venus": curves, "action_level": curves}, tmp_path / "c.png")
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
