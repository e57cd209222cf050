"""The settings' sections: how the Kafka clients and Redis log in, and where the jobs' Spark runs and with
what. ``contracts.settings.Settings`` reads and validates their ``FRAUD_*`` names, flat; each section
groups them for the adapter that uses them (``Settings.kafka``, ``Settings.redis``, ``Settings.spark``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, SecretStr

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]


def _revealed(value: object) -> object:
    """A setting's value as a client library takes it: a secret's text, a path's string."""
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    return str(value) if isinstance(value, Path) else value


class KafkaConnection(BaseModel):
    """How the Kafka clients log in (``FRAUD_SECURITY_PROTOCOL``, ``FRAUD_SASL_*``, ``FRAUD_SSL_*``). Where the
    brokers are is an endpoint (``FRAUD_BOOTSTRAP_SERVERS``, else the embedded stack's) given to
    :meth:`client_config`. Each field is named as librdkafka's option with ``_`` for ``.``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    security_protocol: SecurityProtocol = "PLAINTEXT"
    sasl_mechanism: SaslMechanism | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_ca_location: Path | None = None
    ssl_certificate_location: Path | None = None
    ssl_key_location: Path | None = None
    ssl_key_password: SecretStr | None = None

    def client_config(self, bootstrap_servers: str) -> dict[str, Any]:
        """The connection and security options every confluent-kafka client of ``bootstrap_servers`` takes:
        the fields that are set, under librdkafka's names (``sasl_username`` -> ``sasl.username``), secrets
        revealed (the dict is for the client only: never show it)."""
        config: dict[str, Any] = {"bootstrap.servers": bootstrap_servers}
        for name in type(self).model_fields:
            value = getattr(self, name)
            if value is not None:
                config[name.replace("_", ".")] = _revealed(value)
        return config


#: redis-py's keyword argument of each TLS file of :class:`RedisConnection`.
REDIS_TLS_FILES = {"ca_file": "ssl_ca_certs", "cert_file": "ssl_certfile", "key_file": "ssl_keyfile"}


class RedisConnection(BaseModel):
    """How to log in to Redis beyond its URL (``FRAUD_REDIS_URL``, else the embedded stack's): an ACL user and
    password, TLS with the CA that signs the server's certificate and a client certificate (mutual TLS)
    (``FRAUD_REDIS_*``). Unset fields leave the URL's own. Hashable: a process keeps one client per URL and
    connection, and Spark workers receive it with the jobs' Redis target."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    username: str | None = None
    password: SecretStr | None = None
    tls: bool = False
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None

    def client_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``redis.Redis.from_url`` that apply these options, the password revealed
        (for the client only: never show them)."""
        import redis  # redis-py only where a client is made: the settings load without it

        kwargs: dict[str, Any] = {}
        if self.username is not None:
            kwargs["username"] = self.username
        if self.password is not None:
            kwargs["password"] = self.password.get_secret_value()
        if self.tls:
            kwargs["connection_class"] = redis.SSLConnection
        for name, argument in REDIS_TLS_FILES.items():
            value = getattr(self, name)
            if value is not None:
                kwargs[argument] = _revealed(value)
        return kwargs


class SparkSettings(BaseModel):
    """Where the jobs' Spark runs and with what (``FRAUD_SPARK_*``), as Spark configuration entries."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    master: str
    driver_host: str | None
    shuffle_partitions: int
    driver_memory: str
    executor_memory: str
    executor_start_timeout_s: float
    ui_port: int | None

    def conf(self) -> dict[str, str]:
        """Spark's configuration entries of these settings. The Spark UI is off unless a port is set; a driver
        host is the name executors reach the driver at, and the driver listens on every interface (inside a
        container)."""
        conf = {
            "spark.master": self.master,
            "spark.ui.enabled": "false" if self.ui_port is None else "true",
            "spark.sql.shuffle.partitions": str(self.shuffle_partitions),
            "spark.driver.memory": self.driver_memory,
            "spark.executor.memory": self.executor_memory,
        }
        if self.ui_port is not None:
            conf["spark.ui.port"] = str(self.ui_port)
        if self.driver_host is not None:
            conf["spark.driver.host"] = self.driver_host
            conf["spark.driver.bindAddress"] = "0.0.0.0"  # noqa: S104 - inside a container; the host is the name
        return conf
