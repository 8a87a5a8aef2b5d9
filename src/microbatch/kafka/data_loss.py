"""Records the Kafka source should read that are no longer in Kafka (``failOnDataLoss``):
the error when the option is true (Spark's ``KAFKA_DATA_LOSS``), the instruction a warning
ends with when it is false."""
from __future__ import annotations

from microbatch.errors import AnalysisException

INSTRUCTION_FOR_FAIL_ON_DATA_LOSS_FALSE = (
    "Some data may have been lost because they are not available in Kafka any more; either the "
    "data was aged out by Kafka or the topic may have been deleted before all the data in the "
    "topic was processed. If you want your streaming query to fail on such cases, set the source "
    'option "failOnDataLoss" to "true".')


class KafkaDataLoss(AnalysisException):
    """Spark's ``KAFKA_DATA_LOSS`` (failOnDataLoss true): the message names the topic,
    partition and offsets, and how to carry on."""

    def __init__(self, subclass: str, reason: str):
        super().__init__(
            "Some data may have been lost because they are not "
            "available in Kafka any more; either the data was aged out by Kafka or the topic may "
            "have been deleted before all the data in the topic was processed. If you don't want "
            "your streaming query to fail on such cases, set the source option failOnDataLoss to "
            "false.\nReason: " + reason, "KAFKA_DATA_LOSS." + subclass, {"reason": reason})
