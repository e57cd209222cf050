"""The alert lookup API and the live page (``fraud serve``), read-only over the Redis store.

JSON endpoints serve the lookups of ``infra.redis_store`` (OpenAPI spec at ``/openapi.json``, docs at
``/docs``); ``GET /`` serves a static page that polls ``/alerts/recent`` every second and looks cards up,
with a status strip and charts fed by the routes of ``scoring.live``.
The API only reads Redis, so it sees what the scoring job has written: idempotent upserts keyed by tx id,
so a re-run of a micro-batch never shows an alert twice. Given a reader of the jobs' state
(:class:`JobStates`), it also serves what the feature job holds for a card or a terminal (``/state/...``):
read from the job's checkpoint, seconds rather than milliseconds.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Annotated, Any, Literal, Protocol, get_args

from fastapi import Depends, FastAPI, HTTPException, Path, Query
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, Field
from redis import RedisError
from starlette.requests import Request
from starlette.routing import BaseRoute

from contracts.errors import ConfigError, FraudError, NotFoundError
from contracts.events import CARD_TOKEN_PATTERN
from contracts.records import AlertRecord, ScoreRecord
from contracts.settings import NAMESPACE_PATTERN, check_bearer_token
from infra.metrics import ApiMetrics
from infra.redis_store import card_alerts, card_known, card_summary, get_alert, recent_alerts
from scoring.live import JobsView, add_live_routes

TxIdParam = Annotated[int, Path(ge=0, lt=2**63, description="Transaction id (non-negative int64).")]
CardIdParam = Annotated[str, Path(pattern=CARD_TOKEN_PATTERN, description="Card token (32 hex digits).")]
Limit = Annotated[int, Query(ge=1, le=1000, description="At most this many alerts, newest first.")]


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


#: The jobs that keep state: the feature job, and the pipeline (features and scoring in one query).
StateJobName = Literal["features", "pipeline"]
STATE_JOBS: tuple[str, ...] = get_args(StateJobName)
JobParam = Annotated[StateJobName, Query(description="Whose state: the feature job's or the pipeline's.")]
NamespaceParam = Annotated[
    str,
    Query(
        pattern=f"^$|{NAMESPACE_PATTERN}",
        description="The job's namespace, as its run was given it (empty: the live one).",
    ),
]


class StateAt(BaseModel):
    """Where a job's state was read and what it reflects."""

    checkpoint: str
    batch_id: int = Field(description="The last committed micro-batch: the state as it left it.")
    frontier_ms: int | None = Field(description="Its event-time frontier (UTC ms; null before any record).")
    final: bool = Field(description="It was the last micro-batch of an --once run (it released everything).")


class CardWindow(BaseModel):
    window: str
    window_ms: int
    feature: str = Field(description="The count feature of the window (card_nb_tx_7d).")
    nb_tx: int
    amount_sum: float
    avg_amount: float | None


class CardStateView(StateAt):
    """What the feature job holds for a card (``fraud state card --json``)."""

    card_id: str
    card_bucket: int
    card_buckets: int | None
    bucket_frontier_ms: int | None
    windows_end_ms: int | None
    windows: list[CardWindow] = Field(description="The card's transactions in (end - window, end].")
    events: list[dict[str, Any]] = Field(
        description="Released transactions and waiting events, oldest first."
    )


class TerminalWindow(BaseModel):
    window: str
    window_ms: int
    nb_tx: int
    risk: float


class TerminalStateView(StateAt):
    """What the feature job holds for a terminal (``fraud state terminal --json``)."""

    terminal_id: str
    terminal_bucket: int
    terminal_buckets: int | None
    transaction_times_ms: list[int]
    labels: list[dict[str, Any]] = Field(description="The first known label of each transaction kept.")
    windows: list[TerminalWindow] = Field(
        description="The terminal features of a transaction at the frontier."
    )


class JobStates(Protocol):
    """What a stateful job holds, as JSON (``fraud.state.StateService``): raises ``NotFoundError`` for
    what is not there, another ``FraudError`` for a state it cannot read."""

    def card(self, job: str, namespace: str, card_id: str) -> dict[str, Any]: ...

    def terminal(self, job: str, namespace: str, terminal_id: str) -> dict[str, Any]: ...


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
    from the jobs' checkpoints (:func:`add_state_routes`). The live page's figures (``scoring.live``) show
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
    page = resources.files("scoring").joinpath("static/index.html").read_text()

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

    @app.get(
        "/alerts/{tx_id}",
        dependencies=guarded,
        response_model=AlertRecord,
        tags=["alerts"],
        responses={404: {"description": "No alert for this transaction"}},
    )
    def alert(tx_id: TxIdParam) -> AlertRecord:
        """The alert of one transaction."""
        found = get_alert(redis, tx_id, prefix)
        if found is None:
            raise HTTPException(404, f"no alert for transaction {tx_id}")
        return found

    @app.get(
        "/cards/{card_id}",
        dependencies=guarded,
        response_model=CardSummary,
        tags=["cards"],
        responses={404: {"description": "Nothing stored for this card"}},
    )
    def card(card_id: CardIdParam, limit: Limit = 20) -> CardSummary:
        """A card's latest features, latest score and newest alerts."""
        summary = card_summary(redis, card_id, prefix, limit)
        if summary["features"] is None and summary["score"] is None and not summary["alerts"]:
            raise HTTPException(404, f"nothing stored for card {card_id}")
        return CardSummary.model_validate(summary)

    @app.get(
        "/cards/{card_id}/alerts",
        dependencies=guarded,
        response_model=list[AlertRecord],
        tags=["cards"],
        responses={404: {"description": "Nothing stored for this card"}},
    )
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


def add_state_routes(app: FastAPI, states: JobStates, guarded: list[Any]) -> None:
    """``/state/cards/{card_id}`` and ``/state/terminals/{terminal_id}``: what ``states`` reads."""

    def job_state(read: Callable[[JobStates], dict[str, Any]]) -> dict[str, Any]:
        try:
            return read(states)
        except ConfigError as exc:  # a job or namespace the query's own checks let through
            raise HTTPException(422, str(exc)) from None
        except NotFoundError as exc:
            raise HTTPException(404, str(exc)) from None
        except FraudError as exc:
            raise HTTPException(409, str(exc)) from None

    @app.get(
        "/state/cards/{card_id}",
        dependencies=guarded,
        response_model=CardStateView,
        tags=["state"],
        responses={404: {"description": "No checkpoint, nothing committed, or nothing held for the card"}},
    )
    def card_state(card_id: CardIdParam, job: JobParam = "features", namespace: NamespaceParam = "") -> Any:
        """What the feature job holds for a card at its last committed micro-batch: its transactions and
        waiting events, the card windows at the frontier (as `fraud state card --json`; seconds: each read
        is a Spark job over the checkpoint)."""
        return job_state(lambda read: read.card(job, namespace, card_id))

    @app.get(
        "/state/terminals/{terminal_id}",
        dependencies=guarded,
        response_model=TerminalStateView,
        tags=["state"],
        responses={404: {"description": "No checkpoint, nothing committed, or nothing held for it"}},
    )
    def terminal_state(
        terminal_id: Annotated[str, Path(min_length=1, max_length=64, description="Terminal id.")],
        job: JobParam = "features",
        namespace: NamespaceParam = "",
    ) -> Any:
        """What the feature job holds for a terminal: its transaction times, its labels, and the terminal
        features at the frontier (as `fraud state terminal --json`)."""
        return job_state(lambda read: read.terminal(job, namespace, terminal_id))
