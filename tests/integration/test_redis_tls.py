"""Redis over mutual TLS with an ACL user: the settings FRAUD_REDIS_TLS, _CA_FILE, _CERT_FILE, _KEY_FILE,
_USERNAME and _PASSWORD reach a real TLS handshake and a real Valkey login.

The Valkey binary here has no TLS built in, so the session's Valkey sits behind a TLS front (the test's own
CA signs its certificate and the client's; a client without a certificate is turned away), as stunnel or a
managed Redis endpoint would put it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from pydantic import SecretStr

from contracts.redis_keys import card_features_key
from contracts.settings import Settings
from infra.clients import Clients, Endpoints
from infra.embedded.stack import StackInfo
from infra.redis.connection import RedisTarget
from infra.redis.store import set_latest
from tests.support.tls import HOST, TlsFront, make_pki

PASSWORD = f"tls-test-{uuid.uuid4().hex}"


@pytest.fixture
def acl_user(stack: StackInfo) -> Iterator[str]:
    """A Redis ACL user of this test only, with a password."""
    name = f"fraud-tls-{uuid.uuid4().hex[:8]}"
    admin = redis.Redis.from_url(stack.redis_url)
    admin.acl_setuser(name, enabled=True, passwords=[f"+{PASSWORD}"], keys=["*"], commands=["+@all"])
    yield name
    admin.acl_deluser(name)


def redis_clients(settings: Settings) -> Clients:
    """Clients of the settings' Redis (no Kafka or MLflow in this test)."""
    return Clients(settings, Endpoints("127.0.0.1:9", str(settings.redis_url), "sqlite:///unused.db"))


def test_the_clients_log_in_over_mutual_tls(stack: StackInfo, acl_user: str, tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    with TlsFront(pki, stack.redis.port).running() as front:
        url = f"redis://{HOST}:{front.port}/0"
        settings = Settings(
            redis_url=url,
            redis_username=acl_user,
            redis_password=PASSWORD,
            redis_tls=True,
            redis_ca_file=pki.ca,
            redis_cert_file=pki.client_cert,
            redis_key_file=pki.client_key,
        )
        clients = redis_clients(settings)
        client = clients.redis()
        assert client.acl_whoami() == acl_user

        # The jobs' write path, with the options the jobs get (fraud.jobs.redis_target).
        prefix = f"tls-{uuid.uuid4().hex[:8]}:"
        target = RedisTarget(url, prefix, 60, settings.redis)
        row = (card_features_key("c1", prefix), 1_000, 7, {"amount": 12.5})
        assert target.write(lambda c: set_latest(c, [row], 60)) == 1
        assert redis.Redis.from_url(stack.redis_url).hget(row[0], "amount") == b"12.5"

        failures = front.handshake_failures
        no_certificate = Settings(redis_url=url, redis_tls=True, redis_ca_file=pki.ca)
        with pytest.raises(redis.ConnectionError):
            redis_clients(no_certificate).redis().ping()
        deadline = time.monotonic() + 10  # the front's thread counts the refusal after the client saw it
        while front.handshake_failures <= failures and time.monotonic() < deadline:
            time.sleep(0.05)
        assert front.handshake_failures > failures
        wrong_password = settings.model_copy(update={"redis_password": SecretStr("wrong")})
        with pytest.raises(redis.AuthenticationError):
            redis_clients(wrong_password).redis().ping()
