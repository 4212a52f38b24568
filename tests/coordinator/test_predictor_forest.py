"""FlatForest walks the fitted trees of a HistGradientBoostingRegressor all at once: its
predictions must be sklearn's own, for any data, missing values included."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.ensemble import HistGradientBoostingRegressor

from venusrl.coordinator.predictors.forest import FlatForest


def fitted(seed: int, rows: int, features: int, missing: float) -> tuple[HistGradientBoostingRegressor, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, features)).astype(np.float32)
    x[rng.random(x.shape) < missing] = np.nan  # trains the missing-value directions too
    y = np.nan_to_num(x[:, 0]) * 3 + np.sin(np.nan_to_num(x[:, -1])) + rng.normal(scale=0.1, size=rows)
    model = HistGradientBoostingRegressor(max_iter=40, max_leaf_nodes=15, early_stopping=False, random_state=seed)
    return model.fit(x, y), x


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), features=st.integers(1, 6), missing=st.sampled_from([0.0, 0.2]),
       queries=st.integers(1, 40))
def test_flat_forest_predicts_what_sklearn_predicts(seed, features, missing, queries):
    model, x = fitted(seed, 300, features, missing)
    forest = FlatForest(model)
    rng = np.random.default_rng(seed + 1)
    fresh = rng.normal(scale=2.0, size=(queries, features)).astype(np.float32)
    fresh[rng.random(fresh.shape) < missing] = np.nan
    for data in (x[:queries], fresh):
        np.testing.assert_allclose(forest.predict(data), model.predict(data), rtol=1e-12, atol=1e-12)


def test_the_saved_arrays_rebuild_the_same_forest_and_bad_ones_are_refused():
    model, x = fitted(3, 300, 3, 0.2)
    arrays = FlatForest(model).arrays()
    np.testing.assert_allclose(FlatForest.from_arrays(arrays).predict(x), model.predict(x), rtol=1e-12, atol=1e-12)
    looping = {**arrays, "left": arrays["left"].copy()}
    root = int(arrays["roots"].ravel()[0])
    looping["left"][root] = root  # the root's left child is the root
    with pytest.raises(ValueError, match="cycle"):
        FlatForest.from_arrays(looping)


def test_a_tree_wider_than_64_leaves_is_refused():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4000, 4))
    model = HistGradientBoostingRegressor(max_iter=1, max_leaf_nodes=100, min_samples_leaf=5, early_stopping=False)
    model.fit(x, rng.normal(size=4000))
    assert model._predictors[0][0].nodes["is_leaf"].sum() > 64
    with pytest.raises(ValueError, match="more than 64 leaves"):
        FlatForest(model)
