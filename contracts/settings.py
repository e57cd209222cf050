"""Settings for every stage, read once from ``FRAUD_*`` environment variables.

Unset connection settings mean "use the embedded local stack" (``fraud up``); set ones point the project at
the user's own Kafka, Redis, MLflow or Spark cluster unchanged. Nothing here has side effects at import
time: the CLI entry point calls :func:`load_settings` and passes the result down.
"""

from __future__ import annotations

import difflib
import os
import re
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, get_args
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict
from pydantic_settings import SettingsError as SourceError

from contracts.errors import ConfigError
from contracts.events import DAY_MS, DEFAULT_MAX_CLOCK_SKEW_MS
from contracts.privacy import redact_url
from contracts.sections import (
    KafkaConnection,
    RedisConnection,
    SaslMechanism,
    SecurityProtocol,
    SparkSettings,
)

ENV_PREFIX = "FRAUD_"
NESTED_DELIMITER = "__"

DAY_S = 86_400
#: How long alerts, latest scores and latest features stay in Redis unless ``FRAUD_ALERT_RETENTION_S`` says.
DEFAULT_RETENTION_S = 30 * DAY_S
#: How often a scoring job re-reads where its model alias points, unless ``FRAUD_MODEL_CHECK_INTERVAL_S`` says.
DEFAULT_MODEL_CHECK_INTERVAL_S = 30.0
#: Buckets the feature job hashes cards (and terminals) into, unless ``FRAUD_CARD_BUCKETS`` (and
#: ``FRAUD_TERMINAL_BUCKETS``) say: the keys of its two stateful stages.
DEFAULT_BUCKETS = 6
#: Slots per bucket of each stateful stage (``features.entries``): the finest its state is cut into pages,
#: about 15 KB of history a slot at ten million cards.
DEFAULT_SLOTS = 2**16
#: The size past which a page of a bucket's state is cut in two: about what a request to the JVM's state
#: server costs in moving bytes (docs/architecture.md, state layout).
DEFAULT_PAGE_BYTES = 32 * 1024
#: Spark's ``spark.sql.shuffle.partitions`` of the jobs, unless ``FRAUD_SPARK_SHUFFLE_PARTITIONS`` says.
DEFAULT_SHUFFLE_PARTITIONS = 2
#: The JVM heap of a job's driver (in local mode, the whole job's JVM), unless ``FRAUD_SPARK_DRIVER_MEMORY``
#: says. The heap grows up to it as a job runs; the scaling bench's million cards run in it
#: (docs/benchmarks.md).
DEFAULT_DRIVER_MEMORY = "2g"
#: The JVM heap of each executor of a job on a Spark cluster, unless ``FRAUD_SPARK_EXECUTOR_MEMORY`` says
#: (local mode has no executors of its own: the driver's heap serves). A worker starts an executor only
#: if it offers that much memory (``spark-class ...Worker --memory``: 4g in docker-compose.yml).
DEFAULT_EXECUTOR_MEMORY = "2g"
#: How long a job on a Spark cluster waits for an executor to run its first task (the check of what the
#: executors lack) before it stops, saying what an executor needs, unless
#: ``FRAUD_SPARK_EXECUTOR_START_TIMEOUT_S`` says.
DEFAULT_EXECUTOR_START_TIMEOUT_S = 120.0
#: The URL schemes of FRAUD_REDIS_URL (redis-py's): plain, TLS, a Unix socket.
REDIS_SCHEMES = ("redis", "rediss", "unix")
#: The settings that hold secrets a service must not run with when empty or a placeholder.
SECRETS = ("token_key", "api_token", "redis_password", "sasl_password")
#: What a placeholder secret looks like (case-insensitive): change-me, changeme, change_me...
PLACEHOLDER_SECRET = r"(?i)^change[-_ ]?me"  # noqa: S105 - a pattern that refuses secrets
#: Spark's notation of a JVM heap: a whole number and a unit (512m, 2g).
SPARK_MEMORY_PATTERN = r"^[1-9][0-9]*([kKmMgGtT][bB]?)?$"


#: The longest label delay the settings and the commands accept (days).
LABEL_DELAY_DAYS_MAX = 7.0
#: Days until a fraud label becomes known (``FRAUD_LABEL_DELAY_DAYS``, or a command's ``--label-delay-days``).
LabelDelayDays = Annotated[float, Field(gt=0, le=LABEL_DELAY_DAYS_MAX)]


