"""The Kafka source's offsets: Spark's offsets JSON (``{"topic":{"partition":offset}}``,
as ``offsets/N`` and ``sources/<id>/0`` hold it), the ``assign`` option's partitions, and
where a new query starts (``startingOffsets``, ``startingOffsetsByTimestamp``,
``startingTimestamp``)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from microbatch.errors import IllegalArgumentException
from microbatch.util import CaseInsensitiveOptions

TopicPartition = tuple  # (topic, partition)

EARLIEST, LATEST = -2, -1


def offsets_json(offsets: dict[tuple[str, int], int]) -> dict[str, dict[str, int]]:
    """Spark's KafkaSourceOffset JSON: ``{"topic":{"partition":offset}}``, sorted."""
    out: dict[str, dict[str, int]] = {}
    for (topic, partition) in sorted(offsets):
        out.setdefault(topic, {})[str(partition)] = int(offsets[(topic, partition)])
    return out


def parse_offsets(value: Any, what: str = "offset") -> dict[tuple[str, int], int]:
    """``{"topic":{"0":23}}`` (a dict or its JSON text) to ``{(topic, 0): 23}``."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            value = None
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise IllegalArgumentException(
            f"Expected e.g. {{\"topicA\":{{\"0\":23,\"1\":-1}},\"topicB\":{{\"0\":-2}}}}, got "
            f"{json.dumps(value) if value is not None else 'text that is not JSON'} ({what})")
    try:
        return {(topic, int(p)): int(o) for topic, parts in value.items() for p, o in parts.items()}
    except (TypeError, ValueError):
        raise IllegalArgumentException(
            f"Expected e.g. {{\"topicA\":{{\"0\":23,\"1\":-1}},\"topicB\":{{\"0\":-2}}}}, got "
            f"{json.dumps(value)} ({what})") from None


def assigned_partitions(text: str) -> list[tuple[str, int]]:
    """The ``assign`` option, ``{"topicA":[0,1],"topicB":[2]}`` (Spark's JsonUtils.partitions)."""
    try:
        value = json.loads(text)
        return sorted((topic, int(p)) for topic, parts in value.items() for p in parts)
    except (json.JSONDecodeError, AttributeError, TypeError, ValueError):
        raise IllegalArgumentException(
            f'Expected e.g. {{"topicA":[0,1],"topicB":[0,1]}}, got {text}') from None


def _partitions_text(tps) -> str:
    return ", ".join(f"{t}-{p}" for t, p in sorted(tps))


@dataclass(frozen=True)
class StartingLimit:
    """Where a new query starts: ``kind`` is earliest, latest, offsets, timestamp or
    timestamps (Spark's KafkaOffsetRangeLimit)."""
    kind: str
    offsets: dict | None = None        # offsets: {tp: offset}; timestamps: {tp: ms}
    timestamp: int | None = None
    strategy: str = "error"            # no offset for a timestamp: error or latest


def starting_limit(options: CaseInsensitiveOptions) -> StartingLimit:
    strategy = options.get("startingOffsetsByTimestampStrategy", "error").lower()
    if "startingTimestamp" in options:
        text = str(options["startingTimestamp"]).strip()
        try:
            return StartingLimit("timestamp", timestamp=int(text), strategy=strategy)
        except ValueError:
            raise IllegalArgumentException(f"Expected a single long value, got {text}") from None
    if "startingOffsetsByTimestamp" in options:
        return StartingLimit("timestamps", parse_offsets(options["startingOffsetsByTimestamp"],
                                                         "startingOffsetsByTimestamp"),
                             strategy=strategy)
    text = str(options.get("startingOffsets", "latest")).strip()
    if text.lower() == "earliest":
        return StartingLimit("earliest")
    if text.lower() == "latest":
        return StartingLimit("latest")
    return StartingLimit("offsets", parse_offsets(text, "startingOffsets"))
