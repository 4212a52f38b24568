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
