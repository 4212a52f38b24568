from __future__ import annotations

from venusrl.sim.report import markdown, rows

CASES = [{"label": {"batch": 32},
          "runs": [{"name": "baseline", "throughput_tokens_per_s": 100.0, "time_to_first_batch_s": 30.0},
                   {"name": "venus", "throughput_tokens_per_s": 250.0, "time_to_first_batch_s": 20.0}]}]


def test_rows_give_speedups_over_the_reference_or_of_it():
    assert rows(CASES, "baseline")[0]["speedup"] == {"baseline": 1.0, "venus": 2.5}
    assert rows(CASES, "venus", invert=True)[0]["speedup"]["baseline"] == 2.5


def test_rows_give_the_speedup_in_time_to_the_first_batch():
    assert rows(CASES, "baseline")[0]["first_batch_speedup"] == {"baseline": 1.0, "venus": 1.5}
    assert rows(CASES, "venus", invert=True)[0]["first_batch_speedup"]["baseline"] == 1.5


def test_markdown_has_one_line_per_case_and_the_paper_column():
    text = markdown(rows(CASES, "baseline"), "baseline", {32: (1.0, 2.89)})
    assert "| 32 | 100 | 250 | 2.50x | 1.50x | 1.00 / 2.89 |" in text
