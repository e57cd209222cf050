"""``fraud demo``: the main job end to end on the embedded stack (or your own services, if configured).

The pipeline: simulate transactions, ingest them and their delayed labels into Kafka, ingest a file of
deliberately broken events to show the dead-letter topic, run the streaming feature job over everything
(features to Kafka, latest features per card to Redis), train the first model by replaying the
transactions and labels topics (honest split, metrics, registered in MLflow: the first version of an empty
registry becomes the champion), score every transaction with the champion (scores and alerts to Kafka,
alerts to Redis), then print topic counts, the dead-letter summary, the alerts and their precision against
the labels, and one card from Redis. The embedded stack is started for the run (its data in a directory of
its own, removed with it) and stopped after it; a stack already running (``fraud up``) or your own services
are used and left running.

Wherever it runs, the demo is isolated in a namespace of its own, ``demo-<run>``: its topics
(``demo-<run>.transactions``, ...), Redis keys (``demo-<run>:...``), checkpoints and observer groups, and a
model registry of its own (a SQLite MLflow store under ``FRAUD_HOME/demos/demo-<run>``), so it never
writes into live outputs nor scores with a live model. It ends with the commands that show its results.

``--follow`` then keeps the pipeline live until Ctrl-C: both jobs run continuously, a week more of
simulated transactions streams in at a steady rate, and the live alerts page is served. Ctrl-C stops the
stream, lets the feature job and then the scoring job finish what has arrived (no micro-batch is cut off),
and stops them, the page and the stack; a second Ctrl-C stops the jobs at once.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import signal
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import pandas as pd
import typer
from rich.table import Table

from api.app import create_app
from contracts.events import TxColumns
from contracts.records import AlertRecord
from contracts.redis_keys import card_features_key
from contracts.settings import Settings, redis_prefix
from fraud.commands.ingest import print_simulation, produce_batch, table_batch
from fraud.console import console, counts_table, dead_letter_table, settings_of
from fraud.live import QueryJobs
from fraud.options import DEFAULT_MAX_RECORDS, feature_params
from fraud.progress import JobFailedError
from infra.clients import Clients
from infra.embedded.stack import EmbeddedStack
from infra.kafka.admin import create_project_topics
from infra.kafka.log import read_topic, topic_counts
from ingest.deadletter import summarise_topic
from ingest.files import clean_table
from ingest.produce import events_from_jsonl, produce_events
from ingest.simulator import SimulatorConfig, simulate
from ingest.tokens import card_token
from models.estimators import DEFAULT_SPEC
from models.metrics import DEFAULT_ALERTS_PER_DAY
from models.splits import DEFAULT_KNOWN_FRAUDS, EvalProtocol

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from features.job import FeatureJobConfig
    from scoring.job import ScoringJobConfig

#: Broken events of every kind the validation rejects, next to a few good ones.
BAD_EVENTS_FILE = Path(__file__).resolve().parent / "data" / "bad_events.jsonl"


@contextlib.contextmanager
def stack_for_run(settings: Settings) -> Iterator[bool]:
    """Use the configured services or the running embedded stack; else start one for this block only, its
    data (topics, Redis keys) in a directory of its own in ``FRAUD_HOME`` that is removed with it.

    Yields whether the stack was started here (and so holds nothing but this run's data).
    """
    if settings.bootstrap_servers is not None:
        yield False
        return
    running = EmbeddedStack(settings.home)
    if running.running() is not None:
        console.print(f"Using the embedded stack already running under {running.home}.")
        yield False
        return
    settings.home.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="demo-stack-", dir=settings.home) as data:
        stack = EmbeddedStack(settings.home, data=Path(data))
        with console.status("Starting the embedded stack (Kafka broker, Redis, MLflow store)...") as status:
            stack.start(progress=status.update)
        try:
            yield True
        finally:
            stack.stop()
            console.print("Embedded stack stopped.")


def demo_command(
    ctx: typer.Context,
    customers: Annotated[int, typer.Option(min=1, help="Simulated customers (cards).")] = 5000,
    terminals: Annotated[int, typer.Option(min=1, help="Simulated terminals.")] = 10000,
    days: Annotated[int, typer.Option(min=1, help="Simulated days from 2018-04-01.")] = 61,
    seed: Annotated[int, typer.Option(min=0, help="Simulator seed.")] = 0,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow",
            help="Then keep the pipeline live: stream a week more of transactions, serve the alerts page; "
            "Ctrl-C stops everything.",
        ),
    ] = False,
    rate: Annotated[
        float, typer.Option(min=1.0, help="With --follow: transactions per second streamed in.")
    ] = 200.0,
) -> None:
    """Run the pipeline end to end on the embedded stack: simulate, ingest, features, train, score, alerts."""
    from fraud import jobs  # heavy: PySpark and the jobs
    from infra.spark.session import ONCE, stop_session

    settings = settings_of(ctx)
    extra_days = FOLLOW_DAYS if follow else 0
    config = SimulatorConfig(
        customers=customers,
        terminals=terminals,
        days=days + extra_days,
        start=dt.date(2018, 4, 1),
        seed=seed,
    )
    with stack_for_run(settings) as started_here:
        namespace = f"demo-{uuid.uuid4().hex[:6]}"
        settings = isolated(settings, namespace)
        console.print(
            f"This demo runs in namespace [bold]{namespace}[/bold]: topics {namespace}.*, Redis keys "
            f"{redis_prefix(namespace)}*, a model registry of its own ({settings.mlflow_tracking_uri})."
        )
        clients = Clients.from_settings(settings)
        create_project_topics(clients.admin(), settings)

        console.rule("1. Simulate")
        with console.status("Simulating..."):
            simulated = simulate(config)
        cut = pd.Timestamp(config.start, tz="UTC") + pd.Timedelta(days=days)
        later = simulated[TxColumns.EVENT_TIME] >= cut
        frame, live = simulated[~later], simulated[later]
        print_simulation(frame, config.model_copy(update={"days": days}))

        console.rule("2. Ingest transactions and delayed labels")
        source = f"simulator:seed={seed}"
        produce_batch(settings, table_batch(settings, clean_table(frame, source), source), speedup=None)

        console.rule(f"3. Ingest {BAD_EVENTS_FILE.name}: broken events go to the dead-letter topic")
        produce_batch(settings, events_from_jsonl(BAD_EVENTS_FILE, settings.max_event_bytes), speedup=None)

        console.rule("4. Streaming feature job (Spark): per-card and per-terminal features")
        with console.status("Starting Spark..."):  # one session for every job of the demo
            spark = jobs.job_spark_session(settings, "fraud-demo")
        try:
            checkpoints = (settings.home / "checkpoints" / namespace).resolve()
            features, scoring = demo_jobs(settings, clients, checkpoints, namespace, DEFAULT_MAX_RECORDS)
            jobs.run_job(settings, clients, features, ONCE, namespace=namespace, spark=spark)

            console.rule("5. Train a model: replay the topics, honest split, MLflow registry")
            train_demo_model(settings)

            console.rule(
                "6. Scoring job (Spark): the champion scores every transaction; alerts to Kafka and Redis"
            )
            jobs.run_job(settings, clients, scoring, ONCE, namespace=namespace, spark=spark)

            console.rule("Summary")
            console.print(counts_table("Topics", topic_counts(clients, settings.topics.all())))
            console.print(dead_letter_table(summarise_topic(clients, settings.topics.dead_letter)))
            console.print(alerts_table(clients, settings, frame))
            card = show_card(clients, frame, settings, namespace)
            if follow:
                follow_live(settings, live, checkpoints, rate, namespace, spark)
            else:
                where_to_look(settings, namespace, card, first_alert(clients, settings), started_here)
        finally:
            stop_session(spark)


#: Days of simulated transactions ``--follow`` streams in after the batch part of the demo.
FOLLOW_DAYS = 7
#: Records per micro-batch of the live jobs (``--follow``).
LIVE_MAX_RECORDS = 20_000


def demo_jobs(
    settings: Settings, clients: Clients, checkpoints: Path, namespace: str, max_records: int
) -> tuple[FeatureJobConfig, ScoringJobConfig]:
    """The demo's feature job and scoring job, in its namespace, checkpointed under ``checkpoints``."""
    from fraud import jobs  # heavy: PySpark and the jobs

    scope = jobs.Scope(namespace)
    features = jobs.feature_job_config(
        settings,
        clients,
        topics=settings.topics,
        checkpoint=checkpoints / "features",
        params=feature_params(settings),
        max_records=max_records,
        scope=scope,
    )
    scoring = jobs.scoring_job_config(
        settings,
        clients,
        topics=settings.topics,
        checkpoint=checkpoints / "scoring",
        max_records=max_records,
        scope=scope,
    )
    return features, scoring


def alerts_table(clients: Clients, settings: Settings, frame: pd.DataFrame) -> Table:
    """Alerts raised, and how many of them were frauds (the simulation's labels), by model version."""
    frauds = set(frame.loc[frame[TxColumns.IS_FRAUD] == 1, TxColumns.TX_ID].astype(int))
    alerted: dict[int, set[int]] = {}
    for message in read_topic(clients, settings.topics.alerts):
        alert = AlertRecord.model_validate_json(message.value() or b"")
        alerted.setdefault(alert.model_version, set()).add(alert.tx_id)
    table = Table(title="Alerts (precision against the simulation's fraud labels)", title_justify="left")
    for name in ("model version", "alerts", "frauds among them", "precision", "frauds caught"):
        table.add_column(name, justify="right")
    for version, tx_ids in sorted(alerted.items()):
        hits = len(tx_ids & frauds)
        table.add_row(
            str(version),
            f"{len(tx_ids):,}",
            f"{hits:,}",
            f"{hits / len(tx_ids):.1%}",
            f"{hits:,} of {len(frauds):,} ({hits / len(frauds) if frauds else 0:.1%})",
        )
    return table


def isolated(settings: Settings, namespace: str) -> Settings:
    """The settings of a demo in ``namespace``: every topic its own (``<namespace>.<topic>``, the names
    ``--namespace`` gives a command), and a SQLite MLflow store of its own under ``FRAUD_HOME/demos``."""
    store = (settings.home / "demos" / namespace / "mlflow").resolve()
    store.mkdir(parents=True, exist_ok=True)
    return settings.model_copy(
        update={
            "topics": settings.topics.with_prefix(f"{namespace}."),
            "mlflow_tracking_uri": f"sqlite:///{store / 'mlflow.db'}",
        }
    )


def first_alert(clients: Clients, settings: Settings) -> int | None:
    """The transaction id of the demo's first alert (to show a lookup with), if it raised any."""
    for message in read_topic(clients, settings.topics.alerts):
        return AlertRecord.model_validate_json(message.value() or b"").tx_id
    return None


def result_commands(settings: Settings, namespace: str, card: str, tx_id: int | None) -> list[str]:
    """The exact commands that show a demo's results: its alerts, one alert and card, its model, its page."""
    prefix = redis_prefix(namespace)
    return [
        f"fraud alerts tail --namespace {namespace}",
        *([f"fraud alerts get {tx_id} --prefix {prefix}"] if tx_id is not None else []),
        f"fraud card {card} --prefix {prefix}",
        f"FRAUD_MLFLOW_TRACKING_URI={settings.mlflow_tracking_uri} fraud models list",
        f"fraud serve --prefix {prefix}    # the live page at http://{settings.api_host}:{settings.api_port}/",
    ]


def where_to_look(
    settings: Settings, namespace: str, card: str, tx_id: int | None, started_here: bool
) -> None:
    """The commands that show the demo's results (with the stack still running), or how to keep one."""
    if started_here:
        console.print(
            "The embedded stack stops now, and this demo's topics and Redis keys with it. To explore a demo's "
            "results afterwards, start a stack first (`fraud up`) and run `fraud demo` on it; or run "
            "`fraud demo --follow`."
        )
        return
    console.print(
        f"This demo's results stay in namespace {namespace}; the live topics, Redis keys and registry are "
        "untouched. To explore them:"
    )
    for command in result_commands(settings, namespace, card, tx_id):
        console.print(f"  {command}", highlight=False, soft_wrap=True)


def follow_live(
    settings: Settings,
    live: pd.DataFrame,
    checkpoints: Path,
    rate: float,
    namespace: str,
    spark: SparkSession,
) -> None:
    """Keep both jobs running in ``spark`` on new transactions streamed in at ``rate`` per second, serve the
    page, until Ctrl-C; then stop what was started here."""
    import uvicorn

    from fraud import jobs  # heavy: PySpark and the jobs
    from infra.spark.session import Trigger

    clients = Clients.from_settings(settings)
    source = "simulator:live"
    batch = table_batch(settings, clean_table(live, source), source)
    span_s = max(1.0, (live[TxColumns.EVENT_TIME].max() - live[TxColumns.EVENT_TIME].min()).total_seconds())
    speedup = rate * span_s / max(1, len(live))
    live_jobs = QueryJobs()  # the page's status strip: the two jobs below, as they start
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(
                clients.redis(), redis_prefix(namespace), token=settings.bearer_token(), jobs=live_jobs
            ),
            host=settings.api_host,
            port=settings.api_port,
            log_level="warning",
        )
    )
    threading.Thread(target=server.run, name="alerts-page", daemon=True).start()
    stop_producing = threading.Event()
    producer = threading.Thread(
        target=produce_events,
        args=(clients.producer(), settings.topics, batch, speedup),
        kwargs={"stop": stop_producing},
        name="live-transactions",
        daemon=True,
    )
    with console.status("Starting the live jobs..."):
        # PySpark's own Ctrl-C handler cancels every running Spark job at once, aborting micro-batches
        # mid-write; with Python's, Ctrl-C only interrupts this thread, which stops the jobs between batches.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        features, scoring = demo_jobs(settings, clients, checkpoints, namespace, LIVE_MAX_RECORDS)

        def starter(job: jobs.Job) -> Callable[[], StreamingQuery]:
            ready = jobs.prepare_run(settings, clients, job)

            def start() -> StreamingQuery:
                query = job.start(spark, ready, Trigger(interval_s=0.5))
                live_jobs.add(job.name, query)
                return query

            return start

        # The feature job and the scoring job side by side, in this order: the second reads the first's output.
        starts = [starter(features), starter(scoring)]
        queries = [start() for start in starts]
    producer.start()
    console.rule("Live")
    console.print(
        f"Streaming {len(live):,} more transactions at ~{rate:,.0f}/s. Live alerts page: "
        f"http://{settings.api_host}:{settings.api_port}/ (API docs at /docs). Ctrl-C stops everything."
    )
    try:
        restarts_left = LIVE_RESTARTS
        while True:
            time.sleep(10)
            restarts_left = restart_failed(queries, starts, restarts_left)
            if not all(query.isActive for query in queries):
                break
            alerts = topic_counts(clients, [settings.topics.alerts])[settings.topics.alerts]
            console.print(f"  {time.strftime('%H:%M:%S')}  alerts so far: {alerts:,}")
    except KeyboardInterrupt:
        console.print("Stopping... (Ctrl-C again to stop at once)")
    finally:
        # New transactions stop first; each job then processes what has arrived and stops, the feature job
        # before the scoring job that reads its output.
        stop_producing.set()
        producer.join(timeout=70)
        jobs.stop_live_jobs(queries)
        server.should_exit = True


