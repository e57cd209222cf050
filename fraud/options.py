"""Command-line options that several ``fraud`` commands share, declared once."""

from __future__ import annotations

import os
import re
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import TypeAdapter, ValidationError

from contracts.settings import LABEL_DELAY_DAYS_MAX, NAMESPACE_PATTERN, LabelDelayDays, Settings
from features.definitions import DEFAULT_PARAMS, FeatureParams
from models.registry import ALIASES
from models.splits import KNOWN_FRAUDS, RECENT_FRAUD_DAYS

#: Records per micro-batch unless a command says otherwise (admission control).
DEFAULT_MAX_RECORDS = 100_000


def _with_label_delay(ctx: typer.Context, days: float | None) -> float | None:
    """Typer callback of ``--label-delay-days``: the command's settings (the root context's, which every
    reader of the settings gets) take the delay given, checked as ``FRAUD_LABEL_DELAY_DAYS`` is."""
    if days is None:
        return None
    try:
        TypeAdapter(LabelDelayDays).validate_python(days)
    except ValidationError:
        raise typer.BadParameter(
            f"{days:g}: the label delay is more than 0 and at most {LABEL_DELAY_DAYS_MAX:g} days"
        ) from None
    root = ctx.find_root()
    if isinstance(root.obj, Settings):
        root.obj = root.obj.model_copy(update={"label_delay_days": days})
    return days


LabelDelayOption = Annotated[
    float | None,
    typer.Option(
        "--label-delay-days",
        callback=_with_label_delay,
        help="Days until a fraud label is known: labels are stamped this long after their transaction and "
        "the terminal windows end this long before each transaction (default: FRAUD_LABEL_DELAY_DAYS).",
    ),
]
WindowsOption = Annotated[
    str,
    typer.Option(
        "--windows",
        help="The card and terminal windows in days, increasing: each gives the card's count and mean amount "
        "and the terminal's count and risk. The longest bounds the state a job keeps.",
    ),
]
MaxRecordsOption = Annotated[
    int | None, typer.Option(min=1, help="Admission control: at most this many records per micro-batch.")
]
TriggerIntervalOption = Annotated[float, typer.Option(min=0.0, help="Seconds between micro-batches.")]
AllowedLatenessOption = Annotated[
    float,
    typer.Option(
        min=0.0,
        help="Event-time disorder within a partition that still counts as on time; "
        "results wait this long in event time.",
    ),
]
OnceOption = Annotated[bool, typer.Option("--once", help="Process everything available now, then stop.")]
AliasOption = Annotated[str, typer.Option(help=f"Model alias to serve: {', '.join(ALIASES)}.")]
ModelCheckOption = Annotated[
    float | None,
    typer.Option(
        min=1.0,
        help="Seconds between checks of where the alias points (default: FRAUD_MODEL_CHECK_INTERVAL_S).",
    ),
]
MetricsUrlsOption = Annotated[
    list[str] | None,
    typer.Option(
        "--metrics",
        help="Also show the job serving metrics at this URL (a job on another machine or in another "
        "container, e.g. http://pipeline:9400/metrics); repeatable.",
    ),
]
PrefixOption = Annotated[
    str, typer.Option(help="Redis key prefix (empty for the live pipeline; an isolated run's own prefix).")
]


def checkpoint_dir(settings: Settings, given: Path | None, job: str, namespace: str = "") -> Path:
    """A job's checkpoint directory: the one given, else ``FRAUD_HOME/checkpoints/[<namespace>/]<job>``."""
    return (given or settings.home / "checkpoints" / namespace / job).resolve()


def checkpoint_option(job: str = "<job>") -> Any:
    """``--checkpoint`` of a command that runs or reads ``job``: the directory :func:`checkpoint_dir` takes."""
    return typer.Option(
        help=f"The job's checkpoint directory (default: FRAUD_HOME/checkpoints/[<namespace>/]{job})."
    )


#: ``--checkpoint`` of a command that reads the checkpoint of the job it is told.
CheckpointOption = Annotated[Path | None, checkpoint_option()]


