"""The API's state routes over a reader of the jobs' state (a stand-in here: the reads themselves are
tested against a running job in tests/integration/test_state_query.py): what they pass on, and how what
the reader raises becomes an answer."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from contracts.errors import NotFoundError, StateError
from scoring.api import create_app

CARD = "0123456789abcdef0123456789abcdef"


class States:
    """Answers with what it was asked; raises for the card and terminal ``missing`` and ``foreign``."""

    def card(self, job: str, namespace: str, card_id: str) -> dict[str, Any]:
        return self._answer(job, namespace, card_id)

    def terminal(self, job: str, namespace: str, terminal_id: str) -> dict[str, Any]:
        return self._answer(job, namespace, terminal_id)

    def _answer(self, job: str, namespace: str, name: str) -> dict[str, Any]:
        if name in ("missing", "f" * 32):
            raise NotFoundError(f"the state holds nothing for {name}")
        if name == "foreign":
            raise StateError("the checkpoint keeps no state variable 'bucket': it is not this job's")
        return {"job": job, "namespace": namespace, "name": name}


def test_the_routes_pass_the_job_namespace_and_key_on() -> None:
    api = TestClient(create_app(None, states=States()))
    assert api.get(f"/state/cards/{CARD}").json() == {"job": "features", "namespace": "", "name": CARD}
    answer = api.get("/state/terminals/T-12", params={"job": "pipeline", "namespace": "v2"})
    assert answer.json() == {"job": "pipeline", "namespace": "v2", "name": "T-12"}


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
    plain = TestClient(create_app(None)).get(f"/state/cards/{CARD}")
    assert plain.status_code == 404 and plain.json()["detail"] == "this server does not read the jobs' state"


def test_a_token_guards_the_state_as_every_data_route() -> None:
    api = TestClient(create_app(None, token="s3cret", states=States()))  # noqa: S106 - a test token
    assert api.get(f"/state/cards/{CARD}").status_code == 401
    allowed = api.get(f"/state/cards/{CARD}", headers={"Authorization": "Bearer s3cret"})
    assert allowed.status_code == 200
