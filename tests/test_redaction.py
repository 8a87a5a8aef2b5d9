"""A secret planted in a query's options appears in no output: not in logs, progress,
listener events, ``explain``, the checkpoint, the sink's files or error messages.

The secret goes where users put secrets: a Kafka SASL/JAAS config (mapped to librdkafka's
password), a Kafka SSL key password, and reader and writer options whose names say
password, secret, token or key (Spark's ``spark.redaction.regex``). The query reads a
real broker into the file sink, then a second query with the same options fails, so its
error message and debug string are checked too.
"""
from __future__ import annotations

import contextlib
import io
import logging
import os

import pytest

from microbatch import StreamingQueryListener

SECRET = "planted-Secr3t-4d1f"
JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required '
        f'username="someone" password="{SECRET}";')


class Recorder(StreamingQueryListener):
    def __init__(self):
        self.texts: list[str] = []

    def onQueryStarted(self, event) -> None:
        self.texts.append(repr(vars(event)) if hasattr(event, "__dict__") else str(event))

    def onQueryProgress(self, event) -> None:
        self.texts.append(event.progress.json)

    def onQueryIdle(self, event) -> None:
        self.texts.append(str(event))

    def onQueryTerminated(self, event) -> None:
        self.texts.append(f"{event.id} {event.runId} {event.exception} {event.errorClassOnException}")


def every_file_text(*roots) -> str:
    texts = []
    for root in roots:
        for directory, _, names in os.walk(root):
            for name in names:
                with open(os.path.join(directory, name), "rb") as f:
                    texts.append(f.read().decode("latin-1"))
    return "\n".join(texts)


def kafka_reader(ss, bootstrap, topic):
    return (ss.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic).option("startingOffsets", "earliest")
            .option("kafka.sasl.jaas.config", JAAS).option("kafka.ssl.key.password", SECRET)
            .option("api.token", SECRET).load())


def test_a_planted_secret_appears_in_no_output(ss, spark, broker, tmp_path, caplog):
    topic = "redaction"
    broker.create_topic(topic, 2)
    broker.produce(topic, [(b"k%d" % i, b"v%d" % i, i % 2) for i in range(20)])
    recorder = Recorder()
    ss.streams.addListener(recorder)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    printed = io.StringIO()
    try:
        with caplog.at_level(logging.DEBUG), contextlib.redirect_stdout(printed):
            query = (kafka_reader(ss, broker.bootstrap, topic).selectExpr("CAST(value AS STRING) AS v")
                     .writeStream.format("parquet").option("path", str(out))
                     .option("checkpointLocation", str(ckpt)).option("secret.key", SECRET)
                     .trigger(availableNow=True).start())
            query.awaitTermination(120)
            assert query.exception() is None, query.exception()
            query.explain(extended=True)
            print(query.lastProgress.json, query.recentProgress, query.status, repr(query))

            def fail(df, batch_id):
                raise ValueError("the user's function failed")
            failing = (kafka_reader(ss, broker.bootstrap, topic).writeStream.foreachBatch(fail)
                       .option("checkpointLocation", str(tmp_path / "ckpt2")).start())
            with pytest.raises(Exception) as failed:
                failing.awaitTermination(120)
            print(str(failed.value), failing.exception(), failing.lastProgress)
        assert ss.streams._wait_for_listeners()
    finally:
        ss.streams.removeListener(recorder)
    assert len(spark.read.parquet(str(out)).collect()) == 20
    assert "the user's function failed" in printed.getvalue()        # the outputs were captured
    assert recorder.texts and caplog.text and every_file_text(ckpt)
    outputs = {"logs": caplog.text, "printed (explain, progress, errors)": printed.getvalue(),
               "listener events": "\n".join(recorder.texts),
               "checkpoint and sink files": every_file_text(ckpt, tmp_path / "ckpt2", out)}
    for where, text in outputs.items():
        assert SECRET not in text, f"the secret is in the {where}"
