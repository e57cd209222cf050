"""Which model version scores each micro-batch: the driver's choice, recorded before the batch is written.

The driver re-reads the alias (``champion`` by default) every ``model_check_interval_s``. A new version is
loaded once in the driver first; if that fails, the old version keeps serving and the error is logged. The
switch happens between micro-batches, and the version chosen for each batch id is kept in the checkpoint,
so a micro-batch re-run after a crash is scored by the version it was scored by the first time.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from contracts.errors import ConfigError
from contracts.events import TxColumns
from features.definitions import FEATURE_COLUMNS
from infra.spark.checkpoint import PerBatch
from models.registry import MODEL_NAME, LoadedModel, ModelNotFoundError, load_model, resolve_version

C = TxColumns
_log = logging.getLogger(__name__)


class ModelChooser:
    """Which model version scores each micro-batch.

    The alias is re-read at most every ``interval_s``, off the micro-batch's path: the check runs in a
    thread of its own and a micro-batch waits for it at most ``check_timeout_s`` (an MLflow outage costs
    one such wait per interval, never a stalled job; the version serving goes on serving). A version that
    fails to load keeps the current one serving. The choice for each batch id is recorded in ``path``
    before the batch is written, so a re-run of a batch (after a crash) uses the version it used the first
    time.
    """

    #: Batch ids remembered: a re-run is always the last batch or so.
    KEPT = 100

    def __init__(
        self, tracking_uri: str, alias: str, *, interval_s: float, path: Path, check_timeout_s: float = 2.0
    ) -> None:
        self.tracking_uri = tracking_uri
        self.alias = alias
        self.interval_s = interval_s
        self.check_timeout_s = check_timeout_s
        self.chosen = PerBatch(path, self.KEPT)
        self.current: LoadedModel | None = None
        self.checked_at = -float("inf")
        self._checking: threading.Thread | None = None
        self._failing = False

    def version_for(self, batch_id: int) -> int:
        """The version that scores ``batch_id`` (recorded before it is returned)."""
        return int(self.chosen.get(batch_id, self._serving))

    def _serving(self) -> int:
        """The version serving now (the alias checked if it is time)."""
        if self.current is None:
            self.refresh()  # the first: raises when there is no model at all
        elif time.monotonic() - self.checked_at >= self.interval_s:
            self._check()
        if self.current is None:  # pragma: no cover - refresh raises instead
            raise ModelNotFoundError(f"no model for alias {self.alias!r}")
        return self.current.version

    def _check(self) -> None:
        """Re-read the alias in the background, waiting for it at most ``check_timeout_s``; while an
        earlier check still waits for the registry, the micro-batch does not wait at all."""
        if self._checking is not None and self._checking.is_alive():
            return
        self.checked_at = time.monotonic()
        self._checking = threading.Thread(target=self.refresh, name=f"alias-{self.alias}", daemon=True)
        self._checking.start()
        self._checking.join(self.check_timeout_s)

    def refresh(self) -> None:
        """Re-read the alias; switch to its version if that version loads.

        Raises:
            ModelNotFoundError: there is no model to serve at all (nothing loaded yet).
        """
        self.checked_at = time.monotonic()
        try:
            version = resolve_version(self.tracking_uri, self.alias)
            loaded = (
                self.current
                if self.current is not None and version == self.current.version
                else load_model(self.tracking_uri, version=version)
            )
        except Exception as exc:
            if self.current is None:
                raise
            if not self._failing:  # one line per outage, not one per check
                _log.error(
                    "model alias %r: cannot check or switch (%s); version %d keeps serving",
                    self.alias,
                    exc,
                    self.current.version,
                )
            self._failing = True
            return
        if self._failing:
            _log.warning("model alias %r: checks work again", self.alias)
            self._failing = False
        if self.current is not None and loaded.version != self.current.version:
            _log.warning(
                "model alias %r moved: version %d -> %d from the next micro-batch",
                self.alias,
                self.current.version,
                loaded.version,
            )
        self.current = loaded


def model_chooser(
    tracking_uri: str, alias: str, *, interval_s: float, checkpoint: Path, role: str = "model"
) -> ModelChooser:
    """The chooser of a job's model versions (``role``: the serving ``model`` or the ``shadow``), with the
    current one loaded.

    Raises:
        ModelNotFoundError: no model holds the alias (train one with ``fraud train``): the job fails at
            its start, not in its first micro-batch.
        ConfigError: the model needs features the feature records do not carry.
    """
    checkpoint.mkdir(parents=True, exist_ok=True)
    chooser = ModelChooser(
        tracking_uri, alias, interval_s=interval_s, path=checkpoint / f"{role}-versions.json"
    )
    chooser.refresh()
    if chooser.current is not None:
        check_computable(chooser.current, f"{MODEL_NAME}@{alias} (version {chooser.current.version})")
    return chooser


def check_computable(model: LoadedModel, name: str) -> None:
    """Raise ConfigError when ``model`` needs a feature the feature definitions do not compute."""
    missing = sorted(set(model.feature_columns) - {*FEATURE_COLUMNS, C.AMOUNT})
    if missing:
        raise ConfigError(f"{name} needs features the feature job does not compute: {', '.join(missing)}")


def batch_versions(batch_id: int, chooser: ModelChooser, shadow: ModelChooser | None) -> dict[str, int]:
    """The versions that score ``batch_id``, by role: the serving ``model`` and, with one, the ``shadow``."""
    versions = {"model": chooser.version_for(batch_id)}
    if shadow is not None:
        versions["shadow"] = shadow.version_for(batch_id)
    return versions


def model_choosers(
    tracking_uri: str, *, alias: str, shadow_alias: str | None, interval_s: float, checkpoint: Path
) -> tuple[ModelChooser, ModelChooser | None]:
    """The choosers of a job's serving model and of its shadow (None without one): see
    :func:`model_chooser`."""
    shadow = (
        None
        if shadow_alias is None
        else model_chooser(
            tracking_uri, shadow_alias, interval_s=interval_s, checkpoint=checkpoint, role="shadow"
        )
    )
    return model_chooser(tracking_uri, alias, interval_s=interval_s, checkpoint=checkpoint), shadow
