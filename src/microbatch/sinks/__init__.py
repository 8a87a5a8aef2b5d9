"""Streaming sinks, one module each (``microbatch.connectors`` finds them by name)."""
