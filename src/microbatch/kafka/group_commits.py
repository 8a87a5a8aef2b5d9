"""A query's progress committed to a Kafka consumer group, for the lag tools teams run.

Spark's Kafka source commits nothing to Kafka: a query's position lives in its checkpoint,
and its consumers use group ids of their own (committing to a group was asked for in
SPARK-27549 and never merged). Lag exporters and ``kafka-consumer-groups --describe`` read
a group's committed offsets against the partitions' log end. With the source option
``commitOffsetsToGroup`` set to a group id, each batch's end offsets (the next offset to
read, as Kafka's commits mean) are committed to that group once the batch is in the commit
log, and the last committed batch's again when a run resumes. The group is never read
back: where a query starts and resumes stays the checkpoint's (``startingOffsets`` for a
new one).

Commits run on a thread of their own, off the batch's path: the newest offsets replace
any not yet sent; one that fails (the broker away, no ACL to commit) is logged and the next
batch's commit tries again; stopping the query sends the last one still waiting.
"""
from __future__ import annotations

import logging
import threading

from confluent_kafka import Consumer, KafkaException, TopicPartition

log = logging.getLogger(__name__)

#: librdkafka settings of the consumer that commits: it never reads
_COMMITTER_SETTINGS = {"enable.auto.commit": False, "enable.auto.offset.store": False}


class GroupOffsetCommitter:
    """Commits offsets (``{(topic, partition): offset}``) to the consumer group ``group``
    with the source's client settings (``params``: bootstrap servers, security)."""

    def __init__(self, params: dict[str, str], group: str):
        self.group = group
        self._config = {k: v for k, v in params.items() if k.lower() != "group.id"}
        self._config.update(_COMMITTER_SETTINGS, **{"group.id": group})
        self._consumer: Consumer | None = None
        self._pending: dict | None = None
        self._sending = False
        self._stopped = False
        self._changed = threading.Condition()
        #: the offsets the group last accepted, and how many commits failed (progress, tests)
        self.committed: dict | None = None
        self.failures = 0
        self._thread = threading.Thread(target=self._run, name=f"kafka-group-commits-{group}", daemon=True)
        self._thread.start()

    def commit(self, offsets: dict[tuple[str, int], int]) -> None:
        """Commit ``offsets`` to the group, soon (they replace any still waiting)."""
        with self._changed:
            if self._stopped:
                return
            self._pending = dict(offsets)
            self._changed.notify_all()

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until every offset given so far was sent (or failed); False on timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: self._pending is None and not self._sending, timeout_s)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Send what waits, then close the consumer."""
        with self._changed:
            self._stopped = True
            self._changed.notify_all()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        try:
            while True:
                with self._changed:
                    self._changed.wait_for(lambda: self._pending is not None or self._stopped)
                    if self._pending is None:
                        return
                    offsets, self._pending, self._sending = self._pending, None, True
                try:
                    self._send(offsets)
                finally:
                    with self._changed:
                        self._sending = False
                        self._changed.notify_all()
        finally:
            if self._consumer is not None:
                self._consumer.close()

    def _send(self, offsets: dict[tuple[str, int], int]) -> None:
        partitions = [TopicPartition(topic, partition, offset) for (topic, partition), offset in sorted(offsets.items())]
        try:
            if self._consumer is None:
                self._consumer = Consumer(self._config)
            answered = self._consumer.commit(offsets=partitions, asynchronous=False) or []
            refused = [tp for tp in answered if tp.error is not None]
            if refused:
                raise KafkaException(refused[0].error)
        except KafkaException as e:
            self.failures += 1
            log.warning("Could not commit the batch's offsets to Kafka consumer group '%s' "
                        "(commitOffsetsToGroup; the query goes on, the next batch commits again): %s",
                        self.group, e)
            return
        self.committed = dict(offsets)
        log.debug("Committed offsets %s to Kafka consumer group '%s'", offsets, self.group)
