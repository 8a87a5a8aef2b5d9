"""PySpark's Python Data Source API as a streaming source and sink."""
