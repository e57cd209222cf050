"""The project's one error root, and the kinds a caller (the CLI above all) tells apart.

Every error the project raises on purpose derives from :class:`FraudError`, as Quix Streams' errors derive
from ``QuixException``: a caller catches one type, and the ``fraud`` command turns each into one line and
the kind's exit code. Record-level problems are not errors: a record that cannot be processed becomes a
dead letter (``contracts.events.DeadLetter``) and the records around it go on.
"""

from __future__ import annotations


class FraudError(Exception):
    """Root of every error the project raises on purpose."""

    #: Exit code of the ``fraud`` command when this error ends it.
    exit_code = 1


class ConfigError(FraudError):
    """A setting, option, file or argument given by the user cannot be used as it is."""

    exit_code = 2


class ServiceUnavailableError(FraudError):
    """Kafka, Redis, MLflow or Spark cannot be reached, or is not configured."""

    exit_code = 3


class NotFoundError(FraudError):
    """Something asked for by name does not exist (a topic, a model alias or version)."""

    exit_code = 4


class StateError(FraudError):
    """Stored state (a checkpoint, a sink's commit markers) does not fit the run that wants to use it."""

    exit_code = 5


class RecordsRejectedError(FraudError):
    """The command did its work, but some input records went to the dead-letter topic instead of being
    used: the others are in, and the dead letters say why each was refused."""

    exit_code = 6
