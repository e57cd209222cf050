"""Why a model scored a row as it did: each feature's signed contribution to the row's margin.

The contributions are the model's own, computed from its fitted trees or coefficients, and they add up:
``base + sum(contributions) == margin`` for every row, to rounding. The margin is what the model turns
into its score: log-odds for boosted trees and logistic regression (score = 1 / (1 + e^-margin)), the
probability itself for a random forest or a single tree. How they are computed depends on the model
(:data:`contracts.records.ContributionMethod` names it in each alert):

* ``tree_shap``, LightGBM: the booster's own exact TreeSHAP values (path-dependent, ``pred_contrib``).
* ``linear_shap``, logistic regression: coefficient x standardised value, the exact SHAP values of a
  linear model when the features are taken as independent, against the training mean.
* ``saabas``, scikit-learn's trees (hist gradient boosting, random forest, decision tree): along the
  row's path through each tree, the change of the node's value at each split, credited to the split's
  feature (Saabas' method, as the treeinterpreter package computes it). It adds up to the margin like
  SHAP, but is not SHAP: it credits the features split on near the leaves more than SHAP does.
* ``none``: any other model: no contributions.

Scaling steps of a pipeline are applied first; a scaler maps each feature on its own, so the
contributions of the scaled inputs are those of the features.
"""

from __future__ import annotations

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
    if isinstance(estimator, LGBMClassifier):
        found = np.asarray(estimator.predict(inputs, pred_contrib=True), dtype=np.float64)
        return Contributions("tree_shap", found[:, :-1], found[:, -1])
    if isinstance(estimator, LogisticRegression) and estimator.coef_.shape[0] == 1:
        # Background: the training mean, which a scaler fitted on the training rows moved to 0.
        mean = 0.0 if steps is not None and len(steps) else inputs.mean(axis=0)
        values = (inputs - mean) * estimator.coef_[0]
        return Contributions("linear_shap", values, np.full(n, float(estimator.intercept_[0])))
    if isinstance(estimator, HistGradientBoostingClassifier) and estimator.n_trees_per_iteration_ == 1:
        return _saabas(
            [
                _hist_tree(predictors[0].nodes, estimator.learning_rate)
                for predictors in estimator._predictors
            ],
            inputs,
            float(np.ravel(estimator._baseline_prediction)[0]),
        )
    if isinstance(estimator, RandomForestClassifier | DecisionTreeClassifier) and estimator.n_classes_ == 2:
        trees = estimator.estimators_ if isinstance(estimator, RandomForestClassifier) else [estimator]
        summed = _saabas([_sklearn_tree(tree.tree_) for tree in trees], inputs.astype(np.float32), 0.0)
        return Contributions("saabas", summed.values / len(trees), summed.base / len(trees))
    return Contributions("none", np.zeros((n, 0)), np.zeros(n))


@dataclass(frozen=True)
class _Tree:
    """One tree as arrays by node: the split's feature and threshold, the children, where a missing value
    goes, whether it is a leaf, and its value (in the margin's units)."""

    feature: np.ndarray
    threshold: np.ndarray
    left: np.ndarray
    right: np.ndarray
    missing_left: np.ndarray
    leaf: np.ndarray
    value: np.ndarray


def _hist_tree(nodes: np.ndarray, learning_rate: float) -> _Tree:
    """A hist gradient boosting tree: its leaves' values hold the learning rate already, its inner nodes'
    values (the Newton step of the node's rows) do not."""
    if nodes["is_categorical"].any():
        raise ValueError("contributions of categorical splits are not computed")
    leaf = nodes["is_leaf"].astype(bool)
    return _Tree(
        feature=nodes["feature_idx"].astype(np.intp),
        threshold=nodes["num_threshold"],
        left=nodes["left"].astype(np.intp),
        right=nodes["right"].astype(np.intp),
        missing_left=nodes["missing_go_to_left"].astype(bool),
        leaf=leaf,
        value=np.where(leaf, nodes["value"], nodes["value"] * learning_rate),
    )


def _sklearn_tree(tree: Any) -> _Tree:
    """A scikit-learn decision tree: its nodes' values are the (weighted) share of each class."""
    return _Tree(
        feature=tree.feature.astype(np.intp),
        threshold=tree.threshold,
        left=tree.children_left.astype(np.intp),
        right=tree.children_right.astype(np.intp),
        missing_left=tree.missing_go_to_left.astype(bool),
        leaf=tree.children_left == -1,
        value=tree.value[:, 0, 1] / tree.value[:, 0, :].sum(axis=1),
    )


def _saabas(trees: list[_Tree], inputs: np.ndarray, base: float) -> Contributions:
    """Saabas contributions summed over ``trees``: every row walks every tree at once, one level a step."""
    n, width = inputs.shape
    values = np.zeros((n, width))
    bases = np.full(n, base + sum(float(tree.value[0]) for tree in trees))
    for tree in trees:
        rows, node = np.arange(n), np.zeros(n, dtype=np.intp)
        while len(rows):
            inner = ~tree.leaf[node]
            rows, node = rows[inner], node[inner]
            feature = tree.feature[node]
            x = inputs[rows, feature]
            left = np.where(np.isnan(x), tree.missing_left[node], x <= tree.threshold[node])
            child = np.where(left, tree.left[node], tree.right[node])
            values[rows, feature] += tree.value[child] - tree.value[node]  # one split per row a step
            node = child
    return Contributions("saabas", values, bases)
