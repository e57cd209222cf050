"""The alert lookup API and the live page (``fraud serve``), read-only over the Redis store.

JSON endpoints serve the lookups of ``infra.redis.store`` (OpenAPI spec at ``/openapi.json``, docs at
``/docs``); ``GET /`` serves a static page that polls ``/alerts/recent`` every second and looks cards up,
with a status strip and charts fed by the routes of ``api.live``.
The API only reads Redis, so it sees what the scoring job has written: idempotent upserts keyed by tx id,
so a re-run of a micro-batch never shows an alert twice. Given a reader of the jobs' state
(``api.state.JobStates``), it also serves what the feature job holds for a card or a terminal
(``/state/...``): read from the job's checkpoint, seconds rather than milliseconds.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Awaitable, Callable
from functools import partial
from importlib import resources
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Query
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, Field
from redis import RedisError
from starlette.requests import Request
from starlette.routing import BaseRoute

from api.live import JobsView, add_live_routes
from api.params import CardIdParam, Limit, TxIdParam, lookup_route
from api.state import JobStates, add_state_routes
from contracts.errors import ConfigError
from contracts.records import AlertRecord, ScoreRecord
from contracts.settings import check_bearer_token
from infra.metrics.api import ApiMetrics
from infra.redis.reads import card_alerts, card_known, card_summary, get_alert, recent_alerts


class CardFeatures(BaseModel):
    """The card's latest feature values, as the feature job stored them."""

    tx_id: int
    event_time_ms: int
    terminal_id: str
    amount: float | None
    late: bool
    values: dict[str, float | None]


class CardSummary(BaseModel):
    """What is known about a card: latest features, latest score, newest alerts."""

    card_id: str
    features: CardFeatures | None = Field(description="Latest features (null if none are stored).")
    score: ScoreRecord | None = Field(description="Latest score (null if none is stored).")
    alerts: list[AlertRecord] = Field(description="Newest alerts first.")


class Health(BaseModel):
    status: str
    redis: bool


#: What answers without the token: liveness, the page (it holds no data) and the API's description.
OPEN_PATHS = frozenset({"/healthz", "/", "/docs", "/docs/oauth2-redirect", "/openapi.json", "/redoc"})


def create_app(
    redis: Any,
    prefix: str = "",
    token: str | None = None,
    states: JobStates | None = None,
    jobs: JobsView | None = None,
) -> FastAPI:
    """The API and page over the Redis store behind this redis-py client.

    ``prefix`` selects the key space (empty for the live pipeline; an A/B run's own prefix). With a
    ``token``, every data endpoint and ``/metrics`` require ``Authorization: Bearer <token>`` (401
    otherwise); what holds no data stays open (:data:`OPEN_PATHS`): ``/healthz``, the page (it sends the
    token it is given in its URL fragment, ``/#token=...``) and the API's description (``/docs``,
    ``/openapi.json``). With ``states``, ``/state/cards/{card_id}`` and ``/state/terminals/{id}`` answer
    from the jobs' checkpoints (:func:`add_state_routes`). The live page's figures (``api.live``) show
    ``jobs``, when given.

    Raises:
        ConfigError: ``token`` is empty or blank, or holds what a header cannot carry
            (``contracts.settings.check_bearer_token``): None, not an empty token, means no token.
    """
    if token is not None:
        try:
            check_bearer_token(token)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    bearer = HTTPBearer(auto_error=False, description="FRAUD_API_TOKEN, when the server has one.")

    # The default-value form: the dependency is a local name, which string annotations cannot reach.
    def authorised(credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:  # noqa: B008
        if token is None:
            return
        if credentials is None or not secrets.compare_digest(
            credentials.credentials.encode(), token.encode()
        ):
            raise HTTPException(401, "a valid bearer token is required", {"WWW-Authenticate": "Bearer"})

    guarded = [Depends(authorised)]

    app = FastAPI(
        title="kappa-fraud alerts",
        description="Alerts, scores and latest features of cards, from the Redis lookup store.",
        version="1",
    )
    lookup = partial(lookup_route, app, guarded)
    page = resources.files("api").joinpath("static/index.html").read_text()

    @app.exception_handler(RedisError)
    async def redis_unavailable(request: Request, exc: RedisError) -> JSONResponse:
        """Redis away: 503 for the client to retry, not a 500 (what it said stays in the server)."""
        return JSONResponse({"detail": "redis unreachable"}, status_code=503)

    metrics = ApiMetrics()

    @app.middleware("http")
    async def measured(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        """Every answer counted by its route's template (``/alerts/{tx_id}``), never by the path itself."""
        started = time.perf_counter()
        response = await call_next(request)
        route = request.scope.get("route")
        template = route.path if isinstance(route, BaseRoute) and hasattr(route, "path") else "(unmatched)"
        metrics.observe(template, request.method, response.status_code, time.perf_counter() - started)
        return response

    @app.get("/metrics", include_in_schema=False, dependencies=guarded)
    def prometheus_metrics() -> Response:
        """The API's Prometheus metrics: counts and durations by route, behind the token (they tell who
        looks at what, and how often)."""
        body, content_type = metrics.exposition()
        return Response(body, media_type=content_type)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def index() -> str:
        return page

    @app.get("/healthz", response_model=Health, tags=["meta"])
    def healthz() -> Health:
        """Liveness and Redis reachability (503 when Redis does not answer)."""
        try:
            redis.ping()
        except Exception:  # any connection error means unhealthy; what it says stays in the server
            raise HTTPException(503, "redis unreachable") from None
        return Health(status="ok", redis=True)

    @app.get("/alerts/recent", response_model=list[AlertRecord], tags=["alerts"], dependencies=guarded)
    def alerts_recent(
        limit: Limit = 50,
        after_ms: Annotated[
            int | None, Query(ge=0, description="Only alerts with a later event time (UTC ms).")
        ] = None,
    ) -> list[AlertRecord]:
        """The newest alerts of all cards, newest (by event time) first."""
        return recent_alerts(redis, prefix, limit, after_ms)

    @lookup("/alerts/{tx_id}", AlertRecord, tag="alerts", missing="No alert for this transaction")
    def alert(tx_id: TxIdParam) -> AlertRecord:
        """The alert of one transaction."""
        found = get_alert(redis, tx_id, prefix)
        if found is None:
            raise HTTPException(404, f"no alert for transaction {tx_id}")
        return found

    @lookup("/cards/{card_id}", CardSummary, tag="cards", missing="Nothing stored for this card")
    def card(card_id: CardIdParam, limit: Limit = 20) -> CardSummary:
        """A card's latest features, latest score and newest alerts."""
        summary = card_summary(redis, card_id, prefix, limit)
        if summary["features"] is None and summary["score"] is None and not summary["alerts"]:
            raise HTTPException(404, f"nothing stored for card {card_id}")
        return CardSummary.model_validate(summary)

    @lookup("/cards/{card_id}/alerts", list[AlertRecord], tag="cards", missing="Nothing stored for this card")
    def alerts_of_card(card_id: CardIdParam, limit: Limit = 100) -> list[AlertRecord]:
        """A card's alerts, newest first (an empty list for a known card without alerts)."""
        found = card_alerts(redis, card_id, prefix, limit)
        if not found and not card_known(redis, card_id, prefix):
            raise HTTPException(404, f"nothing stored for card {card_id}")
        return found

    add_live_routes(app, redis, prefix, guarded, jobs)
    if states is not None:
        add_state_routes(app, states, guarded)
    return app
