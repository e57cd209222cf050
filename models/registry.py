"""The model registry: register, list, promote, and the loading contract of the scoring stage.

Every model version of ``fraud-detector`` carries, as version tags, the alert threshold chosen on its
training period and the exact feature columns it expects (in order), so loading needs nothing but the
registry. Nothing here touches MLflow's global state: each call takes the tracking URI (which is also
the registry URI) and builds its own ``MlflowClient``.

Loading is safe by construction: models are saved with skops, and only the types of this project's
pipelines (``TRUSTED_TYPES``, a list kept in this code, not read from the model) may be loaded; a model
holding anything else is refused. Models are only loaded by registered name and alias or version.
"""

from __future__ import annotations

import json
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from contracts.errors import ConfigError, FraudError, NotFoundError, ServiceUnavailableError
from models.contributions import Contributions, contributions

if TYPE_CHECKING:
    from mlflow.entities.model_registry import ModelVersion
    from mlflow.tracking import MlflowClient

#: The registered model the training registers and the scoring stage loads.
MODEL_NAME = "fraud-detector"
#: Aliases a version can hold: the scoring stage serves the champion; a challenger is compared with it.
CHAMPION = "champion"
CHALLENGER = "challenger"
ALIASES = (CHAMPION, CHALLENGER)
#: Version tags that make a version self-describing.
THRESHOLD_TAG = "fraud.threshold"
FEATURE_COLUMNS_TAG = "fraud.feature_columns"
#: Where in its run the model is logged.
MODEL_ARTIFACT_PATH = "model"
#: How long an MLflow server may take to answer its health check before it counts as unreachable.
MLFLOW_PROBE_TIMEOUT_S = 5.0
#: Types beyond skops' defaults that the project's pipelines hold (checked on every load).
TRUSTED_TYPES = (
    "sklearn.tree._tree.Tree",
    "sklearn.ensemble._hist_gradient_boosting.predictor.TreePredictor",
    # LightGBM's classifier and its booster (skops keeps the booster as LightGBM's model text).
    "collections.OrderedDict",
    "lightgbm.basic.Booster",
    "lightgbm.sklearn.LGBMClassifier",
)


class ModelNotFoundError(NotFoundError, LookupError):
    """The registered model, alias or version does not exist."""


class MissingFeaturesError(FraudError, ValueError):
    """A frame to score lacks columns the model needs."""

    def __init__(self, missing: list[str]) -> None:
        super().__init__(f"the frame lacks feature column(s) the model needs: {', '.join(missing)}")
        self.missing = missing


class UntrustedModelError(FraudError):
    """A model artifact holds types this project does not load."""


def check_reachable(tracking_uri: str) -> None:
    """Fail fast when an MLflow server does not answer its health check (MLflow's own client retries for
    minutes). Local stores (``sqlite:``, files) are always there.

    Raises:
        ServiceUnavailableError: the server did not answer within :data:`MLFLOW_PROBE_TIMEOUT_S`.
    """
    parts = urllib.parse.urlsplit(tracking_uri)
    if parts.scheme not in ("http", "https"):
        return
    shown = parts._replace(netloc=(parts.hostname or "") + (f":{parts.port}" if parts.port else "")).geturl()
    try:
        urllib.request.urlopen(f"{tracking_uri.rstrip('/')}/health", timeout=MLFLOW_PROBE_TIMEOUT_S).close()  # noqa: S310 - http(s) only, checked above
    except urllib.error.HTTPError:
        return  # it answered (perhaps asking for credentials): reachable
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ServiceUnavailableError(
            f"MLflow at {shown} did not answer within {MLFLOW_PROBE_TIMEOUT_S:.0f} s ({reason}); "
            "check FRAUD_MLFLOW_TRACKING_URI"
        ) from None


#: What :func:`load_model` imports (MLflow, its SQL stores, skops and with it scikit-learn): seconds in a fresh
#: process, so a process that will load models imports them ahead, e.g. the Spark daemon that forks the
#: scoring workers (``infra.spark.daemon``).
MODEL_LOADING_MODULES = (
    "mlflow.tracking",
    "mlflow.artifacts",
    "mlflow.models",
    "mlflow.store.tracking.sqlalchemy_store",
    "mlflow.store.model_registry.sqlalchemy_store",
    "skops.io",
    # An alert's contributions (models.contributions).
    "lightgbm",
)


def registry_client(tracking_uri: str) -> MlflowClient:
    """A client for the tracking server and registry at ``tracking_uri`` (no global MLflow state).

    Raises:
        ServiceUnavailableError: an MLflow server at ``tracking_uri`` does not answer.
    """
    from mlflow.tracking import MlflowClient

    check_reachable(tracking_uri)
    return MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)


