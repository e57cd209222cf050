"""The alert lookup API against a real Valkey server: every endpoint, unknown ids (404), malformed ids (422)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
import redis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from redis.backoff import NoBackoff
from redis.retry import Retry

from api.app import create_app
from contracts.records import AlertRecord
from contracts.redis_keys import card_features_key
from infra.embedded.stack import StackInfo
from infra.redis.store import set_latest, write_alerts, write_scores
from tests.support.factories import CARD_A, CARD_B, T0_MS, make_alert, make_score

RETENTION_S = 7 * 86_400
UNKNOWN_CARD = "e" * 32


@pytest.fixture
def store(stack: StackInfo) -> Iterator[tuple[Any, str]]:
    client = redis.Redis.from_url(stack.redis_url)
    prefix = f"test-{uuid.uuid4().hex[:10]}:"
    write_alerts(client, [make_alert(1), make_alert(2), make_alert(3, card_id=CARD_B)], prefix, RETENTION_S)
    write_scores(client, [make_score(2), make_score(3, card_id=CARD_B)], prefix, RETENTION_S)
    set_latest(
        client,
        [
            (
                card_features_key(CARD_A, prefix),
                T0_MS + 2000,
                2,
                {"terminal_id": "3156", "amount": 250.5, "late": 0, "card_nb_tx_1d": 2.0},
            )
        ],
        RETENTION_S,
    )
    yield client, prefix
    client.close()


@pytest.fixture
def api(store: tuple[Any, str]) -> TestClient:
    client, prefix = store
    return TestClient(create_app(client, prefix))


def test_healthz(api: TestClient) -> None:
    assert api.get("/healthz").json() == {"status": "ok", "redis": True}


def test_healthz_reports_an_unreachable_redis() -> None:
    from infra.embedded.stack import free_port

    dead = redis.Redis(
        host="127.0.0.1", port=free_port(), socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0)
    )
    response = TestClient(create_app(dead)).get("/healthz")
    assert response.status_code == 503
    assert response.json() == {"detail": "redis unreachable"}, "what the error says stays in the server"
    for path in ("/alerts/recent", "/alerts/1", f"/cards/{CARD_A}", f"/cards/{CARD_A}/alerts"):
        response = TestClient(create_app(dead)).get(path)
        assert (response.status_code, response.json()) == (503, {"detail": "redis unreachable"}), path


def test_with_a_token_every_data_endpoint_requires_it(store: tuple[Any, str]) -> None:
    client, prefix = store
    api = TestClient(create_app(client, prefix, token="s3cret-token"))  # noqa: S106 - a test token
    paths = ["/alerts/recent", "/alerts/1", f"/cards/{CARD_A}", f"/cards/{CARD_A}/alerts"]
    for path in paths:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret-token"}):
            response = api.get(path, headers=headers)
            assert response.status_code == 401, (path, headers)
            assert response.headers["WWW-Authenticate"] == "Bearer"
        assert api.get(path, headers={"Authorization": "Bearer s3cret-token"}).status_code == 200, path
    assert api.get("/healthz").status_code == 200
    assert api.get("/").status_code == 200, "the page holds no data: it sends the token it is given"
    assert "s3cret-token" not in api.get("/").text


def test_recent_alerts_newest_first_with_limit_and_after(api: TestClient) -> None:
    body = api.get("/alerts/recent").json()
    assert [a["tx_id"] for a in body] == [3, 2, 1]
    assert [AlertRecord.model_validate(a) for a in body][1] == make_alert(2)
    assert [a["tx_id"] for a in api.get("/alerts/recent", params={"limit": 1}).json()] == [3]
    after = make_alert(1).event_time_ms
    assert [a["tx_id"] for a in api.get("/alerts/recent", params={"after_ms": after}).json()] == [3, 2]


@pytest.mark.parametrize("params", [{"limit": 0}, {"limit": 5000}, {"limit": "x"}, {"after_ms": -1}])
def test_recent_alerts_rejects_bad_parameters(api: TestClient, params: dict[str, object]) -> None:
    assert api.get("/alerts/recent", params=params).status_code == 422


def test_alert_by_tx_id(api: TestClient) -> None:
    response = api.get("/alerts/2")
    assert response.status_code == 200
    assert AlertRecord.model_validate(response.json()) == make_alert(2)
    assert api.get("/alerts/999").status_code == 404


@pytest.mark.parametrize("tx_id", ["abc", "-1", "1.5", str(2**63)])
def test_alert_rejects_malformed_tx_ids(api: TestClient, tx_id: str) -> None:
    assert api.get(f"/alerts/{tx_id}").status_code == 422


def test_the_metrics_count_answers_by_route_template(store: tuple[Any, str]) -> None:
    client, prefix = store
    api = TestClient(create_app(client, prefix, token="secret-token"))  # noqa: S106 - a test token
    auth = {"Authorization": "Bearer secret-token"}
    assert api.get("/alerts/2", headers=auth).status_code == 200
    assert api.get("/alerts/6").status_code == 401
    assert api.get("/alerts/nope", headers=auth).status_code == 422
    assert api.get("/healthz").status_code == 200
    assert api.get("/metrics").status_code == 401, "who looks at what, and how often: behind the token"
    scraped = api.get("/metrics", headers=auth)
    assert scraped.status_code == 200 and scraped.headers["content-type"].startswith("text/plain")
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(scraped.text)
        for sample in family.samples
    }

    def answered(route: str, status: int) -> float:
        labels = (("method", "GET"), ("route", route), ("status", str(status)))
        return samples.get(("fraud_api_requests_total", labels), 0.0)

    assert [answered("/alerts/{tx_id}", status) for status in (200, 401, 422)] == [1, 1, 1]
    assert answered("/healthz", 200) == 1
    assert samples["fraud_api_request_duration_seconds_count", (("route", "/alerts/{tx_id}"),)] == 3
    assert not any("/alerts/2" in str(labels) for _, labels in samples)  # paths never become labels


def test_card_summary(api: TestClient) -> None:
    body = api.get(f"/cards/{CARD_A}").json()
    assert body["card_id"] == CARD_A
    assert body["features"]["values"] == {"card_nb_tx_1d": 2.0}
    assert body["features"]["tx_id"] == 2
    assert body["score"]["tx_id"] == 2 and body["score"]["alert"] is True
    assert [a["tx_id"] for a in body["alerts"]] == [2, 1]
    # A card with a score and alerts but no features.
    assert api.get(f"/cards/{CARD_B}").json()["features"] is None
    assert api.get(f"/cards/{UNKNOWN_CARD}").status_code == 404


def test_card_alerts(api: TestClient) -> None:
    assert [a["tx_id"] for a in api.get(f"/cards/{CARD_A}/alerts").json()] == [2, 1]
    assert [a["tx_id"] for a in api.get(f"/cards/{CARD_A}/alerts", params={"limit": 1}).json()] == [2]
    assert api.get(f"/cards/{UNKNOWN_CARD}/alerts").status_code == 404


def test_known_card_without_alerts_has_an_empty_list(store: tuple[Any, str], api: TestClient) -> None:
    client, prefix = store
    quiet = "c" * 32
    write_scores(client, [make_score(50, card_id=quiet, score=0.1, alert=False)], prefix, RETENTION_S)
    assert api.get(f"/cards/{quiet}/alerts").json() == []
    assert api.get(f"/cards/{quiet}").json()["score"]["alert"] is False


@pytest.mark.parametrize("card_id", ["abc", "A" * 32, "g" * 32, "a" * 33, "4111111111111111"])
def test_cards_reject_malformed_ids(api: TestClient, card_id: str) -> None:
    assert api.get(f"/cards/{card_id}").status_code == 422
    assert api.get(f"/cards/{card_id}/alerts").status_code == 422


def test_openapi_spec_describes_every_endpoint_with_response_models(api: TestClient) -> None:
    spec = api.get("/openapi.json").json()
    paths = spec["paths"]
    assert set(paths) == {
        "/healthz",
        "/alerts/recent",
        "/alerts/{tx_id}",
        "/cards/{card_id}",
        "/cards/{card_id}/alerts",
        "/live/status",
        "/live/alerts",
        "/live/scores",
    }
    for path in paths.values():
        ok = path["get"]["responses"]["200"]["content"]["application/json"]["schema"]
        assert "$ref" in ok or "items" in ok
    assert {
        "AlertRecord",
        "ScoreRecord",
        "CardSummary",
        "LiveStatus",
        "AlertsPerMinute",
        "ScoreDistribution",
    } <= set(spec["components"]["schemas"])


def test_page_is_served(api: TestClient) -> None:
    response = api.get("/")
    assert response.status_code == 200
    assert "text/html" in response.headers["content-type"]
    assert "/alerts/recent" in response.text and 'id="card-form"' in response.text


# --- Property-based: any path and query parameters -----------------------------------------------------

TOKEN = "fuzz-token"  # noqa: S105 - a test token
#: A path segment: ids that exist, ids of the right shape that do not, and anything else.
SEGMENT = st.one_of(
    st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=60),
    st.integers(min_value=-(2**80), max_value=2**80).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from([CARD_A, CARD_B, UNKNOWN_CARD, CARD_A.upper(), "1", "2", "3", "999", str(2**63 - 1)]),
    st.sampled_from(["", ".", "..", "recent", "4111111111111111", "1e39", "-0", "%", "%00", "x" * 10_000]),
)
QUERY_VALUE = st.one_of(
    SEGMENT,
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([1, 20, 1000, 1001, 0, -1, "1e39", "nan", "inf", ""]),
)


@pytest.fixture
def token_api(store: tuple[Any, str]) -> TestClient:
    client, prefix = store
    return TestClient(create_app(client, prefix, token=TOKEN))


@settings(
    suppress_health_check=[HealthCheck.function_scoped_fixture]
)  # read-only requests: one store is fine
@given(
    template=st.sampled_from(["/alerts/{}", "/cards/{}", "/cards/{}/alerts", "/alerts/recent", "/{}"]),
    segment=SEGMENT,
    keep_slashes=st.booleans(),
    params=st.dictionaries(
        st.one_of(st.sampled_from(["limit", "after_ms"]), st.text(max_size=8)), QUERY_VALUE, max_size=3
    ),
    authorization=st.one_of(
        st.none(),
        st.just(f"Bearer {TOKEN}"),
        st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40),
    ),
    guarded=st.booleans(),
)
def test_any_path_and_query_get_a_json_answer_never_a_server_error(
    api: TestClient,
    token_api: TestClient,
    template: str,
    segment: str,
    keep_slashes: bool,
    params: dict[str, object],
    authorization: str | None,
    guarded: bool,
) -> None:
    path = template.format(quote(segment, safe="/" if keep_slashes else ""))
    headers = {} if authorization is None else {"Authorization": authorization}
    response = (token_api if guarded else api).get(path, params=params, headers=headers)
    assert 200 <= response.status_code < 500, (path, params, response.status_code, response.text[:300])
    assert "Traceback" not in response.text
    if response.request.url.path != "/":  # the page (also /x/.. ) is HTML; every other answer is JSON
        assert response.headers["content-type"].startswith("application/json"), (path, response.headers)
        response.json()
