import matplotlib.image
import pytest
import typer
from tests.metrics.synthetic_run import (
    EVAL_AFTER,
    EVAL_BEFORE,
    STEPS,
    VERSION_SPAN_FRACTIONS,
    write_synthetic_run,
)
from typer.testing import CliRunner

from venusrl.cli.report import report
from venusrl.metrics.report import PLOTS, write_report
from venusrl.metrics.writer import MetricsWriter

PNGS = [filename for filename, *_ in PLOTS]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def full_report(tmp_path_factory):
    return write_report(write_synthetic_run(tmp_path_factory.mktemp("run")))


def test_every_plot_is_a_real_png(full_report):
    assert full_report.parent.name == "report" and full_report.name == "report.md"
    for filename in PNGS:
        path = full_report.parent / filename
        assert path.read_bytes()[:8] == PNG_MAGIC, filename
        assert path.stat().st_size > 10_000, filename
        height, width, _ = matplotlib.image.imread(path).shape
        assert height > 200 and width > 400, filename


def test_markdown_holds_the_computed_figures(full_report):
    text = full_report.read_text()
    assert f"| steps | {STEPS} step records, last step {STEPS - 1} |" in text
    assert "| wall time | 21.5 s (0:00:22) |" in text
    assert "| reward (first / last / best) | 0.050 / 0.950 / 0.950 (step 9) |" in text
    assert f"{EVAL_BEFORE:.3f} (step 0) / {EVAL_AFTER:.3f} (step {STEPS - 1})" in text
    assert "| mean tokens/s | 145.0 |" in text
    assert "| mean KV hit rate | 0.680 |" in text
    assert "node-0 1.25 GiB of 2.00 GiB; node-1 1.00 GiB of 2.00 GiB" in text
    assert "each of 20 trajectories" in text
    for span, fraction in VERSION_SPAN_FRACTIONS.items():
        assert f"| {span} | {round(fraction * 20)} | {fraction:.3f} |" in text
    assert "| groups_dropped | 3 |" in text and "| final_reward | 0.95 |" in text
    for filename in PNGS:
        assert f"]({filename})" in text
    assert "Skipped" not in text


def test_missing_kinds_and_fields_are_skipped_and_said_so(tmp_path):
    with MetricsWriter(tmp_path) as writer:
        for step in range(3):
            writer.write({"kind": "step", "time_s": step + 1.0, "step": step, "reward_mean": 0.1 * step})
    (tmp_path / "report").mkdir()
    (tmp_path / "report" / "kv_hit_rate.png").write_bytes(b"stale")
    text = write_report(tmp_path).read_text()
    assert (tmp_path / "report" / "reward.png").exists()
    assert "![Reward](reward.png)" in text
    for filename, title, _, absent in PLOTS[1:]:
        assert f"### {title}\n\nSkipped: {absent}." in text
        assert not (tmp_path / "report" / filename).exists()
    assert "| mean tokens/s | n/a |" in text and "| eval accuracy (before / after) | n/a |" in text
    assert "No group records with version_spans." in text and "No summary record." in text


def test_an_empty_run_still_gets_a_report(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("")
    text = write_report(tmp_path, tmp_path / "elsewhere").read_text()
    assert "| steps | n/a |" in text and text.count("Skipped:") == len(PLOTS)


def _cli():
    app = typer.Typer()
    app.command()(report)
    return app


def test_cli_writes_the_report(tmp_path):
    write_synthetic_run(tmp_path / "run")
    result = CliRunner().invoke(_cli(), [str(tmp_path / "run"), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == str(tmp_path / "out" / "report.md")
    assert (tmp_path / "out" / "reward.png").exists()


def test_cli_without_metrics_is_a_clear_error(tmp_path):
    result = CliRunner().invoke(_cli(), [str(tmp_path)])
    assert result.exit_code == 2
    assert "no metrics.jsonl in" in result.output


def test_cli_reports_a_corrupt_line(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"kind": "step", "time_s": 1.0, "step": 0}\n{oops\n{"kind": "x", "time_s": 2}\n')
    result = CliRunner().invoke(_cli(), [str(tmp_path)])
    assert result.exit_code == 2
    assert "metrics.jsonl:2: corrupt metrics record" in result.output
