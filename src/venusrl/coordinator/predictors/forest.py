"""A fitted HistGradientBoostingRegressor's trees as flat arrays, walked for every tree at once.

sklearn predicts tree by tree, one Python-level call each, whatever the number of rows: one
query against 200 trees costs 1.75 ms of CPU on a quiet core and about 7 ms inside the rollout
bench, where it contends with the engine threads. The rollout worker asks for one query at a
time (at a turn boundary) on the cores the engines use. Here the nodes of all trees sit end
to end in flat arrays and each step of the walk moves every (tree, row) pair one level down
with a few numpy operations: depth steps in all (0.25 ms a query on a quiet core).

Same comparisons as sklearn's numeric splits: `x <= threshold` goes left, NaN follows the
node's missing-value direction. Categorical splits are not supported (the predictor's
features are all numeric).
"""

from __future__ import annotations

import numpy as np
from sklearn.ensemble import HistGradientBoostingRegressor


class FlatForest:
    """Node arrays of all trees laid end to end, tree t's nodes at t * width + node; `left`
    and `right` hold flat indices, so the walk is `take`s on 1-D arrays."""

    __slots__ = ("baseline", "roots", "feature", "threshold", "missing_left", "left", "right", "is_leaf", "value")

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> FlatForest:
        """The forest `arrays()` wrote; a missing or misshapen array raises ValueError."""
        forest = cls.__new__(cls)
        missing = [name for name in cls.__slots__ if name not in arrays]
        if missing:
            raise ValueError(f"forest arrays lack {missing}")
        forest.baseline = float(np.asarray(arrays["baseline"]).ravel()[0])
        forest.roots = np.asarray(arrays["roots"], dtype=np.intp).reshape(-1, 1)
        for name, dtype in (("feature", np.intp), ("threshold", np.float64), ("missing_left", bool),
                            ("left", np.intp), ("right", np.intp), ("is_leaf", bool), ("value", np.float64)):
            setattr(forest, name, np.asarray(arrays[name]).astype(dtype))
        size = forest.value.shape[0]
        if any(getattr(forest, name).shape != (size,) for name in cls.__slots__[2:]):
            raise ValueError("forest node arrays differ in length")
        reached = np.concatenate([forest.roots.ravel(), forest.left[~forest.is_leaf], forest.right[~forest.is_leaf]])
        if reached.size and (reached.min() < 0 or reached.max() >= size):
            raise ValueError("forest node index out of range")
        return forest

    def arrays(self) -> dict[str, np.ndarray]:
        """Plain numeric arrays (bools as uint8), enough to rebuild the forest: what a saved
        predictor stores instead of the sklearn model (no pickle)."""
        out = {name: np.ascontiguousarray(getattr(self, name)) for name in self.__slots__[1:]}
        out = {name: a.astype(np.uint8) if a.dtype == bool else a.astype(np.int64) if a.dtype == np.intp else a
               for name, a in out.items()}
        return {"baseline": np.array([self.baseline]), **out}

    def __init__(self, model: HistGradientBoostingRegressor) -> None:
        if getattr(model, "is_categorical_", None) is not None and np.any(model.is_categorical_):
            raise ValueError("FlatForest supports numeric splits only; the model has categorical features")
        trees = [predictors[0].nodes for predictors in model._predictors]  # one tree per iteration
        width = max(len(nodes) for nodes in trees)
        size = len(trees) * width
        self.baseline = float(np.asarray(model._baseline_prediction).ravel()[0])
        self.roots = (np.arange(len(trees)) * width)[:, None]  # [trees, 1]
        self.feature = np.zeros(size, dtype=np.intp)
        self.threshold = np.zeros(size, dtype=np.float64)
        self.missing_left = np.zeros(size, dtype=bool)
        self.left = np.zeros(size, dtype=np.intp)
        self.right = np.zeros(size, dtype=np.intp)
        self.is_leaf = np.ones(size, dtype=bool)  # padding is never reached
        self.value = np.zeros(size, dtype=np.float64)
        for tree, nodes in enumerate(trees):
            at = slice(tree * width, tree * width + len(nodes))
            self.feature[at] = nodes["feature_idx"]
            self.threshold[at] = nodes["num_threshold"]
            self.missing_left[at] = nodes["missing_go_to_left"]
            self.left[at] = nodes["left"] + tree * width
            self.right[at] = nodes["right"] + tree * width
            self.is_leaf[at] = nodes["is_leaf"]
            self.value[at] = nodes["value"]

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Raw predictions (the regressor's output: its loss has the identity link)."""
        x = np.asarray(x, dtype=np.float64)
        rows = np.arange(x.shape[0])[None, :]  # [1, rows]
        node = np.repeat(self.roots, x.shape[0], axis=1)  # [trees, rows], flat node indices
        while True:
            leaf = self.is_leaf.take(node)
            if leaf.all():
                break
            value = x[rows, self.feature.take(node)]
            go_left = np.where(np.isnan(value), self.missing_left.take(node), value <= self.threshold.take(node))
            child = np.where(go_left, self.left.take(node), self.right.take(node))
            node = np.where(leaf, node, child)
        return self.baseline + self.value.take(node).sum(axis=0)
