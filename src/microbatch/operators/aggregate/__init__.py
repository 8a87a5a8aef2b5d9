"""Streaming aggregation: its planning from Spark's analysis (``spec``), its state task
(``task``) and Spark's HyperLogLog++ (``hll``)."""
