"""Kafka, in Python on confluent-kafka (librdkafka): Spark's source and sink, which share
their client settings (``client``)."""
