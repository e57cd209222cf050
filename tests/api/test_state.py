"""The API's state routes over a reader of the jobs' state (a stand-in here: the reads themselves are
tested against a running job in tests/integration/test_state_query.py): what they pass on, and how what
the reader raises becomes an answer."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from api.app import create_app
from contracts.errors import NotFoundError, StateError

CARD = "0123456789abcdef0123456789abcdef"


def read_at(job: str, namespace: str) -> dict[str, Any]:
    """Where a view says it was read: the job and namespace asked for, in the checkpoint's path."""
    return {
        "checkpoint": f"/home/checkpoints/{namespace}/{job}",
        "batch_id": 7,
        "frontier_ms": 5,
        "final": False,
    }


def card_view(job: str, namespace: str, card_id: str) -> dict[str, Any]:
    window = {"window": "1 d", "window_ms": 86_400_000, "feature": "card_nb_tx_1d", "nb_tx": 2}
    return {
        "card_id": card_id,
        **read_at(job, namespace),
        "card_bucket": 1,
        "card_buckets": 6,
        "bucket_frontier_ms": 5,
        "windows_end_ms": 5,
        "windows": [{**window, "amount_sum": 3.5, "avg_amount": 1.75}],
        "events": [{"tx_id": 1, "kind": "tx"}],
    }


def terminal_view(job: str, namespace: str, terminal_id: str) -> dict[str, Any]:
    return {
        "terminal_id": terminal_id,
        **read_at(job, namespace),
        "terminal_bucket": 2,
        "terminal_buckets": 6,
        "transaction_times_ms": [1, 2],
        "labels": [],
        "windows": [{"window": "1 d", "window_ms": 86_400_000, "nb_tx": 2, "risk": 0.5}],
    }


class States:
    """Answers views of what it was asked; raises for the card and terminal ``missing`` and ``foreign``."""

    def card(self, job: str, namespace: str, card_id: str) -> dict[str, Any]:
        self._check(card_id)
        return card_view(job, namespace, card_id)

    def terminal(self, job: str, namespace: str, terminal_id: str) -> dict[str, Any]:
        self._check(terminal_id)
        return terminal_view(job, namespace, terminal_id)

    def _check(self, name: str) -> None:
        if name in ("missing", "f" * 32):
            raise NotFoundError(f"the state holds nothing for {name}")
        if name == "foreign":
            raise StateError("the checkpoint keeps no state variable 'bucket': it is not this job's")


def test_the_routes_pass_the_job_namespace_and_key_on_and_answer_the_views() -> None:
    api = TestClient(create_app(None, states=States()))
    assert api.get(f"/state/cards/{CARD}").json() == card_view("features", "", CARD)
    answer = api.get("/state/terminals/T-12", params={"job": "pipeline", "namespace": "v2"})
    assert answer.json() == terminal_view("pipeline", "v2", "T-12")
    schemas = api.get("/openapi.json").json()["components"]["schemas"]
    assert {"CardStateView", "TerminalStateView", "CardWindow", "TerminalWindow"} <= set(schemas)


def test_what_the_reader_raises_is_a_404_or_a_409_with_its_reason() -> None:
    api = TestClient(create_app(None, states=States()))
    missing = api.get(f"/state/cards/{'f' * 32}")
    assert (missing.status_code, missing.json()["detail"]) == (404, f"the state holds nothing for {'f' * 32}")
    foreign = api.get("/state/terminals/foreign")
    assert foreign.status_code == 409 and "not this job's" in foreign.json()["detail"]


def test_bad_requests_and_a_server_without_a_reader() -> None:
    api = TestClient(create_app(None, states=States()))
    assert api.get("/state/cards/not-a-token").status_code == 422
    assert api.get(f"/state/cards/{CARD}", params={"job": "scoring"}).status_code == 422
    plain = TestClient(create_app(None))  # a server without a reader: no state routes
    assert plain.get(f"/state/cards/{CARD}").status_code == 404
    assert not [path for path in plain.get("/openapi.json").json()["paths"] if path.startswith("/state")]


def test_a_token_guards_the_state_as_every_data_route() -> None:
    api = TestClient(create_app(None, token="s3cret", states=States()))  # noqa: S106 - a test token
    assert api.get(f"/state/cards/{CARD}").status_code == 401
    allowed = api.get(f"/state/cards/{CARD}", headers={"Authorization": "Bearer s3cret"})
    assert allowed.status_code == 200
