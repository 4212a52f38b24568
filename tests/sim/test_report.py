from __future__ import annotations

from venusrl.sim.report import markdown, rows

CASES = [{"label": {"batch": 32},
          "runs": [{"name": "baseline", "throughput_tokens_per_s": 100.0, "time_to_first_batch_s": 30.0,
                    "step_times": [30.0, 90.0]},
                   {"name": "venus", "throughput_tokens_per_s": 250.0, "time_to_first_batch_s": 20.0,
                    "step_times": [20.0, 45.0]}]}]


def test_rows_give_speedups_over_the_reference_or_of_it():
    assert rows(CASES, "baseline")[0]["speedup"] == {"baseline": 1.0, "venus": 2.5}
    assert rows(CASES, "venus", invert=True)[0]["speedup"]["baseline"] == 2.5


def test_rows_give_the_speedup_in_time_to_the_first_batch():
    assert rows(CASES, "baseline")[0]["first_batch_speedup"] == {"baseline": 1.0, "venus": 1.5}
    assert rows(CASES, "venus", invert=True)[0]["first_batch_speedup"]["baseline"] == 1.5


def test_rows_give_the_speedup_in_time_to_the_last_step():
    assert rows(CASES, "baseline")[0]["end_to_end_speedup"] == {"baseline": 1.0, "venus": 2.0}


def test_markdown_has_one_line_per_case_and_the_paper_column():
    text = markdown(rows(CASES, "baseline"), "baseline", {32: (1.0, 2.89)})
    assert "| 32 | 100 | 250 | 2.50x | 1.50x | 2.00x | - / - | 1.00 / 2.89 |" in text  # no hit rates in CASES


def test_seeds_give_the_median_of_speedups_paired_within_each_seed():
    runs = [{"name": name, "seed": seed, "throughput_tokens_per_s": rate, "time_to_first_batch_s": 10.0}
            for seed, rates in enumerate([(100, 200), (300, 310), (200, 400)])
            for name, rate in zip(("baseline", "venus"), rates, strict=True)]
    (row,) = rows([{"label": {"batch": 64}, "runs": runs}], "baseline")
    assert row["seeds"] == 3
    assert row["speedup"]["venus"] == 2.0  # the medians of the throughputs would say 310 / 200
    assert row["throughput"] == {"baseline": 200, "venus": 310}
    text = markdown([row], "baseline")
    assert text.startswith("Medians over 3 seeds") and "| 64 | 200 | 310 | 2.00x | 1.00x | - |" in text


def test_perturbations_are_paired_within_their_seed_and_give_each_seed_their_median():
    # seed 0: venus 2x, 4x, 3x the baseline's rate under perturbations 0-2; seed 1: 1x, 1x, 5x
    runs = [{"name": name, "seed": seed, "perturbation": k, "throughput_tokens_per_s": 1.0,
             "time_to_first_batch_s": 10.0, "step_times": [steps]}
            for seed, speedups in enumerate([(2, 4, 3), (1, 1, 5)]) for k, speedup in enumerate(speedups)
            for name, steps in (("baseline", 60.0 * speedup), ("venus", 60.0))]
    (row,) = rows([{"label": {"batch": 16}, "runs": runs}], "venus", invert=True)
    assert row["seeds"] == 2 and row["perturbations"] == 3
    assert row["end_to_end_speedup_per_seed"]["baseline"] == [3.0, 1.0]  # each seed's median
    assert row["end_to_end_speedup"]["baseline"] == 2.0  # the median of the seeds' medians
    assert row["end_to_end_speedup_range"] == {"baseline": [1.0, 5.0], "venus": [1.0, 1.0]}
    text = markdown([row], "venus", invert=True)
    assert text.startswith("Medians over 2 seeds x 3 perturbations")
    assert "| 2.00x (1.00-5.00) |" in text


def test_one_perturbation_reads_as_before():
    runs = [{**run, "perturbation": 0} for run in CASES[0]["runs"]]
    (row,) = rows([{"label": {"batch": 32}, "runs": runs}], "baseline")
    assert "perturbations" not in row and "end_to_end_speedup_range" not in row
    assert row == rows(CASES, "baseline")[0]


def test_a_seeds_figures_are_its_runs_unrounded():
    # the tables list each seed's hit rate as its run gave it; only medians over seeds are rounded
    runs = [{**run, "engine": {"hit_rate": rate}} for run, rate in zip(CASES[0]["runs"], (0.96549, 0.9345), strict=True)]
    (row,) = rows([{"label": {"batch": 32}, "runs": runs}], "baseline")
    assert row["hit_rate_per_seed"] == {"baseline": [0.96549], "venus": [0.9345]}