@dataclass(frozen=True)
class LoadedModel:
    """A registered model version, ready to score feature rows."""

    name: str
    version: int
    threshold: float
    feature_columns: tuple[str, ...]
    model: Any

    def score(self, frame: pd.DataFrame) -> np.ndarray:
        """Fraud probability of each row (float64), from the model's feature columns of ``frame``.

        Raises:
            MissingFeaturesError: naming the feature columns ``frame`` lacks.
        """
        probabilities = self.model.predict_proba(self.inputs(frame))
        return np.asarray(probabilities[:, 1], dtype=np.float64)

    def contributions(self, frame: pd.DataFrame) -> Contributions:
        """Each feature's signed contribution to each row's margin, by the model's own trees or
        coefficients (``models.contributions``), columns in :attr:`feature_columns` order.

        Raises:
            MissingFeaturesError: naming the feature columns ``frame`` lacks.
        """
        return contributions(self.model, self.inputs(frame))

    def inputs(self, frame: pd.DataFrame) -> pd.DataFrame:
        """The model's feature columns of ``frame``, in order.

        Raises:
            MissingFeaturesError: naming the feature columns ``frame`` lacks.
        """
        missing = [name for name in self.feature_columns if name not in frame.columns]
        if missing:
            raise MissingFeaturesError(missing)
        return frame[list(self.feature_columns)]


def _not_found(what: str, exc: Exception | None = None) -> ModelNotFoundError:
    detail = f" ({getattr(exc, 'message', exc)})" if exc is not None else ""
    return ModelNotFoundError(
        f"{what} not found in the MLflow registry{detail}; train one with `fraud train` and see "
        "`fraud models list`"
    )


def _version(client: MlflowClient, alias: str | None, version: int | None) -> ModelVersion:
    from mlflow.exceptions import MlflowException

    try:
        if version is not None:
            return client.get_model_version(MODEL_NAME, str(version))
        if alias is None:
            raise ValueError("give an alias or a version")
        return client.get_model_version_by_alias(MODEL_NAME, alias)
    except MlflowException as exc:
        what = f"version {version}" if version is not None else f"alias {alias!r}"
        raise _not_found(f"model {MODEL_NAME!r} {what}", exc) from exc


def resolve_version(tracking_uri: str, alias: str = CHAMPION) -> int:
    """The version ``alias`` points to now: one registry call, cheap enough to poll for hot swaps."""
    return int(_version(registry_client(tracking_uri), alias, None).version)


def load_model(tracking_uri: str, alias: str | None = CHAMPION, version: int | None = None) -> LoadedModel:
    """Load a registered version by ``version`` (when given) or by ``alias``.

    Raises:
        ModelNotFoundError: the model, alias or version does not exist.
        UntrustedModelError: the artifact holds types outside ``TRUSTED_TYPES``.
    """
    client = registry_client(tracking_uri)
    found = _version(client, alias, version)
    tags = found.tags or {}
    if THRESHOLD_TAG not in tags or FEATURE_COLUMNS_TAG not in tags:
        raise ModelNotFoundError(
            f"version {found.version} of {MODEL_NAME!r} has no {THRESHOLD_TAG}/{FEATURE_COLUMNS_TAG} tags: "
            "it was not registered by `fraud train`"
        )
    import mlflow.artifacts

    with tempfile.TemporaryDirectory(prefix="fraud-model-") as tmp:
        local = mlflow.artifacts.download_artifacts(
            artifact_uri=client.get_model_version_download_uri(MODEL_NAME, found.version),
            dst_path=tmp,
            tracking_uri=tracking_uri,
            registry_uri=tracking_uri,
        )
        model = _load_skops(Path(local))
    # One thread per prediction: a forest summed by threads adds its trees' probabilities in whatever
    # order they finish, so the last bits of a score (and the order of tied scores) would vary from run to
    # run. The scoring jobs run many predictions side by side anyway.
    model.set_params(**{name: 1 for name in model.get_params() if name.endswith("n_jobs")})
    return LoadedModel(
        name=MODEL_NAME,
        version=int(found.version),
        threshold=float(tags[THRESHOLD_TAG]),
        feature_columns=tuple(json.loads(tags[FEATURE_COLUMNS_TAG])),
        model=model,
    )


def _load_skops(model_dir: Path) -> Any:
    import skops.io
    from mlflow.models import Model

    flavor = Model.load(model_dir / "MLmodel").flavors.get("sklearn", {})
    if flavor.get("serialization_format") != "skops":
        raise UntrustedModelError(f"{model_dir} is not a skops-serialised scikit-learn model")
    path = model_dir / flavor["pickled_model"]
    untrusted = set(skops.io.get_untrusted_types(file=path))
    if not untrusted <= set(TRUSTED_TYPES):
        raise UntrustedModelError(f"the model holds untrusted types: {', '.join(sorted(untrusted))}")
    return skops.io.load(path, trusted=sorted(untrusted))


# --- Registering, listing and promoting ------------------------------------------------------------


@dataclass(frozen=True)
class VersionInfo:
    """One registered version with its aliases and the metrics of the run that made it."""

    version: int
    aliases: tuple[str, ...]
    run_id: str
    created_ms: int
    tags: Mapping[str, str] = field(default_factory=dict)
    metrics: Mapping[str, float] = field(default_factory=dict)