LogLevel = Literal["debug", "info", "warning", "error"]
#: Log levels, least severe first.
LOG_LEVELS: tuple[str, ...] = get_args(LogLevel)
LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[str, ...] = get_args(LogFormat)


class JobName(StrEnum):
    """The streaming jobs: their run commands' names, checkpoints' and metrics' ``job`` label, Redis writer,
    observer group and Spark application."""

    FEATURES = "features"
    SCORING = "scoring"
    PIPELINE = "pipeline"


class Topics(BaseModel):
    """Kafka topic names. Jobs take a ``Topics`` value, so replays and tests can use their own."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    transactions: str = Field("transactions", description="Card transaction events, keyed by card token.")
    labels: str = Field("labels", description="Delayed fraud confirmations, keyed by card token.")
    features: str = Field("features", description="One feature record per transaction, keyed by card.")
    alerts: str = Field("alerts", description="Transactions scored above the model's threshold.")
    scores: str = Field("scores", description="One score record per transaction.")
    shadow_scores: str = Field(
        "shadow-scores", description="Scores of the shadow model (a challenger), never alerts."
    )
    dead_letter: str = Field("dead-letter", description="Records that failed validation, with the reason.")

    def all(self) -> list[str]:
        """Every topic name, in pipeline order."""
        return [getattr(self, role) for role in Topics.model_fields]

    def with_prefix(self, prefix: str) -> Topics:
        """The same topics under ``prefix``: isolated runs (A/B replays, tests) never touch live topics."""
        return Topics(**{name: f"{prefix}{value}" for name, value in self.model_dump().items()})

    def in_namespace(self, namespace: str) -> Topics:
        """The topics a job in ``namespace`` writes (its outputs under ``<namespace>.``), with the live
        inputs (transactions, labels) it reads; the live pipeline's namespace is empty."""
        if not namespace:
            return self
        return self.model_copy(update={role: f"{namespace}.{getattr(self, role)}" for role in OUTPUT_ROLES})


#: The topics a job writes (a namespace prefixes these); the others are the system of record it reads.
OUTPUT_ROLES = ("features", "scores", "shadow_scores", "alerts", "dead_letter")
#: What a namespace may be called: it becomes part of topic names, Redis keys and a directory.
NAMESPACE_PATTERN = r"^[a-z0-9][a-z0-9-]{0,39}$"


def redis_prefix(namespace: str) -> str:
    """The Redis key prefix of a namespace (none for the live pipeline)."""
    return f"{namespace}:" if namespace else ""


#: What a bearer token may hold: visible ASCII, no spaces (what an ``Authorization`` header carries as it is).
BEARER_TOKEN_PATTERN = r"^[\x21-\x7e]+$"  # noqa: S105 - a format, not a secret


def check_bearer_token(token: str) -> str:
    """``token`` if an API can require it; a blank one would let an absent header in.

    Raises:
        ValueError: the token is empty or blank, or holds characters a header cannot carry as they are.
    """
    if not token.strip():
        raise ValueError(
            "the API token is empty: set a secret of your own (`openssl rand -hex 32`) or unset it"
        )
    if not re.match(BEARER_TOKEN_PATTERN, token):
        raise ValueError(
            "the API token holds spaces or characters a header cannot carry: use visible ASCII "
            "(`openssl rand -hex 32`)"
        )
    return token


#: The token key of demos on the embedded stack: public, so refused with a Kafka of one's own.
DEMO_TOKEN_KEY = "demo-card-token-key"  # noqa: S105 - public on purpose, refused outside demos

#: ``retention.ms`` that keeps records forever. Kafka is the system of record: replays, training and A/B
#: tests need the history, and Kafka deletes by record timestamp (event time, years ago for a replay).
KEEP_FOREVER = -1