#: How often ``--follow`` starts a live job again whose query stopped with an error (a Python worker that took
#: longer than Spark's fixed 10 s to start on a host loaded far past its cores, say): from its checkpoint, so
#: nothing is lost or repeated. Then the error ends the demo.
LIVE_RESTARTS = 3


def restart_failed(
    queries: list[StreamingQuery], starts: list[Callable[[], StreamingQuery]], restarts_left: int
) -> int:
    """Start each query of ``queries`` that stopped with an error again, in its place (``starts[i]`` starts
    the i-th), saying so in one line; the restarts left after. Raises ``JobFailedError`` with the error of
    a query that stopped when none are left."""
    for index, query in enumerate(queries):
        failure = None if query.isActive else query.exception()
        if failure is None:
            continue
        if restarts_left == 0:
            raise JobFailedError(failure)
        restarts_left -= 1
        console.print(
            f"  a live job stopped ({JobFailedError(failure)}); starting it again from its checkpoint"
        )
        queries[index] = starts[index]()
    return restarts_left


def train_demo_model(settings: Settings) -> None:
    """The default model (``models.estimators.DEFAULT_SPEC``) on every feature, trained on the latest
    period the replayed topics allow, its test week judged as `fraud train` and `fraud ab run` judge it."""
    from fraud import training  # heavy: scikit-learn and MLflow

    started = time.monotonic()
    params = feature_params(settings)
    tracking_uri, artifacts = training.tracking_target(settings)
    dataset, plans = training.topics_training_set(
        settings, params, training.Periods(gap_days=training.gap_days(settings))
    )
    protocol = EvalProtocol(DEFAULT_KNOWN_FRAUDS, settings.label_delay_ms)
    options = training.TrainOptions(DEFAULT_SPEC, "all", params, plans, DEFAULT_ALERTS_PER_DAY, protocol)
    result, logged = training.run_training(dataset, options, tracking_uri, artifacts, register=True)
    training.print_result(result, logged, tracking_uri)
    console.print(f"Replay, features, training and logging took {time.monotonic() - started:,.0f} s.")


def show_card(clients: Clients, frame: pd.DataFrame, settings: Settings, namespace: str) -> str:
    """The latest features in Redis of the card with the most simulated frauds; its token."""
    frauds = frame[frame[TxColumns.IS_FRAUD] == 1]
    busiest = (
        frauds[TxColumns.CARD_ID].value_counts().index[0] if len(frauds) else frame[TxColumns.CARD_ID].iloc[0]
    )
    token = card_token(str(busiest), settings.card_token_key())
    key = card_features_key(token, redis_prefix(namespace))
    values = {k.decode(): v.decode() for k, v in clients.redis().hgetall(key).items()}
    table = Table(title=f"Redis {key}", title_justify="left")
    table.add_column("field")
    table.add_column("value", justify="right")
    for name, value in values.items():
        table.add_row(name, value)
    console.print(table)
    return token
