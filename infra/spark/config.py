"""Typed configuration for the project's Spark data sources, through Spark's string options.

Spark hands a Python data source its options as strings. Rather than spell a configuration as loose
string options (each parsed, validated and defaulted again where it is read), a job passes ONE object,
a frozen dataclass, in the option :data:`CONFIG_OPTION`; the data source gets the same object back in the
driver and in the executors. Callables it holds (a decoder, an after-commit hook) travel with it: they
are pickled by reference to their module, which every executor has installed.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import TypeVar

from pyspark import cloudpickle

from contracts.errors import ConfigError

#: The one option a project data source reads. It carries credentials (a SASL password inside the Kafka
#: settings), so its name matches Spark's ``spark.redaction.regex`` (``secret``): Spark shows it as
#: redacted in query plans, ``explain`` and the UI.
CONFIG_OPTION = "config_secret"

T = TypeVar("T")


def config_options(config: object) -> dict[str, str]:
    """Options for ``.options(**...)`` that carry ``config`` whole."""
    return {CONFIG_OPTION: base64.b64encode(cloudpickle.dumps(config)).decode("ascii")}


def config_from(options: Mapping[str, str], kind: type[T]) -> T:
    """The configuration object in a data source's options (keys are case-insensitive there).

    Raises:
        ConfigError: the options carry no configuration, or one of another kind.
    """
    raw = next((value for key, value in options.items() if key.lower() == CONFIG_OPTION), None)
    if raw is None:
        raise ConfigError(
            f"option {CONFIG_OPTION!r} is missing: build the options with config_options({kind.__name__}(...))"
        )
    # Trusted: written by config_options in the same job (Spark options never come from outside it).
    config = cloudpickle.loads(base64.b64decode(raw))
    if not isinstance(config, kind):
        raise ConfigError(f"option {CONFIG_OPTION!r} holds a {type(config).__name__}, not a {kind.__name__}")
    return config