class TopicRetention(BaseModel):
    """``retention.ms`` of each topic the project creates (-1: forever). The system of record
    (transactions, labels) is kept by default, and so are the derived topics (set each to shorten it)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    transactions: int = Field(KEEP_FOREVER, ge=-1, description="The system of record: keep it.")
    labels: int = Field(KEEP_FOREVER, ge=-1, description="The system of record: keep it.")
    features: int = Field(KEEP_FOREVER, ge=-1, description="Replayable from transactions and labels.")
    scores: int = Field(KEEP_FOREVER, ge=-1, description="Every score; the A/B replays read them.")
    shadow_scores: int = Field(KEEP_FOREVER, ge=-1, description="The shadow model's scores.")
    alerts: int = Field(KEEP_FOREVER, ge=-1, description="Every alert.")
    dead_letter: int = Field(KEEP_FOREVER, ge=-1, description="Rejected records and why.")


#: A section of the settings (:meth:`Settings._section`).
Section = TypeVar("Section", KafkaConnection, RedisConnection, SparkSettings)


class Settings(BaseSettings):
    """Everything configurable, with the embedded local stack as the default."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=NESTED_DELIMITER,
        frozen=True,
        extra="forbid",
    )

    # Connections. None = the embedded stack started by `fraud up` (or by `fraud demo` for its run).
    bootstrap_servers: str | None = Field(None, description="Kafka bootstrap servers, e.g. kafka:9092.")
    security_protocol: SecurityProtocol = "PLAINTEXT"
    sasl_mechanism: SaslMechanism | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_ca_location: Path | None = Field(None, description="CA bundle for SSL / SASL_SSL.")
    ssl_certificate_location: Path | None = Field(
        None, description="Client certificate (PEM) for Kafka mutual TLS (SSL / SASL_SSL)."
    )
    ssl_key_location: Path | None = Field(
        None, description="Private key (PEM) of the Kafka client certificate."
    )
    ssl_key_password: SecretStr | None = Field(None, description="Password of the Kafka client key, if any.")
    redis_url: str | None = Field(None, description="redis://host:port/db of the alert and feature store.")
    redis_username: str | None = Field(
        None, description="Redis ACL user (default: the URL's, else `default`)."
    )
    redis_password: SecretStr | None = Field(None, description="Redis password (instead of one in the URL).")
    redis_tls: bool = Field(False, description="Connect to Redis over TLS (as a rediss:// URL does).")
    redis_ca_file: Path | None = Field(
        None, description="CA bundle that signs the Redis server's certificate."
    )
    redis_cert_file: Path | None = Field(None, description="Client certificate (PEM) for Redis mutual TLS.")
    redis_key_file: Path | None = Field(
        None, description="Private key (PEM) of the Redis client certificate."
    )
    mlflow_tracking_uri: str | None = Field(None, description="MLflow tracking and registry URI.")
    spark_master: str = Field("local[2]", description="Spark master URL; local mode by default.")
    spark_driver_host: str | None = Field(
        None,
        description="Host name the Spark executors reach the driver at (a container's name in compose); "
        "default: Spark's own choice.",
    )
    spark_shuffle_partitions: int = Field(
        DEFAULT_SHUFFLE_PARTITIONS,
        ge=1,
        le=10_000,
        description="Partitions of the jobs' Spark shuffles, hence of their state stores. A checkpoint keeps "
        "the count it started with; a job started from a savepoint with another count is rescaled.",
    )
    spark_driver_memory: str = Field(
        DEFAULT_DRIVER_MEMORY,
        pattern=SPARK_MEMORY_PATTERN,
        description="JVM heap of a job's Spark driver (in local mode, of the whole job), as Spark writes it "
        "(512m, 2g); a savepoint's rescale passes the state through it.",
    )
    spark_executor_memory: str = Field(
        DEFAULT_EXECUTOR_MEMORY,
        pattern=SPARK_MEMORY_PATTERN,
        description="JVM heap of each executor of a job on a Spark cluster, as Spark writes it (512m, 2g); "
        "a worker must offer at least that much. Not used in local mode.",
    )
    spark_executor_start_timeout_s: float = Field(
        DEFAULT_EXECUTOR_START_TIMEOUT_S,
        gt=0,
        le=86_400,
        description="Seconds a job on a Spark cluster waits for an executor to run its first task before it "
        "stops, saying what an executor needs; longer where it may wait for another application's cores.",
    )
    spark_ui_port: int | None = Field(
        None,
        ge=1,
        le=65_535,
        description="Port of the Spark UI of a job's driver (Spark tries the next ports when it is taken); "
        "unset: no UI.",
    )

    # Topics.
    topics: Topics = Topics()
    partitions: int = Field(4, ge=1, le=1024, description="Partitions of each topic created by the project.")
    replication_factor: int = Field(1, ge=1, le=16)
    retention_ms: TopicRetention = TopicRetention()

    def topic_configs(self, topics: Topics | None = None) -> dict[str, dict[str, str]]:
        """The configs each topic of ``topics`` (default: the settings' topics) is created with: its
        ``retention.ms``, and no size limit (``retention.bytes`` -1)."""
        names, retention = (topics or self.topics).model_dump(), self.retention_ms.model_dump()
        return {
            names[role]: {"retention.ms": str(retention[role]), "retention.bytes": str(KEEP_FOREVER)}
            for role in Topics.model_fields
        }

    # Local state: the embedded stack's pids, logs and data, Spark checkpoints.
    home: Path = Field(Path(".fraud"), description="Directory for local state (embedded stack, checkpoints).")

    # Events.
    label_delay_days: LabelDelayDays = Field(
        7.0,
        description="Days until a fraud label becomes known: ingest stamps a label this long after its "
        "transaction, and the terminal features' windows end this long before each transaction.",
    )
    max_event_bytes: int = Field(16_384, ge=256, le=900_000, description="Larger records are dead-lettered.")
    max_clock_skew_s: float = Field(
        DEFAULT_MAX_CLOCK_SKEW_MS / 1000,
        ge=0,
        description="Events dated further ahead of the clock than this are dead-lettered (future_event_time).",
    )
    token_key: SecretStr = Field(
        SecretStr(DEMO_TOKEN_KEY),
        description="Key of the keyed hash that turns card numbers into tokens. Set your own outside demos.",
    )

    # State layout of the feature job and the pipeline: the counts are fixed for the life of a checkpoint
    # (``layout.json``); a job started from a savepoint with other counts re-keys the savepoint's state into
    # them.
    card_buckets: int = Field(
        DEFAULT_BUCKETS,
        ge=1,
        le=4096,
        description="Buckets cards are hashed into, the keys of the feature job's card state (one state call "
        "per bucket and micro-batch). Change it through a savepoint: `fraud features run --from-savepoint`.",
    )
    terminal_buckets: int = Field(
        DEFAULT_BUCKETS,
        ge=1,
        le=4096,
        description="Buckets terminals are hashed into, the keys of the feature job's terminal state. Change "
        "it through a savepoint, as FRAUD_CARD_BUCKETS.",
    )
    card_slots: int = Field(
        DEFAULT_SLOTS,
        ge=1,
        le=2**20,
        description="Slots per card bucket: the finest its state is cut into pages (a micro-batch reads and "
        "writes the pages of the cards it has events for). Change it through a savepoint, as "
        "FRAUD_CARD_BUCKETS.",
    )
    terminal_slots: int = Field(
        DEFAULT_SLOTS,
        ge=1,
        le=2**20,
        description="Slots per terminal bucket, as FRAUD_CARD_SLOTS for terminals.",
    )
    page_bytes: int = Field(
        DEFAULT_PAGE_BYTES,
        ge=1024,
        le=2**24,
        description="Size past which a page of state is cut in two: smaller pages move fewer bytes per "
        "micro-batch, larger ones fewer requests. Unlike the counts above it may change on any restart: "
        "pages are cut past the new size from then on.",
    )

    # Alerts: the Redis lookup store and its API.
    alert_retention_s: int = Field(
        DEFAULT_RETENTION_S,
        ge=60,
        description="Retention of alerts, latest scores and latest features in Redis: hashes expire this long "
        "after their last write; alert sets keep this span of event time before their newest alert.",
    )
    model_check_interval_s: float = Field(
        DEFAULT_MODEL_CHECK_INTERVAL_S,
        ge=1.0,
        le=86_400,
        description="Seconds between a scoring job's checks of where its model alias points.",
    )
    api_host: str = Field("127.0.0.1", description="Address `fraud serve` listens on.")
    api_port: int = Field(8000, ge=1, le=65_535, description="Port `fraud serve` listens on.")
    metrics_port: int | None = Field(
        None,
        ge=1,
        le=65_535,
        description="Port of the Prometheus metrics (/metrics) of a streaming job (`features run`, `score run`, "
        "`pipeline run`); unset: a free port (`fraud status` finds it).",
    )
    metrics_host: str = Field("127.0.0.1", description="Address the metrics endpoint listens on.")
    log_level: LogLevel = Field(
        "warning",
        description="Least severe log lines shown (the command's and Spark's Python workers'; Spark's JVM logs "
        "to FRAUD_HOME/logs/spark.log); `fraud --log-level` overrides it.",
    )
    log_format: LogFormat = Field(
        "text", description="Log lines as text, or as JSON lines (one object per line, for log collectors)."
    )
    api_token: SecretStr | None = Field(
        None,
        description="Bearer token the API requires (`Authorization: Bearer <token>`): visible ASCII, never "
        "empty; required to listen on an address other than loopback.",
    )

    @field_validator("redis_url")
    @classmethod
    def _redis_url_is_a_redis_url(cls, url: str | None) -> str | None:
        """A Redis URL that redis-py can use: redis://, rediss:// (TLS) or unix://, with a host or a path."""
        if url is None:
            return url
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - raises on a port that is not a number
        except ValueError as exc:
            raise ValueError(f"not a URL: {exc}") from None
        if parts.scheme.lower() not in REDIS_SCHEMES:
            raise ValueError("give redis://[user:password@]host:port/db (rediss:// for TLS, or unix://path)")
        if not (parts.hostname or parts.path):
            raise ValueError("the URL names no host")
        return url

    @model_validator(mode="after")
    def _secrets_are_secret(self) -> Settings:
        """No secret is empty or a placeholder (``change-me...``, as an example file might hold): a service
        started with one would run with a secret everyone knows."""
        for name in SECRETS:
            value = getattr(self, name)
            if value is None:
                continue
            text = value.get_secret_value()
            if not text.strip() or re.match(PLACEHOLDER_SECRET, text):
                raise ValueError(
                    f"{env_name((name,))} is empty or a placeholder: set a secret of your own "
                    "(for example `openssl rand -hex 32`)"
                )
        return self

    @field_validator("api_token")
    @classmethod
    def _token_can_guard(cls, token: SecretStr | None) -> SecretStr | None:
        """An empty token is a mistake, never "no authentication": unset the variable for that."""
        if token is not None:
            if not token.get_secret_value().strip():  # said as of the other secrets (_secrets_are_secret)
                raise ValueError(
                    "FRAUD_API_TOKEN is empty or a placeholder: set a secret of your own (for example "
                    "`openssl rand -hex 32`), or unset it (a blank API token would let requests without "
                    "the header in)"
                )
            check_bearer_token(token.get_secret_value())
        return token

    @model_validator(mode="after")
    def _connections_are_whole(self) -> Settings:
        """A client certificate comes with its key; Redis credentials come from the URL or the settings, not
        both; certificate files for Redis need TLS."""
        pairs = (
            (
                "FRAUD_SSL_CERTIFICATE_LOCATION",
                self.ssl_certificate_location,
                "FRAUD_SSL_KEY_LOCATION",
                self.ssl_key_location,
            ),
            ("FRAUD_REDIS_CERT_FILE", self.redis_cert_file, "FRAUD_REDIS_KEY_FILE", self.redis_key_file),
        )
        for cert_name, cert, key_name, key in pairs:
            if (cert is None) != (key is None):
                raise ValueError(f"{cert_name} and {key_name} go together: set both or neither")
        url_credentials = self.redis_url is not None and redact_url(self.redis_url) != self.redis_url
        if url_credentials and (self.redis_username or self.redis_password):
            raise ValueError(
                "FRAUD_REDIS_URL carries credentials and FRAUD_REDIS_USERNAME/FRAUD_REDIS_PASSWORD are set: "
                "keep one of the two"
            )
        files = (self.redis_ca_file, self.redis_cert_file)
        if any(f is not None for f in files) and not self.redis_uses_tls():
            raise ValueError(
                "FRAUD_REDIS_CA_FILE / FRAUD_REDIS_CERT_FILE need TLS: set FRAUD_REDIS_TLS=true or use a rediss:// URL"
            )
        return self

    @property
    def label_delay_ms(self) -> int:
        """The label delay in milliseconds, as every stage uses it."""
        return round(self.label_delay_days * DAY_MS)

    @property
    def kafka(self) -> KafkaConnection:
        """How the Kafka clients log in: ``FRAUD_SECURITY_PROTOCOL``, ``FRAUD_SASL_*``, ``FRAUD_SSL_*``."""
        return self._section(KafkaConnection)

    @property
    def redis(self) -> RedisConnection:
        """How to log in to Redis beyond its URL: ``FRAUD_REDIS_*`` but the URL."""
        return self._section(RedisConnection, "redis_")

    @property
    def spark(self) -> SparkSettings:
        """Where the jobs' Spark runs and with what: ``FRAUD_SPARK_*``."""
        return self._section(SparkSettings, "spark_")

    def _section(self, model: type[Section], prefix: str = "") -> Section:
        """The settings named ``prefix`` + each field of ``model`` (``redis_tls`` for ``RedisConnection.tls``),
        as a ``model``. The ``FRAUD_*`` names stay flat: the settings read and validate them, their sections
        only group them."""
        return model(**{name: getattr(self, f"{prefix}{name}") for name in model.model_fields})

    def redis_uses_tls(self) -> bool:
        """Whether Redis is reached over TLS: ``redis_tls``, or a ``rediss://`` URL."""
        return self.redis_tls or (self.redis_url or "").lower().startswith("rediss://")

    def __repr_args__(self) -> Any:
        """As pydantic shows a model, with the credentials a Redis or MLflow URL may carry redacted."""
        for name, value in super().__repr_args__():
            yield name, redact_url(value) if name in ("redis_url", "mlflow_tracking_uri") and value else value

    def bearer_token(self) -> str | None:
        """The API's bearer token (``api_token``), if one is set."""
        return None if self.api_token is None else self.api_token.get_secret_value()

    def card_token_key(self) -> bytes:
        """The key that tokenises card numbers. The public demo key only with the embedded stack: with a
        Kafka of one's own, tokens made with a key everyone knows could be reversed by trying card
        numbers."""
        key = self.token_key.get_secret_value()
        if key == DEMO_TOKEN_KEY and self.bootstrap_servers is not None:
            raise SettingsError(
                "FRAUD_TOKEN_KEY is the public demo key, and FRAUD_BOOTSTRAP_SERVERS names a Kafka of your own: "
                "set FRAUD_TOKEN_KEY to a secret of your own (for example `openssl rand -hex 32`)"
            )
        return key.encode()


