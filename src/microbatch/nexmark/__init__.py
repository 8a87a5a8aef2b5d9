"""Nexmark, the streaming field's benchmark, as users run it on either engine: its queries as
DataFrame code (``queries``) and its events written to files for any engine (``files``). The
events themselves come from the ``nexmark`` source (``microbatch.sources.nexmark``)."""
