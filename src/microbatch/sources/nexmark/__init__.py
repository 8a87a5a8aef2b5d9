"""Nexmark, the streaming benchmark's auction events: the generator and the ``nexmark`` source."""