class SettingsError(ConfigError):
    """A ``FRAUD_*`` environment variable names no setting (most likely a typo) or has an unusable value."""


def known_env_names() -> set[str]:
    """Every `FRAUD_*` variable that names a setting."""
    names = set()
    for name, field in Settings.model_fields.items():
        env = f"{ENV_PREFIX}{name}".upper()
        names.add(env)
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            names.update(f"{env}{NESTED_DELIMITER}{sub}".upper() for sub in annotation.model_fields)
    return names


def unknown_names_message(unknown: list[str], known: set[str]) -> str:
    """What to say about ``FRAUD_*`` variables that name no setting: the closest known name of each (a
    typo, most likely), else every known name."""
    guesses = {name: difflib.get_close_matches(name.upper(), known, n=1, cutoff=0.75) for name in unknown}
    if all(guesses.values()):
        return "unknown setting " + "; ".join(
            f"{name} (did you mean {guess[0]}?)" for name, guess in guesses.items()
        )
    return f"unknown setting(s) {', '.join(unknown)}; known ones are: {', '.join(sorted(known))}"


def env_name(location: tuple[int | str, ...]) -> str:
    """The environment variable of a setting's location (``("topics", "alerts")`` -> ``FRAUD_TOPICS__ALERTS``)."""
    return ENV_PREFIX + NESTED_DELIMITER.join(str(part) for part in location).upper()


