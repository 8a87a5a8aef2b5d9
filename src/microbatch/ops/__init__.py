"""Operating queries: the dashboard, the Prometheus metrics and the checkpoint toolkit.

- ``history``: what the dashboard and the metrics show of a query: its runs, batches and
  failure, from the queries of this process (a listener) or from checkpoints (read-only).
- ``dashboard``: the web page (``microbatch ui``, ``StreamingSession(spark, ui_port=...)``).
- ``metrics``: the Prometheus endpoint, with Spark's streaming metric names.
- ``verify``, ``describe``, ``repartition``, ``rollback``: ``microbatch checkpoint ...``.
"""
