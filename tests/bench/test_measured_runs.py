"""A measured dir holds the validation's runs; reading one back checks each file and names
the one that is missing, unreadable, of another case or without what a replay needs."""

from __future__ import annotations

import gzip

import pytest

from venusrl.bench import measured_runs as runs

CASE = {"seed": 0, "slots_per_engine": 3, "trainer_factors": [0.5]}
MODES = ("action_level", "venus")


def _run(**changes):
    measured_round = {"trace": [{"prompt": "0"}], "timeline": {"turns": []}, "time_to_last_step_s": 4.0}
    return {"case": dict(CASE), **{mode: {"rounds": [dict(measured_round)]} for mode in MODES}, **changes}


def test_a_saved_run_reads_back_as_it_was(tmp_path):
    assert runs.is_empty(tmp_path / "none") and runs.is_empty(tmp_path)
    runs.save(tmp_path / "dir", "calibration", _run())
    assert not runs.is_empty(tmp_path / "dir")
    assert runs.load(tmp_path / "dir", "calibration", CASE, MODES) == _run()


def test_a_missing_run_is_an_error_naming_its_file(tmp_path):
    runs.save(tmp_path, "calibration", _run())
    with pytest.raises(runs.MeasuredRunsError, match=r"other_seed\.json\.gz: missing"):
        runs.load(tmp_path, "other_seed", CASE, MODES)


def test_a_file_that_is_not_gzipped_json_is_an_error_naming_it(tmp_path):
    (tmp_path / "calibration.json.gz").write_bytes(b"{}")
    with pytest.raises(runs.MeasuredRunsError, match=r"calibration\.json\.gz: not gzip'd JSON"):
        runs.load(tmp_path, "calibration", CASE, MODES)
    (tmp_path / "calibration.json.gz").write_bytes(gzip.compress(b"{not json"))
    with pytest.raises(runs.MeasuredRunsError, match=r"calibration\.json\.gz: not gzip'd JSON"):
        runs.load(tmp_path, "calibration", CASE, MODES)


def test_a_run_of_another_case_is_an_error_naming_the_fields(tmp_path):
    runs.save(tmp_path, "more_slots", _run())
    with pytest.raises(runs.MeasuredRunsError, match=r"more_slots\.json\.gz: measured on another case .*slots_per_engine"):
        runs.load(tmp_path, "more_slots", {**CASE, "slots_per_engine": 4}, MODES)


def test_a_round_without_its_turns_or_timeline_is_an_error_naming_the_mode(tmp_path):
    bare = _run()
    del bare["venus"]["rounds"][0]["timeline"]
    runs.save(tmp_path, "calibration", bare)
    with pytest.raises(runs.MeasuredRunsError, match=r"calibration\.json\.gz: venus round 0 has no timeline"):
        runs.load(tmp_path, "calibration", CASE, MODES)
    runs.save(tmp_path, "calibration", _run(venus={"rounds": []}))
    with pytest.raises(runs.MeasuredRunsError, match="no rounds of venus"):
        runs.load(tmp_path, "calibration", CASE, MODES)


def test_a_path_that_is_a_file_is_no_measured_dir(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(runs.MeasuredRunsError, match="not a directory"):
        runs.is_empty(tmp_path / "file")
