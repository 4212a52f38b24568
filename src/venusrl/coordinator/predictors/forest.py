"""A fitted HistGradientBoostingRegressor's trees as flat arrays, scored without walking them.

sklearn predicts tree by tree, one Python-level call each, whatever the number of rows: one
query against 200 trees costs 1.75 ms of CPU on a quiet core and about 7 ms inside the rollout
bench, where it contends with the engine threads. The rollout worker asks for one query at a
time (at a turn boundary) on the cores the engines use, about 1,200 a round of the rollout
bench's default cell, so each query's CPU is taken from the engines.

Scoring follows QuickScorer (Lucchese et al., SIGIR 2015): number each tree's leaves left to
right; a split whose test fails sends the row right, so no leaf of its left subtree can be
the exit. The exit leaf is therefore the leftmost leaf that no failed split rules out: AND the
left-subtree masks of the failed splits of a tree and take the lowest bit left. Every split
of every tree is tested in one vectorised comparison, so a query costs a fixed handful of
numpy calls whatever the trees' depth (a level-by-level walk costs about ten per level of the
deepest tree: 0.28 ms a query against 200 trees of 31 leaves on a quiet core).

Same comparisons as sklearn's numeric splits: `x <= threshold` goes left, NaN follows the
node's missing-value direction. Categorical splits are not supported (the predictor's
features are all numeric), nor trees of more than 64 leaves (the predictor grows 31).
"""

from __future__ import annotations

import numpy as np
from sklearn.ensemble import HistGradientBoostingRegressor

MAX_LEAVES = 64  # a tree's leaves are the bits of one uint64
ALL_LEAVES = np.uint64(2**64 - 1)
ROWS_PER_CHUNK = 256  # rows scored together: [rows, splits] intermediates stay a few MB


class FlatForest:
    """Node arrays of all trees laid end to end, tree t's nodes at t * width + node; `left`
    and `right` hold flat indices. These are what `arrays()` saves; the split and leaf
    tables that score are derived from them (`_compile`)."""

    __slots__ = ("baseline", "roots", "feature", "threshold", "missing_left", "left", "right", "is_leaf", "value",
                 "_split_feature", "_split_threshold", "_split_missing_left", "_split_fail_mask",
                 "_tree_first_split", "_leaf_offset", "_leaf_value")
    SAVED = __slots__[:9]

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> FlatForest:
        """The forest `arrays()` wrote; a missing or misshapen array raises ValueError."""
        forest = cls.__new__(cls)
        missing = [name for name in cls.SAVED if name not in arrays]
        if missing:
            raise ValueError(f"forest arrays lack {missing}")
        forest.baseline = float(np.asarray(arrays["baseline"]).ravel()[0])
        forest.roots = np.asarray(arrays["roots"], dtype=np.intp).reshape(-1, 1)
        for name, dtype in (("feature", np.intp), ("threshold", np.float64), ("missing_left", bool),
                            ("left", np.intp), ("right", np.intp), ("is_leaf", bool), ("value", np.float64)):
            setattr(forest, name, np.asarray(arrays[name]).astype(dtype))
        size = forest.value.shape[0]
        if any(getattr(forest, name).shape != (size,) for name in cls.SAVED[2:]):
            raise ValueError("forest node arrays differ in length")
        reached = np.concatenate([forest.roots.ravel(), forest.left[~forest.is_leaf], forest.right[~forest.is_leaf]])
        if reached.size and (reached.min() < 0 or reached.max() >= size):
            raise ValueError("forest node index out of range")
        forest._compile()
        return forest

    def arrays(self) -> dict[str, np.ndarray]:
        """Plain numeric arrays (bools as uint8), enough to rebuild the forest: what a saved
        predictor stores instead of the sklearn model (no pickle)."""
        out = {name: np.ascontiguousarray(getattr(self, name)) for name in self.SAVED[1:]}
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
        self._compile()

    def _compile(self) -> None:
        """The scoring tables. Each tree contributes one always-passing split first (so every
        tree has a split to AND over, a lone leaf included), then its real splits, each with
        the mask of the leaves that stay possible when it fails (all but its left subtree's);
        leaves are numbered left to right."""
        split_nodes: list[int] = []  # -1: the tree's always-passing split
        masks: list[int] = []
        first_split, leaf_offset, leaf_nodes = [], [], []
        for root in self.roots.ravel():
            first_split.append(len(split_nodes))
            leaf_offset.append(len(leaf_nodes))
            split_nodes.append(-1)
            masks.append(int(ALL_LEAVES))
            leaves_before = len(leaf_nodes)
            # iterative in-order walk: (node, whether its left subtree is done)
            stack, open_splits = [(int(root), False)], {}
            while stack:
                node, left_done = stack.pop()
                if self.is_leaf[node]:
                    leaf_nodes.append(node)
                    if len(leaf_nodes) - leaves_before > MAX_LEAVES:
                        raise ValueError(f"a tree has more than {MAX_LEAVES} leaves")
                elif len(stack) >= self.value.shape[0]:  # deeper than there are nodes
                    raise ValueError("a tree's nodes form a cycle")
                elif not left_done:
                    open_splits[node] = len(leaf_nodes) - leaves_before
                    stack += [(node, True), (int(self.left[node]), False)]
                else:  # its left subtree's leaves are numbered: from open_splits[node] to here
                    first, last = open_splits.pop(node), len(leaf_nodes) - leaves_before
                    split_nodes.append(node)
                    masks.append(int(ALL_LEAVES) ^ ((1 << last) - 1) ^ ((1 << first) - 1))
                    stack.append((int(self.right[node]), False))
        nodes = np.asarray(split_nodes, dtype=np.intp)
        real = nodes >= 0
        self._split_feature = np.where(real, self.feature[nodes], 0)
        self._split_threshold = np.where(real, self.threshold[nodes], np.inf)
        self._split_missing_left = np.where(real, self.missing_left[nodes], True)
        self._split_fail_mask = np.asarray(masks, dtype=np.uint64)
        self._tree_first_split = np.asarray(first_split, dtype=np.intp)
        self._leaf_offset = np.asarray(leaf_offset, dtype=np.intp)
        self._leaf_value = self.value[np.asarray(leaf_nodes, dtype=np.intp)]

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Raw predictions (the regressor's output: its loss has the identity link)."""
        x = np.asarray(x, dtype=np.float64)
        return np.concatenate([self._score(x[i:i + ROWS_PER_CHUNK]) for i in range(0, x.shape[0], ROWS_PER_CHUNK)]
                              or [np.zeros(0)])

    def _score(self, x: np.ndarray) -> np.ndarray:
        value = x[:, self._split_feature]  # [rows, splits]
        passes = (value <= self._split_threshold) | (np.isnan(value) & self._split_missing_left)
        kept = np.where(passes, ALL_LEAVES, self._split_fail_mask)  # a failed split rules its left leaves out
        alive = np.bitwise_and.reduceat(kept, self._tree_first_split, axis=1)  # [rows, trees]
        lowest = alive & (~alive + np.uint64(1))  # the exit leaf's bit: never 0, the exit leaf stays
        leaf = np.log2(lowest).astype(np.intp)  # exact: a power of two below 2^64
        return self.baseline + self._leaf_value[self._leaf_offset + leaf].sum(axis=1)
