"""The user-facing objects, named as in PySpark's streaming API."""
