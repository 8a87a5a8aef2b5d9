"""The Kafka source's driver-side client (Spark's KafkaOffsetReader): the
topic-partitions the strategy (``subscribe``, ``subscribePattern``, ``assign``) names and
their earliest, latest or by-timestamp offsets, asked of the brokers with retries."""
from __future__ import annotations

import logging
import re
import time

from microbatch.errors import IllegalArgumentException
from microbatch.kafka.client import _new_consumer, client_params
from microbatch.kafka.offsets import _partitions_text, assigned_partitions
from microbatch.util import CaseInsensitiveOptions

log = logging.getLogger(__name__)


class KafkaOffsetReader:
    """The driver's view of the topics: partitions the strategy names and their offsets
    (Spark's KafkaOffsetReader). Each call retries ``fetchOffset.numRetries`` times,
    ``fetchOffset.retryIntervalMs`` apart, then fails naming the servers and the cause.

    ``consumer_factory`` builds the librdkafka consumer; tests replace it at this
    boundary where the brokers here answer wrongly (timestamp lookups)."""

    consumer_factory = staticmethod(_new_consumer)

    def __init__(self, options: CaseInsensitiveOptions, group_id: str):
        self.params = client_params(options)
        self.bootstrap = self.params.get("bootstrap.servers", "")
        self.num_retries = options.get_int("fetchOffset.numRetries", 3)
        self.retry_interval_ms = options.get_int("fetchOffset.retryIntervalMs", 1000)
        self.timeout_s = max(1.0, options.get_int("kafkaConsumer.pollTimeoutMs", 10_000) / 1000)
        value = options.get("subscribePattern") if "subscribePattern" in options else None
        self.pattern = re.compile(value.strip()) if value is not None else None
        self.topics = ([t.strip() for t in options["subscribe"].split(",") if t.strip()]
                       if "subscribe" in options else None)
        self.assigned = assigned_partitions(options["assign"]) if "assign" in options else None
        config = {k: v for k, v in self.params.items() if k != "group.id"}
        config.update({"group.id": self.params.get("group.id", group_id),
                       "enable.auto.commit": False, "enable.partition.eof": False})
        self._config = config
        self._consumer = None
        self._admin = None

    @property
    def consumer(self):
        if self._consumer is None:
            self._consumer = self.consumer_factory(dict(self._config))
        return self._consumer

    def close(self) -> None:
        self._admin = None
        if self._consumer is not None:
            try:
                self._consumer.close()
            finally:
                self._consumer = None

    def _retrying(self, what: str, call):
        attempt = 0
        while True:
            try:
                return call()
            except Exception as e:  # librdkafka's KafkaException and timeouts
                attempt += 1
                if attempt > self.num_retries:
                    raise KafkaUnavailable(
                        f"Failed to {what} from Kafka at {self.bootstrap} after {attempt} "
                        f"attempts ({e}). Check that the brokers are up and reachable; the query "
                        "can be restarted from its checkpoint once they are.") from e
                log.warning("Error while trying to %s (attempt %d of %d), retrying in %d ms: %s",
                            what, attempt, self.num_retries + 1, self.retry_interval_ms, e)
                self.close()
                time.sleep(self.retry_interval_ms / 1000)

    def partitions(self) -> list[tuple[str, int]]:
        """The topic-partitions the strategy names now."""
        if self.assigned is not None:
            return list(self.assigned)

        def fetch():
            metadata = self.consumer.list_topics(timeout=self.timeout_s)
            found = []
            for name, topic in metadata.topics.items():
                if topic.error is not None:
                    continue
                if self.topics is not None and name not in self.topics:
                    continue
                if self.pattern is not None and (name.startswith("__") or not self.pattern.fullmatch(name)):
                    continue
                found += [(name, p) for p in topic.partitions]
            return sorted(found)
        return self._retrying("fetch topic metadata", fetch)

    def _list_offsets(self, tps, which: str) -> dict[tuple[str, int], int]:
        """Earliest or latest offsets of ``tps``: one ListOffsets request for all of them
        (the admin client), not a round trip per partition."""
        from confluent_kafka import TopicPartition as KTP  # noqa: N814 - not offsets.TopicPartition (a tuple)
        from confluent_kafka.admin import AdminClient, OffsetSpec
        if not tps:
            return {}
        spec = OffsetSpec.earliest() if which == "earliest" else OffsetSpec.latest()

        def fetch():
            if self._admin is None:
                self._admin = AdminClient({k: v for k, v in self._config.items()
                                           if k not in ("group.id", "enable.auto.commit",
                                                        "enable.partition.eof")})
            futures = self._admin.list_offsets({KTP(t, p): spec for t, p in tps},
                                               request_timeout=self.timeout_s)
            found = {(tp.topic, tp.partition): f.result().offset for tp, f in futures.items()}
            invalid = sorted(tp for tp, offset in found.items() if offset is None or offset < 0)
            if invalid:
                # a broker that went away under the request: librdkafka answers -1001
                # (OFFSET_INVALID) with no error; asked again, as Spark's reader asks again
                # for offsets it finds wrong (fetchOffset.numRetries)
                raise RuntimeError(f"the brokers answered no {which} offset for "
                                   f"{_partitions_text(invalid)}")
            return found
        return self._retrying("fetch offsets", fetch)

    def latest(self, tps=None, known: dict | None = None) -> dict[tuple[str, int], int]:
        """The latest offsets; with ``known`` (offsets already read to), a latest offset
        below its known one is fetched again, ``fetchOffset.numRetries`` times
        ``fetchOffset.retryIntervalMs`` apart, as Spark's ``fetchLatestOffsets`` does (a
        broker that just restarted may answer an older offset); what it still answers
        then is the source's to judge (data loss)."""
        tps = self.partitions() if tps is None else tps
        found = self._list_offsets(tps, "latest")
        for attempt in range(self.num_retries):
            behind = sorted(tp for tp, offset in found.items() if known and offset < known.get(tp, offset))
            if not behind:
                break
            log.warning("Latest offsets of %s are below the offsets already read (attempt %d of %d), "
                        "fetching them again in %d ms", _partitions_text(behind), attempt + 1,
                        self.num_retries, self.retry_interval_ms)
            time.sleep(self.retry_interval_ms / 1000)
            found = self._list_offsets(tps, "latest")
        return found

    def earliest(self, tps) -> dict[tuple[str, int], int]:
        return self._list_offsets(tps, "earliest")

    def for_times(self, times: dict[tuple[str, int], int], strategy: str) -> dict[tuple[str, int], int]:
        """The first offset at or after each timestamp; none: error or latest (``strategy``)."""
        from confluent_kafka import TopicPartition as KTP  # noqa: N814 - not offsets.TopicPartition (a tuple)

        def fetch():
            answer = self.consumer.offsets_for_times(
                [KTP(t, p, int(ms)) for (t, p), ms in sorted(times.items())], timeout=self.timeout_s)
            return {(a.topic, a.partition): a.offset for a in answer}
        found = self._retrying("fetch offsets by timestamp", fetch)
        missing = [tp for tp, offset in found.items() if offset is None or offset < 0]
        if missing and strategy == "latest":
            found.update(self.latest(missing))
        elif missing:
            tp = sorted(missing)[0]
            raise IllegalArgumentException(
                f"No offset matched from request of topic-partition {tp[0]}-{tp[1]} and timestamp "
                f"{times[tp]}. Set the source option 'startingOffsetsByTimestampStrategy' to "
                "'latest' to start such partitions at their latest offset.")
        return found


class KafkaUnavailable(RuntimeError):
    """The brokers did not answer within the retries."""
