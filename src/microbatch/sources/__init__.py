"""Streaming sources, one module each (``microbatch.connectors`` finds them by name)."""
