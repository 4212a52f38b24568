"""The report's Faults section: what node, engine and sandbox losses cost, from the newest
record holding the counters; said so when no record has them."""

from venusrl.metrics.report import write_report
from venusrl.metrics.writer import MetricsWriter


def _run(tmp_path, records):
    writer = MetricsWriter(tmp_path, tensorboard=False, wandb_project=None, run_name="r", config={})
    for record in records:
        writer.write(record)
    writer.close()
    return write_report(tmp_path).read_text()


def test_the_newest_counters_are_reported(tmp_path):
    before = {"kind": "step", "time_s": 1.0, "step": 1, "engines_lost": 0, "turns_resumed": 0}
    after = {"kind": "step", "time_s": 2.0, "step": 2, "engines_lost": 1, "turns_resumed": 3, "tokens_recomputed": 2390,
             "engine_recovery_s": 0.067, "trajectories_discarded": 2}
    text = _run(tmp_path, [before, after])
    assert "## Faults" in text
    assert "| engines lost (killed, or silent past the watchdog's timeout) | 1 |" in text
    assert "| turns resumed on a surviving engine | 3 |" in text
    assert "| tokens recomputed (the resumed turns' prefixes) | 2390 |" in text
    assert "| recovery time: longest a resumed turn went without a token (s) | 0.067 |" in text
    assert "| trajectories discarded (stale or failed) and re-run | 2 |" in text
    assert "sandbox nodes lost" not in text  # a run without sandboxes has no such counter


def test_a_run_without_the_counters_says_so(tmp_path):
    assert "No fault counters in the metrics." in _run(tmp_path, [{"kind": "step", "time_s": 1.0, "step": 1}])
