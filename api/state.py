"""The API's state routes: what a stateful job holds for a card or a terminal, read from its checkpoint
(``/state/...``; seconds rather than milliseconds)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Annotated, Any, Literal, Protocol, get_args

from fastapi import FastAPI, HTTPException, Path, Query
from pydantic import BaseModel, Field

from api.params import CardIdParam, lookup_route
from contracts.errors import ConfigError, FraudError, NotFoundError
from contracts.settings import NAMESPACE_PATTERN

#: The jobs that keep state: the feature job, and the pipeline (features and scoring in one query).
StateJobName = Literal["features", "pipeline"]
STATE_JOBS: tuple[str, ...] = get_args(StateJobName)
#: Why a state route answers 404, before what it was asked for.
NOTHING_HELD = "No checkpoint, nothing committed, or nothing held for"
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


def add_state_routes(app: FastAPI, states: JobStates, guarded: list[Any]) -> None:
    """``/state/cards/{card_id}`` and ``/state/terminals/{terminal_id}``: what ``states`` reads."""
    lookup = partial(lookup_route, app, guarded, tag="state")

    def job_state(read: Callable[[JobStates], dict[str, Any]]) -> dict[str, Any]:
        try:
            return read(states)
        except ConfigError as exc:  # a job or namespace the query's own checks let through
            raise HTTPException(422, str(exc)) from None
        except NotFoundError as exc:
            raise HTTPException(404, str(exc)) from None
        except FraudError as exc:
            raise HTTPException(409, str(exc)) from None

    @lookup("/state/cards/{card_id}", CardStateView, missing=f"{NOTHING_HELD} the card")
    def card_state(card_id: CardIdParam, job: JobParam = "features", namespace: NamespaceParam = "") -> Any:
        """What the feature job holds for a card at its last committed micro-batch: its transactions and
        waiting events, the card windows at the frontier (as `fraud state card --json`; seconds: each read
        is a Spark job over the checkpoint)."""
        return job_state(lambda read: read.card(job, namespace, card_id))

    @lookup("/state/terminals/{terminal_id}", TerminalStateView, missing=f"{NOTHING_HELD} it")
    def terminal_state(
        terminal_id: Annotated[str, Path(min_length=1, max_length=64, description="Terminal id.")],
        job: JobParam = "features",
        namespace: NamespaceParam = "",
    ) -> Any:
        """What the feature job holds for a terminal: its transaction times, its labels, and the terminal
        features at the frontier (as `fraud state terminal --json`)."""
        return job_state(lambda read: read.terminal(job, namespace, terminal_id))
