import os
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from contracts.settings import Settings, SettingsError, Topics, load_settings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in [n for n in os.environ if n.upper().startswith("FRAUD_")]:
        monkeypatch.delenv(name)


def test_defaults_mean_embedded_stack() -> None:
    settings = load_settings()
    assert settings.bootstrap_servers is None
    assert settings.redis_url is None
    assert settings.mlflow_tracking_uri is None
    assert settings.spark_master == "local[2]"
    assert settings.topics.transactions == "transactions"
    assert settings.topics.dead_letter == "dead-letter"
    assert settings.label_delay_days == 7


def test_environment_overrides_connections_topics_and_security(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRAUD_BOOTSTRAP_SERVERS", "kafka:9092")
    monkeypatch.setenv("FRAUD_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("FRAUD_SASL_PASSWORD", "s3cret")
    monkeypatch.setenv("FRAUD_TOPICS__ALERTS", "fraud-alerts")
    monkeypatch.setenv("FRAUD_PARTITIONS", "12")
    monkeypatch.setenv("FRAUD_HOME", "/var/lib/fraud")
    settings = load_settings()
    assert settings.bootstrap_servers == "kafka:9092"
    assert settings.security_protocol == "SASL_SSL"
    assert settings.sasl_password is not None
    assert settings.sasl_password.get_secret_value() == "s3cret"
    assert "s3cret" not in repr(settings)
    assert settings.topics.alerts == "fraud-alerts"
    assert settings.topics.transactions == "transactions"
    assert settings.partitions == 12
    assert settings.home == Path("/var/lib/fraud")


@pytest.mark.parametrize(
    ("name", "value"), [("FRAUD_BOOTSTRAP_SERVER", "kafka:9092"), ("FRAUD_TOPICS__ALERT", "x")]
)
def test_mistyped_variable_fails_loudly(name: str, value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError, match=name):
        load_settings()


def test_a_mistyped_name_gets_a_did_you_mean(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRAUD_PARTITONS", "4")
    monkeypatch.setenv("fraud_redis_ulr", "redis://x")
    with pytest.raises(SettingsError) as caught:
        load_settings()
    message = str(caught.value)
    assert "FRAUD_PARTITONS (did you mean FRAUD_PARTITIONS?)" in message
    assert "fraud_redis_ulr (did you mean FRAUD_REDIS_URL?)" in message
    assert "known ones are" not in message


def test_a_name_like_no_setting_lists_the_known_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRAUD_COLOUR", "blue")
    with pytest.raises(
        SettingsError, match=r"unknown setting\(s\) FRAUD_COLOUR; known ones are: .*FRAUD_HOME"
    ):
        load_settings()


@pytest.mark.parametrize("name", ["FRAUD_TOKEN_KEY", "FRAUD_API_TOKEN", "FRAUD_REDIS_PASSWORD"])
@pytest.mark.parametrize("value", ["change-me", "CHANGE_ME-api-token", "changeme", " "])
def test_a_placeholder_secret_is_refused(name: str, value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError, match=f"{name} is empty or a placeholder") as caught:
        load_settings()
    assert value.strip() not in str(caught.value) or not value.strip()


def test_a_secret_of_ones_own_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRAUD_API_TOKEN", "p@ss/w#rd:?&$x-change-me-later")
    assert load_settings().bearer_token() == "p@ss/w#rd:?&$x-change-me-later"


def test_invalid_values_are_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRAUD_SECURITY_PROTOCOL", "PLAIN_TEXT")
    with pytest.raises(SettingsError, match="FRAUD_SECURITY_PROTOCOL='PLAIN_TEXT'"):
        load_settings()
    monkeypatch.setenv("FRAUD_SECURITY_PROTOCOL", "PLAINTEXT")
    monkeypatch.setenv("FRAUD_LABEL_DELAY_DAYS", "8")
    with pytest.raises(
        SettingsError, match="FRAUD_LABEL_DELAY_DAYS='8': Input should be less than or equal to 7"
    ):
        load_settings()


@pytest.mark.parametrize("name", ["FRAUD_TOPICS", "FRAUD_RETENTION_MS"])
@pytest.mark.parametrize("value", ["", "alerts=x", "{bad json"])
def test_a_section_variable_that_is_not_json_is_a_one_line_error(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError, match=f"{name}={value!r}: not a JSON object") as raised:
        load_settings()
    assert "\n" not in str(raised.value) and f"{name}__<FIELD>" in str(raised.value)


def test_secret_values_are_not_echoed_in_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRAUD_SASL_PASSWORD", "hunter2")
    monkeypatch.setenv("FRAUD_PARTITIONS", "many")
    with pytest.raises(SettingsError, match="FRAUD_PARTITIONS='many'") as raised:
        load_settings()
    assert "hunter2" not in str(raised.value)


def test_settings_are_frozen() -> None:
    settings = Settings()
    with pytest.raises(ValidationError):
        settings.partitions = 3  # type: ignore[misc]


def test_topic_prefix_isolates_every_topic() -> None:
    topics = Topics().with_prefix("ab-")
    assert topics.all() == [f"ab-{name}" for name in Topics().all()]
    assert len(set(topics.all())) == 7


def test_a_namespace_isolates_the_outputs_and_shares_the_inputs() -> None:
    live = Topics()
    replay = live.in_namespace("ab-1")
    assert (replay.transactions, replay.labels) == (live.transactions, live.labels)
    assert {
        replay.features,
        replay.scores,
        replay.shadow_scores,
        replay.alerts,
        replay.dead_letter,
    }.isdisjoint(live.all())
    assert replay.scores == f"ab-1.{live.scores}"


#: Settings of every kind (numbers, a choice, a nested retention, a topic name, a path, a secret) and a typo.
FUZZED = (
    "FRAUD_PARTITIONS",
    "FRAUD_LABEL_DELAY_DAYS",
    "FRAUD_API_PORT",
    "FRAUD_SECURITY_PROTOCOL",
    "FRAUD_MAX_CLOCK_SKEW_S",
    "FRAUD_RETENTION_MS__TRANSACTIONS",
    "FRAUD_TOPICS__ALERTS",
    "FRAUD_TOPICS",
    "FRAUD_RETENTION_MS",
    "FRAUD_HOME",
    "FRAUD_SASL_PASSWORD",
    "FRAUD_SSL_KEY_PASSWORD",
    "FRAUD_REDIS_PASSWORD",
    "FRAUD_REDIS_TLS",
    "FRAUD_REDIS_CERT_FILE",
    "FRAUD_PARTITONS",
)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])  # the env is patched per example
@given(
    name=st.sampled_from(FUZZED),
    value=st.text(alphabet=st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=40),
)
def test_any_value_of_a_setting_gives_settings_or_one_settings_error(name: str, value: str) -> None:
    with mock.patch.dict(os.environ, {name: value}, clear=False):
        try:
            load_settings()
        except SettingsError as error:
            assert "\n" not in str(error) and name.upper() in str(error)
            if "PASSWORD" in name and value.strip():
                assert value not in str(error)


def test_settings_do_not_show_credentials() -> None:
    settings = Settings(
        bootstrap_servers="kafka:9092",
        sasl_password="hunter2-kafka-secret",  # noqa: S106 - the secrets the test looks for
        redis_url="redis://default:hunter2-redis-secret@cache:6379/0",
        mlflow_tracking_uri="https://ml:hunter2-mlflow-secret@mlflow.example:5000",
        token_key="hunter2-token-key",  # noqa: S106
        api_token="hunter2-api-token",  # noqa: S106
        ssl_key_password="hunter2-kafka-key",  # noqa: S106
    )
    with_redis_password = Settings(redis_url="redis://cache:6379/0", redis_password="hunter2-redis")  # noqa: S106
    assert "hunter2" not in repr(with_redis_password) + str(with_redis_password)
    for text in (repr(settings), str(settings)):
        assert "hunter2" not in text, text
        assert "cache:6379" in text and "mlflow.example:5000" in text


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        (
            {"FRAUD_SSL_CERTIFICATE_LOCATION": "/c.pem"},
            "FRAUD_SSL_CERTIFICATE_LOCATION and FRAUD_SSL_KEY_LOCATION",
        ),
        (
            {"FRAUD_REDIS_KEY_FILE": "/k.pem", "FRAUD_REDIS_TLS": "1"},
            "FRAUD_REDIS_CERT_FILE and FRAUD_REDIS_KEY_FILE",
        ),
        ({"FRAUD_REDIS_CA_FILE": "/ca.pem"}, "need TLS: set FRAUD_REDIS_TLS=true"),
        (
            {
                "FRAUD_REDIS_URL": "redis://:hunter2-in-url@cache:6379/0",
                "FRAUD_REDIS_PASSWORD": "hunter2-set",
            },
            "FRAUD_REDIS_URL carries credentials",
        ),
    ],
)
def test_connection_settings_that_belong_together_fail_alone_in_one_line(
    monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], message: str
) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError, match=message) as raised:
        load_settings()
    assert "\n" not in str(raised.value) and "hunter2" not in str(raised.value)


def test_redis_tls_comes_from_the_setting_or_the_url(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not Settings(redis_url="redis://cache:6379/0").redis_uses_tls()
    assert Settings(redis_url="rediss://cache:6379/0", redis_ca_file=Path("/ca.pem")).redis_uses_tls()
    monkeypatch.setenv("FRAUD_REDIS_TLS", "true")
    monkeypatch.setenv("FRAUD_REDIS_USERNAME", "fraud")
    settings = load_settings()
    assert settings.redis_uses_tls() and settings.redis_username == "fraud"
