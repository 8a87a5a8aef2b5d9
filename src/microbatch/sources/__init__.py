"""Streaming sources, one module each (``microbatch.connectors`` finds them by name); the
parts of a larger source are modules beside it, named for what they hold."""
