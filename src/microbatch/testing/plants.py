"""The planted bugs the differential fuzzer must find (``microbatch.planted_bugs``)."""
from microbatch.planted_bugs import CONF, PLANTS

__all__ = ["CONF", "PLANTS"]