_RELATIVE = re.compile(r"^-(\d+(?:\.\d+)?)([smhdw])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_time(text: str, now: datetime | None = None) -> int:
    """UTC milliseconds of an ISO time (UTC when it has no zone) or of a time relative to now (``-1h``).

    Relative units: s, m, h, d, w.
    """
    now = now or datetime.now(UTC)
    match = _RELATIVE.match(text.strip())
    if match:
        moment = now - timedelta(**{_UNITS[match.group(2)]: float(match.group(1))})
    else:
        try:
            moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
        except ValueError:
            raise typer.BadParameter(
                f"{text!r} is neither an ISO time (2018-04-01T12:00) nor relative (-30s, -15m, -1h, -2d, -1w)"
            ) from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def check_namespace(value: str) -> str:
    """Typer callback: a namespace becomes part of topic names, Redis keys and a directory."""
    if value and not re.match(NAMESPACE_PATTERN, value):
        raise typer.BadParameter("a namespace is 1 to 40 lower-case letters, digits and dashes")
    return value


def check_output_file(path: Path | None) -> Path | None:
    """Typer callback of an option naming a file to write: it can be written, checked before the work that
    fills it (a long simulation must not end in a missing directory)."""
    if path is None:
        return None
    if path.is_dir():
        raise typer.BadParameter(f"{path} is a directory: give a file name")
    folder = path.parent
    if not folder.is_dir():
        raise typer.BadParameter(f"{folder} is not a directory: create it first, or give another path")
    if not os.access(folder, os.W_OK):
        raise typer.BadParameter(f"{folder} is not writable: give another path")
    return path


def time_range(from_time: str | None, to_time: str | None) -> tuple[int | None, int | None]:
    """``--from`` and ``--to`` in UTC milliseconds (either may be missing); ``--from`` before ``--to``."""
    start = parse_time(from_time) if from_time else None
    end = parse_time(to_time) if to_time else None
    if start is not None and end is not None and end <= start:
        raise typer.BadParameter(f"--to ({to_time}) must come after --from ({from_time})")
    return start, end


#: ``--windows``' default: the feature definitions' windows.
DEFAULT_WINDOWS = ",".join(map(str, DEFAULT_PARAMS.window_days))


def feature_params(
    settings: Settings, allowed_lateness_s: float = 0.0, windows: str = DEFAULT_WINDOWS
) -> FeatureParams:
    """The feature parameters of the settings (the label delay, ``FRAUD_LABEL_DELAY_DAYS`` or
    ``--label-delay-days``) and the options: the allowed lateness, the windows (``--windows``: days,
    comma-separated)."""
    try:
        days = tuple(int(day) for day in windows.split(","))
    except ValueError:
        raise typer.BadParameter(
            f"{windows!r}: give whole days, comma-separated (1,7,30)", param_hint="--windows"
        ) from None
    try:
        return FeatureParams(
            window_days=days,
            label_delay_ms=settings.label_delay_ms,
            allowed_lateness_ms=round(allowed_lateness_s * 1000),
        )
    except ValidationError as exc:
        reasons = "; ".join(error["msg"].removeprefix("Value error, ") for error in exc.errors())
        raise typer.BadParameter(f"{windows!r}: {reasons}", param_hint="--windows") from None


#: What every job in a namespace keeps apart from the live pipeline's, besides its topics.
_NAMESPACE_KEEPS = (
    "Redis keys under <namespace>: and its checkpoint under FRAUD_HOME/checkpoints/<namespace>/"
)


def _namespace(help_text: str) -> Any:
    return typer.Option(
        "--namespace", callback=check_namespace, help=f"{help_text} Default: the live pipeline."
    )


FeaturesNamespaceOption = Annotated[
    str,
    _namespace(
        "Run in this namespace (a replay, a second version): features to <namespace>.features, dead letters "
        f"to <namespace>.dead-letter, {_NAMESPACE_KEEPS}; it reads the live transactions and labels."
    ),
]
ScoringNamespaceOption = Annotated[
    str,
    _namespace(
        "Run in this namespace: score <namespace>.features (what a feature job of the namespace writes) into "
        f"<namespace>.scores and <namespace>.alerts, {_NAMESPACE_KEEPS}."
    ),
]
PipelineNamespaceOption = Annotated[
    str,
    _namespace(
        "Run in this namespace (a replay, a second version): scores and alerts to <namespace>.scores and "
        f"<namespace>.alerts, {_NAMESPACE_KEEPS}; it reads the live transactions and labels."
    ),
]
StateNamespaceOption = Annotated[
    str,
    _namespace(
        "Read the state of the job run in this namespace: its checkpoint under FRAUD_HOME/checkpoints/<namespace>/."
    ),
]
ShadowOption = Annotated[
    str | None,
    typer.Option(help="Also score with this alias (e.g. challenger), to the shadow scores topic; no alerts."),
]
FromOption = Annotated[
    str | None,
    typer.Option(
        "--from",
        help="Start at the records of this event time: ISO (UTC if no zone) or relative to now (-30m, -2d).",
    ),
]
ToOption = Annotated[
    str | None,
    typer.Option("--to", help="Stop before the records of this event time (then the run ends: a replay)."),
]
FromSavepointOption = Annotated[
    Path | None,
    typer.Option(
        help="Start from this savepoint (`fraud savepoint create`): its state, offsets and frontier are "
        "copied into the job's checkpoint, which must be new (or a start from the same savepoint).",
    ),
]


def check_start(from_time: str | None, from_savepoint: Path | None) -> None:
    """``--from`` and ``--from-savepoint`` both say where a job starts: one at most."""
    if from_time is not None and from_savepoint is not None:
        raise typer.BadParameter("--from and --from-savepoint both say where to start: give one")


def _check_known_frauds(value: str) -> str:
    if value not in KNOWN_FRAUDS:
        raise typer.BadParameter(f"one of {', '.join(KNOWN_FRAUDS)}, not {value!r}")
    return value


KnownFraudsOption = Annotated[
    str,
    typer.Option(
        callback=_check_known_frauds,
        help="Which cards each test day leaves out, as already known compromised: 'recent' (a fraud on a "
        f"transaction of the {RECENT_FRAUD_DAYS} days before the test period or since, known before the day: "
        "the handbook's protocol) or 'all' (any fraud of the history known before the day).",
    ),
]


class FeatureSource(StrEnum):
    """Where a replay's features come from: the features topic, recomputed from the transactions and
    labels topics (the batch path of the same definitions), or the topic unless it lacks what a model
    needs."""

    AUTO = "auto"
    TOPIC = "topic"
    RECOMPUTE = "recompute"
