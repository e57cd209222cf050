"""Topic administration: which topics exist, creating them with the settings' partitions and retention,
the retention they really have, deleting them."""

from __future__ import annotations

from collections.abc import Mapping

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from contracts.settings import KEEP_FOREVER, Settings, Topics
from infra.kafka.connection import METADATA_TIMEOUT_S, cluster_metadata

#: Topic configs that keep the history (the default of every topic the project creates).
KEEP_HISTORY = {"retention.ms": str(KEEP_FOREVER), "retention.bytes": str(KEEP_FOREVER)}


def existing_topics(admin: AdminClient, names: list[str]) -> list[str]:
    """Those of ``names`` that exist, in their order."""
    present = set(cluster_metadata(admin).topics)
    return [name for name in names if name in present]


def ensure_topics(
    admin: AdminClient,
    names: list[str],
    partitions: int,
    replication_factor: int,
    configs: Mapping[str, Mapping[str, str]] | None = None,
) -> list[str]:
    """Create the topics that do not exist yet, each with its ``configs`` (default: history kept forever,
    ``retention.ms`` and ``retention.bytes`` -1); returns the names created. Idempotent."""
    existing = set(cluster_metadata(admin).topics)
    wanted = [
        NewTopic(name, partitions, replication_factor, config=dict((configs or {}).get(name, KEEP_HISTORY)))
        for name in names
        if name not in existing
    ]
    if not wanted:
        return []
    futures = admin.create_topics(wanted, request_timeout=15)  # keep `admin` alive until .result()
    created = []
    for name, future in futures.items():
        try:
            future.result()
            created.append(name)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
    return created


def create_project_topics(admin: AdminClient, settings: Settings, topics: Topics | None = None) -> list[str]:
    """Create the topics of ``topics`` (default: the settings') that do not exist, with the partitions,
    replication and retention of the settings; returns the names created."""
    configs = settings.topic_configs(topics)
    return ensure_topics(admin, list(configs), settings.partitions, settings.replication_factor, configs)


def topic_configs(admin: AdminClient, names: list[str]) -> dict[str, dict[str, str]]:
    """The configs the broker reports for each existing topic of ``names`` (a broker may report only the
    ones set on the topic)."""
    present = existing_topics(admin, names)
    if not present:
        return {}
    futures = admin.describe_configs([ConfigResource(ResourceType.TOPIC, name) for name in present])
    return {
        resource.name: {key: entry.value for key, entry in future.result(METADATA_TIMEOUT_S).items()}
        for resource, future in futures.items()
    }


def shorter_retention(
    wanted: Mapping[str, Mapping[str, str]], found: Mapping[str, Mapping[str, str]]
) -> list[str]:
    """For each topic that keeps its records for less time or space than ``wanted`` asks, one line saying so."""
    problems = []
    for name, configs in wanted.items():
        for key, value in configs.items():
            have = found.get(name, {}).get(key)
            if have is None or value == have:
                continue
            if int(value) == KEEP_FOREVER or (int(have) != KEEP_FOREVER and int(have) < int(value)):
                problems.append(f"topic {name!r} has {key}={have}, the settings ask for {value}")
    return problems


def delete_topics(admin: AdminClient, names: list[str]) -> None:
    """Delete topics that exist (tests and `fraud topics reset`)."""
    doomed = existing_topics(admin, names)
    if doomed:
        for future in admin.delete_topics(doomed, request_timeout=15).values():
            future.result()