def load_settings() -> Settings:
    """Build the settings from the environment.

    Raises:
        SettingsError: a ``FRAUD_*`` variable names no setting, or a value is unusable; the message names
            the variable, the value and what is expected, on one line.
    """
    known = known_env_names()
    unknown = sorted(k for k in os.environ if k.upper().startswith(ENV_PREFIX) and k.upper() not in known)
    if unknown:
        raise SettingsError(unknown_names_message(unknown, known))
    try:
        return Settings()
    except SourceError as exc:  # a section's variable (FRAUD_TOPICS, FRAUD_RETENTION_MS) that is not JSON
        field = re.search(r'field "(\w+)"', str(exc))
        name = env_name((field.group(1),)) if field else "a FRAUD_* variable"
        value = {k.upper(): v for k, v in os.environ.items()}.get(name)
        raise SettingsError(
            f"invalid setting: {name}={value!r}: not a JSON object; give JSON, or set its fields one by one "
            f"({name}{NESTED_DELIMITER}<FIELD>)"
        ) from None
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            if not error["loc"]:  # a rule over several settings: its message names them, values unshown
                problems.append(str(error["msg"]).removeprefix("Value error, "))
                continue
            name = env_name(error["loc"])
            secret = any(word in name for word in ("PASSWORD", "KEY", "SECRET", "TOKEN"))
            value = os.environ.get(name, error.get("input"))
            if isinstance(value, str) and name.endswith(("_URL", "_URI")):
                value = redact_url(value)
            shown = "***" if secret else repr(value)
            problems.append(f"{name}={shown}: {str(error['msg']).removeprefix('Value error, ')}")
        raise SettingsError("invalid setting: " + "; ".join(problems)) from None
