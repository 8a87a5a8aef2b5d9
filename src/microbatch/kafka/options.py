"""The Kafka source's options: Spark's validation of them (KafkaSourceProvider's
validateStreamOptions), with its messages, before a query starts."""
from __future__ import annotations

import logging
import re

from microbatch.errors import IllegalArgumentException
from microbatch.kafka.client import check_client_settings, client_params
from microbatch.kafka.offsets import assigned_partitions, starting_limit
from microbatch.util import CaseInsensitiveOptions

log = logging.getLogger(__name__)

_STRATEGIES = ("subscribe", "subscribepattern", "assign")   # Spark's order in its messages


def _has(options: CaseInsensitiveOptions, key: str) -> bool:
    return key in options


def validate_stream_options(options: CaseInsensitiveOptions) -> None:  # noqa: C901 - Spark's checks, one after another in its order
    """Spark's KafkaSourceProvider.validateStreamOptions, with its messages."""
    if _has(options, "endingOffsets"):
        raise IllegalArgumentException("ending offset not valid in streaming queries")
    if _has(options, "endingOffsetsByTimestamp") or _has(options, "endingTimestamp"):
        raise IllegalArgumentException("ending timestamp not valid in streaming queries")
    specified = [k for k in _STRATEGIES if _has(options, k)]
    if not specified:
        raise IllegalArgumentException(
            "One of the following options must be specified for Kafka source: "
            + ", ".join(_STRATEGIES) + ". See the docs for more details.")
    if len(specified) > 1:
        raise IllegalArgumentException(
            "Only one of the following options can be specified for Kafka source: "
            + ", ".join(_STRATEGIES) + ". See the docs for more details.")
    value = options[specified[0]]
    if specified[0] == "assign" and not value.strip().startswith("{"):
        raise IllegalArgumentException(
            f"No topicpartitions to assign as specified value for option 'assign' is '{value}'")
    if specified[0] == "assign":
        assigned_partitions(value)
    if specified[0] == "subscribepattern" and value.strip():
        try:
            re.compile(value.strip())
        except re.error as e:
            raise IllegalArgumentException(
                f"Invalid pattern '{value}' for option 'subscribePattern': {e}") from None
    if specified[0] == "subscribe" and not [t for t in value.split(",") if t.strip()]:
        raise IllegalArgumentException(
            f"No topics to subscribe to as specified value for option 'subscribe' is '{value}'")
    if specified[0] == "subscribepattern" and not value.strip():
        raise IllegalArgumentException(
            "Pattern to subscribe is empty as specified value for option "
            f"'subscribePattern' is '{value}'")
    if _has(options, "minPartitions") and _int(options, "minPartitions") <= 0:
        raise IllegalArgumentException("minPartitions must be positive")
    if _has(options, "maxRecordsPerPartition") and _int(options, "maxRecordsPerPartition") <= 0:
        raise IllegalArgumentException("maxRecordsPerPartition must be positive")
    if _has(options, "kafka.group.id"):
        log.warning("Kafka option 'kafka.group.id' has been set on this query, it is not "
                    "recommended to set this option. This option is unsafe to use since multiple "
                    "concurrent queries or sources using the same group id will interfere with "
                    "each other as they are part of the same consumer group.")
    if _has(options, "kafka.auto.offset.reset"):
        raise IllegalArgumentException(
            "Kafka option 'auto.offset.reset' is not supported.\nInstead set the source option "
            "'startingoffsets' to 'earliest' or 'latest'\nto specify where to start. Structured "
            "Streaming manages which offsets are consumed\ninternally, rather than relying on the "
            "kafkaConsumer to do it. This will ensure that no\ndata is missed when new "
            "topics/partitions are dynamically subscribed. Note that\n'startingoffsets' only "
            "applies when a new Streaming query is started, and\nthat resuming will always pick "
            "up from where the query left off. See the docs for more\ndetails.")
    for what in ("key", "value"):
        if _has(options, f"kafka.{what}.deserializer"):
            raise IllegalArgumentException(
                f"Kafka option '{what}.deserializer' is not supported as {what}s are deserialized "
                "as byte arrays with ByteArrayDeserializer. Use DataFrame operations to "
                f"explicitly deserialize the {what}s.")
    for config in ("enable.auto.commit", "interceptor.classes"):
        if _has(options, f"kafka.{config}"):
            raise IllegalArgumentException(f"Kafka option '{config}' is not supported")
    if not _has(options, "kafka.bootstrap.servers"):
        raise IllegalArgumentException(
            "Option 'kafka.bootstrap.servers' must be specified for configuring Kafka consumer")
    if _has(options, "commitOffsetsToGroup") and not str(options["commitOffsetsToGroup"]).strip():
        raise IllegalArgumentException(
            "Option 'commitOffsetsToGroup' is empty: give the Kafka consumer group id that each "
            "committed batch's end offsets are committed to (for lag tools), or leave it out.")
    if _has(options, "minOffsetsPerTrigger") and _has(options, "maxOffsetsPerTrigger"):
        low, high = _int(options, "minOffsetsPerTrigger"), _int(options, "maxOffsetsPerTrigger")
        if low > high:
            raise IllegalArgumentException(
                f"The value of minOffsetPerTrigger({low}) is higher than the "
                f"maxOffsetsPerTrigger({high}).")
    strategy = options.get("startingOffsetsByTimestampStrategy", "error").lower()
    if strategy not in ("error", "latest"):
        raise IllegalArgumentException(
            f"Invalid value '{strategy}' for option 'startingOffsetsByTimestampStrategy': "
            "use 'error' or 'latest'.")
    starting_limit(options)          # parse errors now, not at start
    check_client_settings(client_params(options), "consumer")


def _int(options: CaseInsensitiveOptions, key: str) -> int:
    text = str(options[key]).strip()
    try:
        return int(text)
    except ValueError:
        raise IllegalArgumentException(
            f"Invalid value '{text}' for option '{key}': it must be an integer.") from None
