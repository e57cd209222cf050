"""A job's committed state, read for the API (``GET /state/cards/{card_id}``, ``/state/terminals/{id}``)
as ``fraud state`` reads it: from the job's checkpoint under ``FRAUD_HOME``, with Spark's state data source,
read-only beside the running job.

The job and namespace come from clients: they are checked against the names the project gives (never a
path), the checkpoint is resolved inside ``FRAUD_HOME`` only, and what the service says names
``FRAUD_HOME``, never its absolute path.

Each read is a small Spark batch job; the service starts its local Spark session at the first read (a few
seconds: the API answers everything else from Redis without a JVM) and keeps it for the next ones, which
take a second or so. Reads go one at a time.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from api.state import STATE_JOBS
from contracts.errors import ConfigError, FraudError, NotFoundError, ServiceUnavailableError, StateError
from contracts.settings import NAMESPACE_PATTERN, Settings
from features.definitions import FeatureParams
from fraud.options import checkpoint_dir, feature_params

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: The kinds of error a read re-raises as (its message made relative): the first that the error is.
ERROR_KINDS = (NotFoundError, StateError, ConfigError, ServiceUnavailableError, FraudError)
#: The Spark master of a state read: a local session of the reading process, whatever the jobs run on.
STATE_MASTER = "local[2]"


def state_session(settings: Settings, app_name: str) -> SparkSession:
    """A local Spark session to read a job's state with."""
    from infra.spark.session import spark_session  # heavy: PySpark, imported only when the state is read

    return spark_session(settings.model_copy(update={"spark_master": STATE_MASTER}), app_name=app_name)


def state_checkpoint(settings: Settings, job: str, namespace: str) -> Path:
    """The checkpoint of a stateful job in a namespace, for a reader that takes both from a client (the
    API): the names the project gives them, so always a directory inside ``FRAUD_HOME/checkpoints``.

    Raises:
        ConfigError: ``job`` is not a stateful job's name, or ``namespace`` not a namespace's; or the
            directory resolves outside ``FRAUD_HOME/checkpoints`` (a link). The message names no path.
    """
    if job not in STATE_JOBS:
        raise ConfigError(f"no stateful job is called {job[:40]!r}: give one of {', '.join(STATE_JOBS)}")
    if namespace and not re.match(NAMESPACE_PATTERN, namespace):
        raise ConfigError("a namespace is 1 to 40 lower-case letters, digits and dashes")
    root = (settings.home / "checkpoints").resolve()
    checkpoint = checkpoint_dir(settings, None, job, namespace)
    if not checkpoint.is_relative_to(root):
        raise ConfigError(f"the checkpoint of {job} in namespace {namespace!r} leads outside FRAUD_HOME")
    return checkpoint


class StateService:
    """What the feature job (or the pipeline) of a namespace holds for a card or a terminal, as JSON
    (``features.inspect``'s views).

    Args:
        settings: where the checkpoints are (``FRAUD_HOME``), and Spark's settings.
        params: the features' parameters (their windows) the views are computed with when a checkpoint
            does not record its job's (``features.inspect.JobState.params``; default: the settings').
        session: makes the Spark session (default: :func:`state_session`); the service stops it on
            :meth:`close` only when it made it.
    """

    def __init__(
        self,
        settings: Settings,
        params: FeatureParams | None = None,
        session: Callable[[], SparkSession] | None = None,
    ) -> None:
        self.settings = settings
        self.params = params or feature_params(settings)
        self._make = session or (lambda: state_session(settings, "fraud-api-state"))
        self._owned = session is None
        self._spark: SparkSession | None = None
        self._lock = threading.Lock()

    def card(self, job: str, namespace: str, card_id: str) -> dict[str, Any]:
        """The card's view (``features.inspect.CardView.as_json``).

        Raises:
            ConfigError: ``job`` or ``namespace`` is not a name the project gives (:func:`state_checkpoint`).
            NotFoundError: no checkpoint of the job, nothing committed, or nothing held for the card.
            StateError: the checkpoint is not of a feature job.
        """
        from features.inspect import read_card

        return self._read(
            job,
            namespace,
            lambda spark, state: read_card(spark, state, card_id, state.params_or(self.params)),
        )

    def terminal(self, job: str, namespace: str, terminal_id: str) -> dict[str, Any]:
        """The terminal's view (``features.inspect.TerminalView.as_json``); raises as :meth:`card`."""
        from features.inspect import read_terminal

        return self._read(
            job,
            namespace,
            lambda spark, state: read_terminal(spark, state, terminal_id, state.params_or(self.params)),
        )

    def _read(self, job: str, namespace: str, read: Callable[[SparkSession, Any], Any]) -> dict[str, Any]:
        from features.inspect import open_job_state

        checkpoint = state_checkpoint(self.settings, job, namespace)
        try:
            state = open_job_state(checkpoint)
            with self._lock:
                if self._spark is None:
                    self._spark = self._make()
                view: dict[str, Any] = read(self._spark, state).as_json()
        except FraudError as exc:  # what it says goes to API clients: FRAUD_HOME's place is not theirs
            kind = next(kind for kind in ERROR_KINDS if isinstance(exc, kind))
            raise kind(self._relative(str(exc))) from None
        view["checkpoint"] = self._relative(view["checkpoint"])
        return view

    def _relative(self, text: str) -> str:
        """``text`` with the absolute path of ``FRAUD_HOME`` written ``FRAUD_HOME``."""
        return text.replace(str(self.settings.home.resolve()), "FRAUD_HOME")

    def close(self) -> None:
        """Stop the Spark session, if the service started one."""
        with self._lock:
            if self._spark is not None and self._owned:
                self._spark.stop()
            self._spark = None
