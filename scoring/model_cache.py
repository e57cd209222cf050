"""The worker's model cache: each Python worker loads a model version once and keeps it (and the shadow's)."""

from __future__ import annotations

import gc

from contracts.errors import ServiceUnavailableError
from contracts.privacy import redact_url
from infra.retry import wait_out
from models.registry import LoadedModel, load_model

#: Models loaded in this worker process, by (tracking URI, version).
_MODELS: dict[tuple[str, int], LoadedModel] = {}


#: Versions a worker keeps loaded: the one serving and the shadow's.
KEPT_MODELS = 2


def worker_model(tracking_uri: str, version: int) -> LoadedModel:
    """The model version, loaded once per worker process (the oldest loaded one is dropped). A worker
    that needs it while MLflow is away waits for MLflow (``infra.retry.wait_out``) rather than fail."""
    key = (tracking_uri, version)
    if key not in _MODELS:
        while len(_MODELS) >= KEPT_MODELS:
            del _MODELS[next(iter(_MODELS))]  # a replaced version is never needed again
        _MODELS[key] = wait_out(
            lambda: load_model(tracking_uri, version=version),
            f"MLflow at {redact_url(tracking_uri)}",
            (ServiceUnavailableError,),
        )
        # The model, and the MLflow and scikit-learn modules imported to load it, live as long as the
        # worker: out of the full collection PySpark runs after every task (it took 100-300 ms a task).
        # Unfrozen first, so that the collection frees what the replaced model leaves behind.
        gc.unfreeze()
        gc.collect()
        gc.freeze()
    return _MODELS[key]