def register_version(
    tracking_uri: str,
    run_id: str,
    source: str,
    threshold: float,
    feature_columns: tuple[str, ...],
    tags: Mapping[str, str],
) -> tuple[int, tuple[str, ...]]:
    """Register the model logged at ``source`` by ``run_id`` as a new version.

    The threshold and feature columns become version tags. When no version holds the champion alias yet
    (the first model of an empty registry, in particular), the new version becomes the champion.

    Returns:
        The new version and the aliases it got.
    """
    from mlflow.exceptions import MlflowException

    client = registry_client(tracking_uri)
    try:
        client.get_registered_model(MODEL_NAME)
    except MlflowException:
        client.create_registered_model(
            MODEL_NAME, description="Card-fraud scoring model: fraud probability per transaction."
        )
    version_tags = {
        **tags,
        THRESHOLD_TAG: repr(float(threshold)),
        FEATURE_COLUMNS_TAG: json.dumps(list(feature_columns)),
    }
    created = client.create_model_version(MODEL_NAME, source=source, run_id=run_id, tags=version_tags)
    version = int(created.version)
    if CHAMPION not in client.get_registered_model(MODEL_NAME).aliases:
        client.set_registered_model_alias(MODEL_NAME, CHAMPION, str(version))
        return version, (CHAMPION,)
    return version, ()


def promote(tracking_uri: str, version: int, alias: str) -> int | None:
    """Point ``alias`` at ``version``; returns the version it pointed to before (None if unset)."""
    from mlflow.exceptions import MlflowException

    if alias not in ALIASES:
        raise ValueError(f"alias must be one of {', '.join(ALIASES)}")
    client = registry_client(tracking_uri)
    _version(client, None, version)  # fails clearly when the version does not exist
    try:
        previous: int | None = int(client.get_model_version_by_alias(MODEL_NAME, alias).version)
    except MlflowException:
        previous = None
    client.set_registered_model_alias(MODEL_NAME, alias, str(version))
    return previous


#: Version tags an A/B comparison leaves on the challenger: its decision, and the MLflow run that holds
#: the evidence (the metrics and the report).
AB_DECISION_TAG = "fraud.ab.decision"
AB_RUN_TAG = "fraud.ab.run_id"
AB_REASON_TAG = "fraud.ab.reason"
PROMOTE, KEEP = "promote", "keep"


def resolve_reference(tracking_uri: str, reference: str) -> int:
    """The version a model reference names: an alias (``champion``), a version number (``3``), or a
    model URI (``models:/fraud-detector@challenger``, ``models:/fraud-detector/3``).

    Raises:
        ConfigError: the reference is of none of these forms, or names another registered model.
        ModelNotFoundError: the alias or version does not exist.
    """
    text = reference.strip()
    if text.startswith("models:/"):
        name, _, rest = text.removeprefix("models:/").partition("@")
        if rest:  # models:/NAME@ALIAS
            _check_name(name, reference)
            return int(_version(registry_client(tracking_uri), rest, None).version)
        name, _, number = text.removeprefix("models:/").partition("/")
        _check_name(name, reference)
        text = number
    if text.isdigit():
        return int(_version(registry_client(tracking_uri), None, int(text)).version)
    if text in ALIASES:
        return int(_version(registry_client(tracking_uri), text, None).version)
    raise ConfigError(
        f"model {reference!r}: give an alias ({', '.join(ALIASES)}), a version number, or models:/{MODEL_NAME}@ALIAS"
    )


def _check_name(name: str, reference: str) -> None:
    if name != MODEL_NAME:
        raise ConfigError(f"model {reference!r}: only {MODEL_NAME!r} is registered by this project")


def tag_version(tracking_uri: str, version: int, tags: Mapping[str, str]) -> None:
    """Set tags on a registered version (an A/B decision and its evidence)."""
    client = registry_client(tracking_uri)
    for key, value in tags.items():
        client.set_model_version_tag(MODEL_NAME, str(version), key, value)


def promotion_evidence(tracking_uri: str, version: int) -> str | None:
    """The A/B run that recommended promoting ``version`` to champion, or None when there is none."""
    tags = _version(registry_client(tracking_uri), None, version).tags or {}
    return tags.get(AB_RUN_TAG) if tags.get(AB_DECISION_TAG) == PROMOTE else None


def list_versions(tracking_uri: str) -> list[VersionInfo]:
    """Every version of ``fraud-detector``, newest first, with its aliases and run metrics."""
    from mlflow.exceptions import MlflowException

    client = registry_client(tracking_uri)
    try:
        aliases = client.get_registered_model(MODEL_NAME).aliases
    except MlflowException:
        return []
    by_version: dict[int, list[str]] = {}
    for alias, version in aliases.items():
        by_version.setdefault(int(version), []).append(alias)
    infos = []
    for found in client.search_model_versions(f"name = '{MODEL_NAME}'"):
        metrics = client.get_run(found.run_id).data.metrics if found.run_id else {}
        infos.append(
            VersionInfo(
                version=int(found.version),
                aliases=tuple(sorted(by_version.get(int(found.version), []))),
                run_id=found.run_id or "",
                created_ms=int(found.creation_timestamp or 0),
                tags=dict(found.tags or {}),
                metrics=dict(metrics),
            )
        )
    return sorted(infos, key=lambda info: info.version, reverse=True)
