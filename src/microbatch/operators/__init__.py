"""The stateful operators of Spark's state-preparation rule, one home each: its planning
step, its state task and its state schema."""
