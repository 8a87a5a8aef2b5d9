"""``java.util.Random``, one generator per array element, in numpy.

Nexmark's reference generator seeds a ``java.util.Random`` with each event's id and
draws that event's fields from it; to give the same events, microbatch replays the same
draws for a whole batch of events at once. The algorithm is Java's, as documented in
``java.util.Random``: a 48-bit linear congruential generator (``setSeed`` scrambles the
seed with the multiplier; ``next(bits)`` takes the high bits; ``nextInt(bound)`` rejects
the values that would bias the modulus)."""
from __future__ import annotations

import numpy as np

_MULTIPLIER = np.uint64(0x5DEECE66D)
_ADDEND = np.uint64(0xB)
_MASK = np.uint64((1 << 48) - 1)


class JavaRandoms:
    """``new java.util.Random(seed)`` for each seed. Each draw advances every generator, or
    only those ``where`` selects (a boolean mask); it returns one value per advanced
    generator, in order."""

    def __init__(self, seeds: np.ndarray):
        self._state = (np.asarray(seeds, dtype=np.int64).astype(np.uint64) ^ _MULTIPLIER) & _MASK

    def __len__(self) -> int:
        return len(self._state)

    def _next(self, bits: int, where: np.ndarray | None = None) -> np.ndarray:
        """``next(bits)`` as Java's signed int."""
        state = self._state if where is None else self._state[where]
        state = (state * _MULTIPLIER + _ADDEND) & _MASK    # (uint64 wraps mod 2^64, then mod 2^48)
        if where is None:
            self._state = state
        else:
            self._state[where] = state
        value = (state >> np.uint64(48 - bits)).astype(np.int64)
        if bits == 32:   # Java's (int) cast
            value = np.where(value >= 1 << 31, value - (1 << 32), value)
        return value

    def next_int(self, bound, where: np.ndarray | None = None) -> np.ndarray:
        """``nextInt(bound)``; ``bound`` a positive int or one per advanced generator."""
        r = self._next(31, where)
        bound = np.broadcast_to(np.asarray(bound, dtype=np.int64), r.shape)
        m = bound - 1
        power_of_two = (bound & m) == 0
        result = np.where(power_of_two, (bound * r) >> 31, 0)
        todo = ~power_of_two
        u = r
        positions = np.flatnonzero(where) if where is not None else None
        while todo.any():
            value = u % bound
            # Java rejects when u - value + m overflows a signed int: draw again
            rejected = todo & (u - value + m >= 1 << 31)
            result = np.where(todo & ~rejected, value, result)
            todo = rejected
            if todo.any():
                again = np.zeros(len(self._state), dtype=bool)
                again[todo.nonzero()[0] if positions is None else positions[todo]] = True
                u = u.copy()
                u[todo] = self._next(31, again)
        return result

    def next_int_unbounded(self, where: np.ndarray | None = None) -> np.ndarray:
        """``nextInt()``: 32 bits, signed."""
        return self._next(32, where)

    def next_ints_unbounded(self, count: int) -> np.ndarray:
        """``count`` calls of ``nextInt()`` on every generator: an (n, count) int32 matrix."""
        out = np.empty((len(self._state), count), dtype=np.uint32)
        state = self._state
        shift = np.uint64(16)
        for k in range(count):
            state = (state * _MULTIPLIER + _ADDEND) & _MASK
            out[:, k] = state >> shift
        self._state = state
        return out.view(np.int32)

    def next_long(self, where: np.ndarray | None = None) -> np.ndarray:
        """``nextLong()``: ``((long) next(32) << 32) + next(32)``, wrapping as Java's long."""
        high = self._next(32, where)
        low = self._next(32, where)
        return (high.astype(np.int64) << np.int64(32)) + low

    def next_double(self, where: np.ndarray | None = None) -> np.ndarray:
        """``nextDouble()``: 53 random bits over 2^53."""
        high = self._next(26, where)
        low = self._next(27, where)
        return ((high << np.int64(27)) + low).astype(np.float64) * (1.0 / (1 << 53))
