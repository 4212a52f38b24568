"""lm predictor on the tiny Hugging Face model: fine-tunes, predicts, saves and loads."""

import json

import pytest

from venusrl.coordinator import PredictorConfig
from venusrl.coordinator.predictors import PredictorError, make_predictor
from venusrl.coordinator.predictors.lm import META_FILE, LmPredictor
from venusrl.coordinator.predictors.synthetic import synthesize


@pytest.fixture(scope="module")
def examples():
    return [e for t in synthesize(4, group_size=2, seed=3) for e in t.examples()][:12]


def test_fine_tunes_predicts_and_round_trips(tiny_model_dir, examples, tmp_path):
    lm = LmPredictor(tiny_model_dir, max_tokens=64, learning_rate=5e-4, epochs=4, batch_size=8)
    losses = lm.fit(examples)
    assert len(losses) == 4 and losses[-1] < losses[0]
    queries = [e.query for e in examples[:5]]
    values = lm.predict_many(queries)
    assert all(v >= 0 for v in values)
    assert lm.predict(queries[0]) == pytest.approx(values[0], rel=1e-4)
    lm.save(tmp_path / "pred")
    again = make_predictor(PredictorConfig(kind="lm", path=str(tmp_path / "pred"), lm_max_tokens=64))
    assert again.predict_many(queries) == pytest.approx(values, rel=1e-4)


def test_observe_buffers_for_fit(tiny_model_dir, examples):
    lm = LmPredictor(tiny_model_dir, max_tokens=48, epochs=1, batch_size=4)
    with pytest.raises(PredictorError, match="at least 2 examples"):
        lm.fit()
    lm.observe(examples[:4])
    assert len(lm.fit()) == 1


def test_bad_directories_are_named(tmp_path, tiny_model_dir, examples):
    with pytest.raises(PredictorError, match="no config.json"):
        LmPredictor(tmp_path)
    lm = LmPredictor(tiny_model_dir, max_tokens=32, epochs=1)
    lm.fit(examples[:2])
    lm.save(tmp_path / "p")
    meta = tmp_path / "p" / META_FILE
    meta.write_text(json.dumps({"format": "venusrl.lm/1", "target_mean": "x", "target_std": 1}))
    with pytest.raises(PredictorError, match="'target_mean' must be a number"):
        LmPredictor(tmp_path / "p")
    meta.write_text("{\n bad")
    with pytest.raises(PredictorError, match=r"predictor.json:2: invalid JSON"):
        LmPredictor(tmp_path / "p")
