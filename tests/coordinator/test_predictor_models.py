"""group_history and learned predictors: what they predict, how they learn, how they persist."""

import pickle
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from safetensors.numpy import save_file
from scipy.stats import spearmanr

from venusrl.coordinator import PredictorConfig
from venusrl.coordinator.predictors import (
    GroupHistoryPredictor,
    LearnedPredictor,
    PredictorError,
    make_predictor,
)
from venusrl.coordinator.predictors.query import Example, PredictionQuery
from venusrl.coordinator.predictors.synthetic import make_tasks, rollout


def q(prompt_id="a", generated=0, turns=0, **kw):
    return PredictionQuery(prompt_id, "text", "", turns, generated, **kw)


def test_group_history_mean_excess_of_the_prompt_then_global_then_prior():
    p = GroupHistoryPredictor(prior_remaining_tokens=1000)
    assert p.predict(q(generated=100)) == 900
    assert p.predict(q(generated=2000, turns=4)) == 500  # past the prior: one more turn
    p.observe([Example(q("a", 0), 300), Example(q("a", 100), 200), Example(q("a", 0), 500)])
    p.observe([Example(q("b", 0), 5000)])
    # Prompt a finished at 300 and 500 (the 100+200 row repeats the 300 one).
    assert p.predict(q("a", generated=0)) == 400
    assert p.predict(q("a", generated=400)) == 100
    # Nothing of prompt a is longer than 600: every prompt's lengths answer.
    assert p.predict(q("a", generated=600)) == 4400
    assert p.predict(q("zzz", generated=0)) == pytest.approx((300 + 500 + 5000) / 3)


def test_group_history_uses_mates_already_done():
    p = GroupHistoryPredictor()
    query = q("new", generated=100, mates_total=3, mates_done=2, mates_done_mean_tokens=400.0)
    assert p.predict(query) == 300


def test_group_history_save_load(tmp_path):
    p = GroupHistoryPredictor()
    p.observe([Example(q("a", 0), 300)])
    p.save(tmp_path / "gh.json")
    again = GroupHistoryPredictor.load(tmp_path / "gh.json")
    assert again.predict(q("a", 10)) == p.predict(q("a", 10)) == 290
    (tmp_path / "bad.json").write_text('{"format": "other"}')
    with pytest.raises(PredictorError, match="not a group_history predictor"):
        GroupHistoryPredictor.load(tmp_path / "bad.json")


@pytest.fixture(scope="module")
def workload():
    tasks = make_tasks(60, seed=7)
    train = [e for t in rollout(tasks, 4, seed=8) for e in t.examples()]
    test = [e for t in rollout(tasks[:30], 4, seed=9) for e in t.examples()]
    return train, test


def spearman_on(predictor, examples):
    pred = predictor.predict_many([e.query for e in examples])
    return spearmanr(pred, [e.remaining_tokens for e in examples]).statistic


def test_learned_ranks_remaining_lengths_and_beats_group_history(workload):
    train, test = workload
    learned = LearnedPredictor(buckets=32, iterations=60)
    assert not learned.trained
    learned.fit(train)
    history = GroupHistoryPredictor()
    history.fit(train)
    rho = spearman_on(learned, test)
    assert rho > 0.8
    assert rho > spearman_on(history, test)
    assert all(v >= 0 for v in learned.predict_many([e.query for e in test[:50]]))


def test_learned_falls_back_then_refits_online_in_the_background(workload):
    train, _ = workload
    with ThreadPoolExecutor(1) as pool:
        learned = LearnedPredictor(buckets=16, iterations=10, min_rows=50, refit_every=200, executor=pool)
        learned.observe(train[:20])
        assert not learned.trained  # below min_rows: group_history answers
        assert learned.predict(train[0].query) == learned.fallback.predict(train[0].query)
        learned.observe(train[20:120])
    assert learned.fits == 1 and learned.trained
    with ThreadPoolExecutor(1) as pool:
        learned._executor = pool
        learned.observe(train[120:200])  # 80 new rows < refit_every: no refit
    assert learned.fits == 1
    with ThreadPoolExecutor(1) as pool:
        learned._executor = pool
        learned.observe(train[200:400])
    assert learned.fits == 2


def test_learned_save_load_and_bad_files(tmp_path, workload):
    train, test = workload
    learned = LearnedPredictor(buckets=16, iterations=10)
    with pytest.raises(PredictorError, match="fit it before saving"):
        learned.save(tmp_path / "m.safetensors")
    learned.fit(train[:300])
    learned.save(tmp_path / "m.safetensors")
    again = make_predictor(PredictorConfig(kind="learned", path=str(tmp_path / "m.safetensors")))
    queries = [e.query for e in test[:20]]
    assert np.allclose(again.predict_many(queries), learned.predict_many(queries))
    again.save(tmp_path / "again.safetensors")  # a loaded predictor saves what it loaded
    assert np.allclose(LearnedPredictor.load(tmp_path / "again.safetensors").predict_many(queries),
                       learned.predict_many(queries))
    save_file({"x": np.zeros(1)}, str(tmp_path / "other.safetensors"), metadata={"format": "x"})
    with pytest.raises(PredictorError, match="not a learned predictor"):
        LearnedPredictor.load(tmp_path / "other.safetensors")
    arrays = learned._forest.arrays()
    arrays["left"] = arrays["left"] + 10**6  # a child index past the nodes
    save_file(arrays, str(tmp_path / "bad.safetensors"), metadata={"format": "venusrl.learned/2", "buckets": "16",
                                                                   "fallback": learned.fallback.to_json()})
    with pytest.raises(PredictorError, match="malformed learned predictor.*out of range"):
        LearnedPredictor.load(tmp_path / "bad.safetensors")
    (tmp_path / "junk.pkl").write_bytes(pickle.dumps({"format": "venusrl.learned/1"}))  # the old pickle format
    with pytest.raises(PredictorError, match="cannot read learned predictor"):
        LearnedPredictor.load(tmp_path / "junk.pkl")


def test_make_predictor_lm_needs_a_model():
    with pytest.raises(PredictorError, match="needs predictor.path"):
        make_predictor(PredictorConfig(kind="lm"))
