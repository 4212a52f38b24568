"""Per-query cost of the learned predictor on the rollout bench's queries (default cell)."""
import pickle, time, tempfile
from pathlib import Path
import numpy as np
import venusrl.bench.rollout as R
from venusrl.model.tiny import make_tiny_model
from venusrl.coordinator.predictors.learned import LearnedPredictor
from venusrl.coordinator.predictors.features import featurize
out = Path("/tmp/bench_examples.pkl")
if not out.exists():
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_tiny_model(Path(tmp) / "model", seed=1)
        _, examples = R._calibrate(model_dir, R.FULL, "process")
    pickle.dump(examples, open(out, "wb"))
examples = pickle.load(open(out, "rb"))
p = LearnedPredictor(refit_every=10**9); p.fit(examples)
qs = [e.query for e in examples]
print(len(qs), "queries; prompt chars", np.mean([len(q.prompt_text) for q in qs]), "obs chars", np.mean([len(q.last_observation) for q in qs]))
def t(f, n=3):
    best = 1e9
    for _ in range(n):
        a = time.thread_time(); [f(q) for q in qs]; best = min(best, time.thread_time() - a)
    return best / len(qs) * 1e3
print("predict ms", t(p.predict))
print("featurize ms", t(lambda q: featurize([q], 128)))
print("fallback ms", t(lambda q: p.fallback.predict(q)))
x = [p._featurize([q]) for q in qs]
it = iter(x * 10)
print("forest ms", t(lambda q: p._forest.predict(next(it))))
print("trees", len(p._forest.roots), "nodes", p._forest.value.shape)
for b in (1, 2, 4, 8, 16, 32):
    batches = [qs[i:i + b] for i in range(0, len(qs) - b + 1, b)]
    best = 1e9
    for _ in range(3):
        a = time.thread_time(); [p.predict_many(bq) for bq in batches]; best = min(best, time.thread_time() - a)
    print("batch", b, "ms per query", round(best / (len(batches) * b) * 1e3, 4), "ms per batch", round(best / len(batches) * 1e3, 3))
