"""The connection settings reach the clients as their libraries expect: Kafka mutual TLS as librdkafka's
``ssl.*`` options, Redis user, password and TLS as redis-py's connection options."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from confluent_kafka import KafkaException, Producer

from contracts.settings import Settings
from infra.clients import Clients, Endpoints
from infra.redis.connection import RedisTarget
from tests.support.tls import make_pki

KEY_PASSWORD = "hunter2-key-password"  # noqa: S105 - the secrets the tests look for
REDIS_PASSWORD = "hunter2-redis-password"  # noqa: S105


def clients_of(**settings: object) -> Clients:
    values = Settings(**{"bootstrap_servers": "127.0.0.1:9", "redis_url": "redis://cache:6379/0", **settings})
    return Clients(values, Endpoints("127.0.0.1:9", str(values.redis_url), "sqlite:///x.db"))


def test_kafka_client_certificate_settings_become_librdkafka_ssl_options(tmp_path: Path) -> None:
    pki = make_pki(tmp_path, client_key_password=KEY_PASSWORD.encode())
    clients = clients_of(
        security_protocol="SSL",
        ssl_ca_location=pki.ca,
        ssl_certificate_location=pki.client_cert,
        ssl_key_location=pki.client_key,
        ssl_key_password=KEY_PASSWORD,
    )
    config = clients.kafka_config()
    assert config["ssl.ca.location"] == str(pki.ca)
    assert config["ssl.certificate.location"] == str(pki.client_cert)
    assert config["ssl.key.location"] == str(pki.client_key)
    assert config["ssl.key.password"] == KEY_PASSWORD
    # librdkafka loads the certificate and decrypts the key when the client is made: a wrong password fails.
    Producer(config).flush(0)
    with pytest.raises(KafkaException, match=r"(?i)key"):
        Producer({**config, "ssl.key.password": "wrong"})


def test_no_client_certificate_means_no_ssl_options() -> None:
    assert not any(key.startswith("ssl.") for key in clients_of().kafka_config())


def test_redis_user_password_and_tls_settings_become_client_options(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    clients = clients_of(
        redis_username="fraud",
        redis_password=REDIS_PASSWORD,
        redis_tls=True,
        redis_ca_file=pki.ca,
        redis_cert_file=pki.client_cert,
        redis_key_file=pki.client_key,
    )
    pool = clients.redis().connection_pool
    assert pool.connection_class is redis.SSLConnection
    kwargs = pool.connection_kwargs
    assert (kwargs["host"], kwargs["port"], kwargs["username"], kwargs["password"]) == (
        "cache",
        6379,
        "fraud",
        REDIS_PASSWORD,
    )
    assert (kwargs["ssl_ca_certs"], kwargs["ssl_certfile"], kwargs["ssl_keyfile"]) == (
        str(pki.ca),
        str(pki.client_cert),
        str(pki.client_key),
    )
    # The jobs' target carries the same options to the Spark workers.
    target = RedisTarget("redis://cache:6379/0", "", 60, clients.settings.redis)
    assert target.client().connection_pool.connection_kwargs["password"] == REDIS_PASSWORD
    assert REDIS_PASSWORD not in repr(target) and REDIS_PASSWORD not in repr(clients.settings.redis)


def test_a_rediss_url_is_tls_and_a_plain_one_is_not() -> None:
    assert clients_of().redis().connection_pool.connection_class is redis.Connection
    tls = clients_of(redis_url="rediss://cache:6380/0")
    assert tls.settings.redis_uses_tls()
    assert tls.redis().connection_pool.connection_class is redis.SSLConnection
