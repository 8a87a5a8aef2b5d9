"""Break each write of the batch protocol; a restart must lose nothing and duplicate nothing."""
from __future__ import annotations

import pytest

from microbatch import MemoryStream
from microbatch.checkpoint.fs import FailingFileSystem, InjectedFailure
from microbatch.sinks.memory import MemorySink


@pytest.mark.parametrize("fail_path", ["offsets/1", "commits/1", "offsets/2", "commits/2"])
def test_restart_after_a_failed_log_write_is_exactly_once(ss, tmp_path, fail_path):
    ms = MemoryStream(ss, "v INT")
    sink = MemorySink(ss.spark, ms.schema, "append")  # idempotent by batch id, kept across runs
    failing = FailingFileSystem(lambda op, path: path.endswith("/" + fail_path))

    def start(fs=None):
        writer = ms.toDF().writeStream.sink(sink).option("checkpointLocation", str(tmp_path))
        return (writer.fileSystem(fs) if fs else writer).start()

    query = start(failing)
    added = []
    for batch in ([1, 2], [3], [4, 5]):
        ms.add_data(batch)
        added += batch
        try:
            query.processAllAvailable()
        except Exception as e:  # noqa: BLE001 - the injected failure ends the query
            assert isinstance(e.__cause__, InjectedFailure), e
            break
    else:
        pytest.fail(f"the write of {fail_path} was never attempted")
    assert not query.isActive
    query = start()  # a healthy file system
    ms.add_data([6])
    query.processAllAvailable()
    query.stop()
    assert sorted(r.v for r in sink.all_data()) == added + [6]
    assert sink.batch_ids() == list(range(len(sink.batch_ids())))
