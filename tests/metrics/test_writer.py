import json

import numpy as np
import pytest

from venusrl.metrics.writer import MetricsWriter, read_metrics


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_record_is_a_line_on_disk_before_close(tmp_path):
    writer = MetricsWriter(tmp_path / "run")
    writer.write({"kind": "step", "time_s": 1.0, "step": 0, "loss": 0.5})
    writer.write({"kind": "group", "time_s": 1.5, "version_spans": [0, 1]})
    assert _lines(tmp_path / "run" / "metrics.jsonl") == [
        {"kind": "step", "time_s": 1.0, "step": 0, "loss": 0.5},
        {"kind": "group", "time_s": 1.5, "version_spans": [0, 1]},
    ]
    writer.close()
    writer.close()


def test_resume_appends_to_the_same_file(tmp_path):
    with MetricsWriter(tmp_path) as writer:
        writer.write({"kind": "step", "time_s": 1.0, "step": 0})
    with MetricsWriter(tmp_path) as writer:
        writer.write({"kind": "step", "time_s": 2.0, "step": 1})
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [0, 1]


def test_resume_after_a_torn_line_drops_it_instead_of_gluing_onto_it(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"kind": "step", "time_s": 1.0, "step": 0}\n{"kind": "step", "ti')
    with MetricsWriter(tmp_path) as writer:
        writer.write({"kind": "step", "time_s": 2.0, "step": 1})
    assert [r["step"] for r in read_metrics(path)] == [0, 1]


def test_resume_keeps_a_complete_last_record_missing_its_newline(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"kind": "step", "time_s": 1.0, "step": 0}')
    with MetricsWriter(tmp_path) as writer:
        writer.write({"kind": "step", "time_s": 2.0, "step": 1})
    assert [r["step"] for r in read_metrics(path)] == [0, 1]


def test_numpy_scalars_are_written_as_numbers(tmp_path):
    with MetricsWriter(tmp_path) as writer:
        writer.write({"kind": "step", "time_s": 1.0, "step": 0, "loss": np.float32(0.5), "spans": np.array([1, 2])})
    assert read_metrics(tmp_path / "metrics.jsonl")[0] == {
        "kind": "step", "time_s": 1.0, "step": 0, "loss": 0.5, "spans": [1, 2]}


@pytest.mark.parametrize("record, missing", [
    ({"time_s": 1.0}, "kind"),
    ({"kind": "group"}, "time_s"),
    ({"kind": "step", "time_s": 1.0}, "step"),
    ({"kind": "eval", "time_s": 1.0, "step": 1.5, "accuracy": 0.5}, "step"),
])
def test_malformed_records_are_refused(tmp_path, record, missing):
    with MetricsWriter(tmp_path) as writer, pytest.raises(ValueError, match=missing):
        writer.write(record)
    assert (tmp_path / "metrics.jsonl").read_text() == ""
