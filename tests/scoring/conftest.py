"""The scoring tests share the model tests' small simulated world and MLflow store fixtures."""

from tests.models.conftest import blank_store, small_dataset, small_frame, store_uri

__all__ = ["blank_store", "small_dataset", "small_frame", "store_uri"]
