import pytest

from venusrl.metrics.writer import MetricsFileError, read_metrics

GOOD = '{"kind": "step", "time_s": 1.0, "step": 0}\n{"kind": "step", "time_s": 2.0, "step": 1}\n'


def test_reads_every_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(GOOD)
    assert [r["step"] for r in read_metrics(path)] == [0, 1]


def test_skips_a_torn_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(GOOD.encode() + '{"kind": "group", "prompt_id": "caf\u00e9'.encode()[:-1])
    assert [r["step"] for r in read_metrics(path)] == [0, 1]


def test_a_corrupt_middle_line_names_its_line_number(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(GOOD + '{"kind": "st\n' + GOOD)
    with pytest.raises(MetricsFileError, match=r"metrics\.jsonl:3: corrupt"):
        read_metrics(path)


def test_a_line_that_is_not_a_record_names_its_line_number(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('[1, 2]\n' + GOOD)
    with pytest.raises(MetricsFileError, match=r"metrics\.jsonl:1: not a metrics record"):
        read_metrics(path)


def test_an_empty_file_has_no_records(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("")
    assert read_metrics(path) == []
