"""Testing helpers: a Python port of Spark's StreamTest DSL."""
from microbatch.testing.stream_test import (AddData, AdvanceManualClock, AssertOnQuery,
                                            CheckAnswer, CheckLastBatch, CheckNewAnswer, Execute,
                                            ExpectFailure, StartStream, StopStream, test_stream)

__all__ = ["test_stream", "AddData", "CheckAnswer", "CheckNewAnswer", "CheckLastBatch",
           "StopStream", "StartStream", "AdvanceManualClock", "ExpectFailure", "AssertOnQuery",
           "Execute"]
