"""Who the API lets in: with a token, only a request that sends it as a bearer, on every route but those
that hold no data; an empty token is refused when the app is made, never taken as "no authentication".

Property-based over the Authorization header (absent, empty, blank, other schemes, the token with
something around it) and over tokens, as the API fuzz tests are (tests/integration/test_alerts_api.py).
The routes read a stand-in reader of the jobs' state, so no Redis is needed to be let in or kept out.
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.routing import Route

from api.app import OPEN_PATHS, create_app
from contracts.errors import ConfigError
from tests.api.test_state import CARD, States

#: Tokens a server may have (visible ASCII, no spaces): a few kinds, each server made once.
TOKENS = ("s3cret", "x", "Bearer", "a+b/c=", "0123456789abcdef" * 4, "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
APIS = {token: TestClient(create_app(None, token=token, states=States())) for token in TOKENS}
HEADER_TEXT = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=50)


def authorization(token: str) -> st.SearchStrategy[str | None]:
    """Authorization headers a client may send to a server with ``token``: mostly wrong ones."""
    return st.one_of(
        st.none(),
        st.sampled_from(["", " ", "Bearer", "Bearer ", "Bearer  ", "Basic", f"Basic {token}", token]),
        HEADER_TEXT,
        HEADER_TEXT.map(lambda text: f"Bearer {text}"),
        st.tuples(HEADER_TEXT, HEADER_TEXT).map(lambda ends: f"Bearer {ends[0]}{token}{ends[1]}"),
        st.just(f"Bearer {token}"),
        st.sampled_from(["bearer", "BEARER"]).map(lambda scheme: f"{scheme} {token}"),
    )


def data_paths(api: TestClient) -> list[str]:
    """Every route of the app but the open ones, with a path that reaches it."""
    routes = [route.path for route in api.app.routes if isinstance(route, Route)]  # type: ignore[attr-defined]
    filled = {"{tx_id}": "1", "{card_id}": CARD, "{terminal_id}": "T-1"}
    paths = []
    for path in routes:
        if path in OPEN_PATHS:
            continue
        for name, value in filled.items():
            path = path.replace(name, value)
        paths.append(path)
    return paths


@settings(max_examples=60)
@given(token=st.sampled_from(TOKENS), data=st.data())
def test_only_the_token_as_a_bearer_lets_a_request_in(token: str, data: st.DataObject) -> None:
    header = data.draw(authorization(token))
    answer = APIS[token].get(
        f"/state/cards/{CARD}", headers={} if header is None else {"Authorization": header}
    )
    scheme, _, given = (header or "").strip().partition(" ")  # a header's value arrives stripped
    if scheme.lower() == "bearer" and given == token:
        assert answer.status_code == 200, header
    else:
        assert answer.status_code == 401, header
        assert answer.headers["WWW-Authenticate"] == "Bearer"


@pytest.mark.parametrize("token", ["", " ", "\t", " \n ", "two words", "tab\there", "caf\u00e9"])
def test_an_empty_blank_or_unsendable_token_is_refused_when_the_app_is_made(token: str) -> None:
    with pytest.raises(ConfigError, match="API token"):
        create_app(None, token=token, states=States())


def test_every_route_but_liveness_the_page_and_the_description_needs_the_token() -> None:
    api = TestClient(create_app(None, token="s3cret", states=States()))  # noqa: S106 - a test token
    paths = data_paths(api)
    assert "/metrics" in paths and f"/state/cards/{CARD}" in paths and "/alerts/recent" in paths
    for path in paths:
        answer = api.get(path)
        assert answer.status_code == 401, path
    assert api.get("/metrics", headers={"Authorization": "Bearer s3cret"}).status_code == 200
    for path in ("/", "/docs", "/openapi.json"):
        assert api.get(path).status_code == 200, path
    assert "s3cret" not in api.get("/").text + api.get("/openapi.json").text


def test_without_a_token_every_route_is_open() -> None:
    api = TestClient(create_app(None, states=States()))
    assert api.get(f"/state/cards/{CARD}").status_code == 200
    assert api.get("/metrics").status_code == 200
