"""Why a model scored a row as it did: each feature's signed contribution to the row's margin.

The contributions are the model's own, computed from its fitted trees or coefficients, and they add up:
``base + sum(contributions) == margin`` for every row, to rounding. The margin is what the model turns
into its score: log-odds for boosted trees and logistic regression (score = 1 / (1 + e^-margin)), the
probability itself for a random forest or a single tree. How they are computed depends on the model
(:data:`contracts.records.ContributionMethod` names it in each alert):

* ``tree_shap``, tree models (LightGBM, hist gradient boosting, random forest, decision tree): exact
  TreeSHAP values (path-dependent: a feature left out is averaged over the training rows each node
  saw). LightGBM's booster computes them natively (``pred_contrib``); scikit-learn's trees are written
  once as a LightGBM booster (the same splits, leaf values and training counts) whose TreeSHAP explains
  them.
* ``linear_shap``, logistic regression: coefficient x standardised value, the exact SHAP values of a
  linear model when the features are taken as independent, against the training mean.
* ``none``: any other model: no contributions.

Scaling steps of a pipeline are applied first; a scaler maps each feature on its own, so the
contributions of the scaled inputs are those of the features.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from contracts.records import ContributionMethod

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class Contributions:
    """Per-row contributions of each input (columns in the model's feature order) and the base margin."""

    method: ContributionMethod
    values: np.ndarray
    base: np.ndarray

    @property
    def margin(self) -> np.ndarray:
        """The margin of each row, as the contributions give it."""
        return self.base + self.values.sum(axis=1)


def contributions(model: Any, frame: pd.DataFrame) -> Contributions:
    """The contributions of ``frame``'s columns (the model's inputs, in order) to each row's margin."""
    # Imported here, as models.estimators does: what imports the registry need not load the libraries.
    from lightgbm import LGBMClassifier
    from sklearn.ensemble import HistGradientBoostingClassifier, RandomForestClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline
    from sklearn.tree import DecisionTreeClassifier

    steps = model[:-1] if isinstance(model, Pipeline) else None
    estimator = model[-1] if isinstance(model, Pipeline) else model
    inputs = np.asarray(steps.transform(frame) if steps is not None else frame, dtype=np.float64)
    n = len(inputs)
    if isinstance(estimator, LogisticRegression) and estimator.coef_.shape[0] == 1:
        # Against the training mean, which the pipeline's scaler (fitted on the training rows) moved to 0.
        values = inputs * estimator.coef_[0]
        return Contributions("linear_shap", values, np.full(n, float(estimator.intercept_[0])))
    booster, base = None, 0.0
    if isinstance(estimator, LGBMClassifier):
        booster = estimator.booster_
    elif isinstance(estimator, HistGradientBoostingClassifier) and estimator.n_trees_per_iteration_ == 1:
        # scikit-learn keeps a hist gradient boosting model's baseline and trees private (no public API);
        # tests/models/test_contributions.py checks the sums against the model's own margins.
        baseline = estimator._baseline_prediction  # noqa: SLF001
        booster, base = _as_booster(estimator), float(np.ravel(baseline)[0])
    elif isinstance(estimator, RandomForestClassifier | DecisionTreeClassifier) and estimator.n_classes_ == 2:
        # scikit-learn's trees compare the inputs as float32.
        booster, inputs = _as_booster(estimator), inputs.astype(np.float32).astype(np.float64)
    if booster is None:
        return Contributions("none", np.zeros((n, 0)), np.zeros(n))
    # One thread, as the scoring stage's predictions (``models.registry.load_model``): tasks run side by side.
    found = np.asarray(booster.predict(inputs, pred_contrib=True, num_threads=1), dtype=np.float64)
    return Contributions("tree_shap", found[:, :-1], found[:, -1] + base)


@dataclass(frozen=True)
class _Tree:
    """One tree as arrays by node: the split's feature and threshold (``x <= threshold`` goes left), the
    children, where a missing value goes, whether it is a leaf, its value (in the margin's units) and how
    many training rows reached it."""

    feature: np.ndarray
    threshold: np.ndarray
    left: np.ndarray
    right: np.ndarray
    missing_left: np.ndarray
    leaf: np.ndarray
    value: np.ndarray
    count: np.ndarray


@functools.lru_cache(maxsize=4)
def _as_booster(estimator: Any) -> Any:
    """A fitted scikit-learn tree model as a LightGBM booster, whose TreeSHAP (``pred_contrib``) then
    explains it: the same splits, leaf values and training counts (TreeSHAP's covers), in LightGBM's
    model text. A hist gradient boosting model's raw score lacks its baseline (the training log-odds):
    the caller adds it. Built once per model."""
    import lightgbm

    width = estimator.n_features_in_
    trees = _hist_trees(estimator) if hasattr(estimator, "_predictors") else _forest_trees(estimator)
    header = [
        "tree",
        "version=v4",
        "num_class=1",
        "num_tree_per_iteration=1",
        "label_index=0",
        f"max_feature_idx={width - 1}",
        "objective=binary sigmoid:1",
        "feature_names=" + " ".join(f"f{i}" for i in range(width)),
        "feature_infos=" + " ".join(["none"] * width),
    ]
    texts = [_lightgbm_tree(number, tree) for number, tree in enumerate(trees)]
    return lightgbm.Booster(model_str="\n".join([*header, "", *texts, "end of trees", ""]))


def _hist_trees(estimator: Any) -> list[_Tree]:
    """A hist gradient boosting model's trees: their values are log-odds, summed."""
    trees = []
    for predictors in estimator._predictors:  # noqa: SLF001 - private in scikit-learn, see contributions()
        nodes = predictors[0].nodes
        if nodes["is_categorical"].any():
            raise ValueError("contributions of categorical splits are not computed")
        trees.append(
            _Tree(
                feature=nodes["feature_idx"].astype(np.int64),
                threshold=nodes["num_threshold"].astype(np.float64),
                left=nodes["left"].astype(np.int64),
                right=nodes["right"].astype(np.int64),
                missing_left=nodes["missing_go_to_left"].astype(bool),
                leaf=nodes["is_leaf"].astype(bool),
                value=nodes["value"].astype(np.float64),
                count=nodes["count"].astype(np.int64),
            )
        )
    return trees


def _forest_trees(estimator: Any) -> list[_Tree]:
    """A random forest's trees or a decision tree: their values are each node's (weighted) share of
    frauds, over the number of trees, so that they sum to the forest's probability."""
    fitted = [tree.tree_ for tree in getattr(estimator, "estimators_", [estimator])]
    return [
        _Tree(
            feature=tree.feature.astype(np.int64),
            threshold=tree.threshold.astype(np.float64),
            left=tree.children_left.astype(np.int64),
            right=tree.children_right.astype(np.int64),
            missing_left=tree.missing_go_to_left.astype(bool),
            leaf=tree.children_left == -1,
            value=tree.value[:, 0, 1] / tree.value[:, 0, :].sum(axis=1) / len(fitted),
            count=tree.n_node_samples.astype(np.int64),
        )
        for tree in fitted
    ]


def _lightgbm_tree(number: int, tree: _Tree) -> str:
    """One tree in LightGBM's model text: inner nodes numbered from 0 (the root), leaf ``k`` as ``~k``."""
    inner, leaves = np.flatnonzero(~tree.leaf), np.flatnonzero(tree.leaf)
    if not len(inner):
        value = float(tree.value[0])
        return f"Tree={number}\nnum_leaves=1\nnum_cat=0\nleaf_value={value!r}\nis_linear=0\nshrinkage=1\n"
    index = np.zeros(len(tree.leaf), dtype=np.int64)
    index[inner], index[leaves] = np.arange(len(inner)), ~np.arange(len(leaves))

    def line(name: str, values: np.ndarray) -> str:
        return f"{name}=" + " ".join(repr(v) for v in values.tolist())

    # Decision type: bit 1, a missing value goes left; bits 2-3 = 2, the missing value is NaN.
    decision = 8 | 2 * tree.missing_left[inner].astype(np.int64)
    return "\n".join(
        [
            f"Tree={number}",
            f"num_leaves={len(leaves)}",
            "num_cat=0",
            line("split_feature", tree.feature[inner]),
            line("split_gain", np.zeros(len(inner))),
            line("threshold", tree.threshold[inner]),
            line("decision_type", decision),
            line("left_child", index[tree.left[inner]]),
            line("right_child", index[tree.right[inner]]),
            line("leaf_value", tree.value[leaves]),
            line("leaf_weight", tree.count[leaves].astype(np.float64)),
            line("leaf_count", tree.count[leaves]),
            line("internal_value", tree.value[inner]),
            line("internal_weight", tree.count[inner].astype(np.float64)),
            line("internal_count", tree.count[inner]),
            "is_linear=0",
            "shrinkage=1",
            "",
        ]
    )
