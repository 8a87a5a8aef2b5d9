"""What the Kafka source and sink share: Spark's Kafka columns' header type and the
client settings (``kafka.*`` options) as librdkafka takes them, never logged; and the
librdkafka consumer the source's driver and tasks make."""
from __future__ import annotations

import re

from pyspark.sql.types import ArrayType, BinaryType, StringType, StructField, StructType

from microbatch.errors import IllegalArgumentException
from microbatch.util import CaseInsensitiveOptions


HEADERS_TYPE = ArrayType(StructType([StructField("key", StringType(), True),
                                     StructField("value", BinaryType(), True)]), True)


_JAAS_SETTING = re.compile(r'(\w+)\s*=\s*"([^"]*)"')


#: librdkafka settings microbatch's clients use unless a ``kafka.*`` option sets them.
#: ``reconnect.backoff.ms`` (librdkafka: 100): a new client connects to the bootstrap
#: server, learns the brokers, drops the bootstrap connection and may then connect to a
#: learned broker only after half this backoff, so each new client's first request
#: waited about 50 ms (every query start, driver offset lookup and source task). Spark's
#: Java client waits 50 ms before a reconnect; failed reconnects still back off
#: exponentially up to ``reconnect.backoff.max.ms``.
CLIENT_DEFAULTS = {"reconnect.backoff.ms": "10"}


def client_params(options: CaseInsensitiveOptions) -> dict[str, str]:
    """The ``kafka.*`` options, without the prefix, for librdkafka (with
    ``CLIENT_DEFAULTS`` where they do not set those). Java's
    ``sasl.jaas.config`` (Plain or SCRAM login module) becomes librdkafka's
    ``sasl.username``/``sasl.password``, so a ported job's options work as they are."""
    params = {k[len("kafka."):]: str(v) for k, v in options.items() if k.lower().startswith("kafka.")}
    for key, value in CLIENT_DEFAULTS.items():
        if not any(k.lower() == key for k in params):
            params[key] = value
    jaas = params.pop("sasl.jaas.config", None)
    if jaas is not None:
        settings = dict(_JAAS_SETTING.findall(jaas))
        if "username" not in settings or "password" not in settings:
            raise IllegalArgumentException(
                "Kafka option 'kafka.sasl.jaas.config' has no username=\"...\" and "
                "password=\"...\" (only the Plain and SCRAM login modules map to this "
                "client); set 'kafka.sasl.username' and 'kafka.sasl.password' instead.")
        params.setdefault("sasl.username", settings["username"])
        params.setdefault("sasl.password", settings["password"])
    return params


def _new_consumer(config: dict):
    from confluent_kafka import Consumer
    return Consumer(config)


_SECRET_KEY = re.compile(r"(?i)secret|password|token|access[.]?key|credential")


def check_client_settings(params: dict[str, str], role: str) -> None:
    """Refuse ``kafka.*`` settings librdkafka does not know, naming them, instead of a
    failure at the first fetch (Java-only settings such as ``ssl.truststore.location``
    have librdkafka equivalents, e.g. ``ssl.ca.location``). Secret values never appear
    in the message."""
    from confluent_kafka import Consumer, KafkaException, Producer
    settings = dict(params, **({"group.id": "microbatch-settings-check"} if role == "consumer" else {}))
    try:
        client = Consumer(settings) if role == "consumer" else Producer(settings)
    except KafkaException as e:
        text = str(e.args[0].str() if e.args and hasattr(e.args[0], "str") else e)
        for key, value in params.items():
            if _SECRET_KEY.search(key) and value:
                text = text.replace(value, "*********(redacted)")
        raise IllegalArgumentException(
            f"The Kafka {role} settings given as 'kafka.*' options were refused by the Kafka "
            f"client (librdkafka): {text.rstrip('.')}. Settings are librdkafka's "
            "(https://github.com/confluentinc/librdkafka/blob/master/CONFIGURATION.md); most "
            "Java client settings have the same name.") from None
    if role == "consumer":
        client.close()
    else:
        client.flush(0)
