"""The model families and the feature sets they can use, each a scikit-learn pipeline.

Every pipeline starts with a ``StandardScaler`` fitted on the training rows only (it matters for logistic
regression; trees are indifferent to it, and one shape for all keeps the saved models alike), then the
classifier with a fixed seed.

Class imbalance (under 1 % of transactions are frauds) is handled with class weights: ``balanced``
(the default) weighs each class by the inverse of its frequency in the training rows, through the
classifier's own ``class_weight``; ``none`` trains on the raw frequencies, as the handbook does. The
alert threshold is chosen separately, on the training period's scores (``models.metrics``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, get_args

from contracts.events import TxColumns
from features.definitions import HANDBOOK_FEATURES, FeatureParams

if TYPE_CHECKING:
    from sklearn.pipeline import Pipeline

ModelKind = Literal[
    "logistic_regression", "decision_tree", "random_forest", "hist_gradient_boosting", "lightgbm"
]
MODEL_KINDS: tuple[str, ...] = get_args(ModelKind)
FeatureSet = Literal["handbook", "all"]
FEATURE_SETS: tuple[str, ...] = get_args(FeatureSet)
ClassWeight = Literal["balanced", "none"]
CLASS_WEIGHTS: tuple[str, ...] = get_args(ClassWeight)


def feature_set(name: FeatureSet, params: FeatureParams) -> tuple[str, ...]:
    """Model inputs: the handbook's 15 features, or the amount and every feature the feature job computes."""
    if name == "handbook":
        return HANDBOOK_FEATURES
    return (TxColumns.AMOUNT, *params.feature_columns)


@dataclass(frozen=True)
class ModelSpec:
    """Which classifier and its few hyper-parameters."""

    kind: ModelKind = "random_forest"
    max_depth: int | None = None
    n_estimators: int = 100
    class_weight: ClassWeight = "balanced"
    seed: int = 0
    n_jobs: int = 2

    def describe(self, train_days: int) -> str:
        """The spec and its training length in words, as the model report names it."""
        depth = "unlimited depth" if self.max_depth is None else f"depth {self.max_depth}"
        weights = "balanced class weights" if self.class_weight == "balanced" else "no class weights"
        return f"{self.kind.replace('_', ' ')}, {depth}, {weights}, {train_days} training days"

    def params(self) -> dict[str, str | int | None]:
        """The spec as MLflow run parameters."""
        return {
            "model": self.kind,
            "max_depth": self.max_depth,
            "n_estimators": self.n_estimators
            if self.kind in ("random_forest", "hist_gradient_boosting", "lightgbm")
            else None,
            "class_weight": self.class_weight,
            "seed": self.seed,
        }


#: The default model of `fraud train` and the demo, and its days of training data: the candidate that
#: validation chose in the model report (docs/models.md, `make eval`; a test checks they agree).
DEFAULT_SPEC = ModelSpec("hist_gradient_boosting", max_depth=3)
DEFAULT_TRAIN_DAYS = 56


def depth_for(kind: str, max_depth: int | None) -> int | None:
    """The maximum depth of a ``kind`` model asked for with ``max_depth`` (None: not given; 0: unlimited):
    the default's own depth for the default's kind, unlimited for the others."""
    if max_depth is None:
        return DEFAULT_SPEC.max_depth if kind == DEFAULT_SPEC.kind else None
    return max_depth or None


def build_pipeline(spec: ModelSpec) -> Pipeline:
    """An unfitted pipeline: scaling, then the classifier of ``spec``."""
    from sklearn.base import ClassifierMixin
    from sklearn.ensemble import HistGradientBoostingClassifier, RandomForestClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler
    from sklearn.tree import DecisionTreeClassifier

    weight = "balanced" if spec.class_weight == "balanced" else None
    classifier: ClassifierMixin
    if spec.kind == "logistic_regression":
        classifier = LogisticRegression(class_weight=weight, max_iter=1000, random_state=spec.seed)
    elif spec.kind == "decision_tree":
        classifier = DecisionTreeClassifier(
            max_depth=spec.max_depth, class_weight=weight, random_state=spec.seed
        )
    elif spec.kind == "random_forest":
        classifier = RandomForestClassifier(
            n_estimators=spec.n_estimators,
            max_depth=spec.max_depth,
            class_weight=weight,
            random_state=spec.seed,
            n_jobs=spec.n_jobs,
        )
    elif spec.kind == "hist_gradient_boosting":
        classifier = HistGradientBoostingClassifier(
            max_iter=spec.n_estimators,
            max_depth=spec.max_depth,
            class_weight=weight,
            early_stopping=False,
            random_state=spec.seed,
        )
    elif spec.kind == "lightgbm":
        from lightgbm import LGBMClassifier

        # The settings of hist_gradient_boosting's (100 trees of at most 31 leaves, learning rate 0.1, 20
        # rows a leaf, 255 bins, no regularisation or subsampling), so the two differ by their library;
        # deterministic: the same model from the same rows, whatever the threads.
        classifier = LGBMClassifier(
            n_estimators=spec.n_estimators,
            max_depth=-1 if spec.max_depth is None else spec.max_depth,
            class_weight=weight,
            random_state=spec.seed,
            n_jobs=spec.n_jobs,
            deterministic=True,
            force_row_wise=True,
            verbose=-1,
        )
    else:
        raise ValueError(f"unknown model {spec.kind!r}; choose one of {', '.join(MODEL_KINDS)}")
    return Pipeline([("scale", StandardScaler()), ("classify", classifier)])
