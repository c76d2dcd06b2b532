"""TPC-C random input generation (clauses 2.1.6, 4.3.2.2, 4.3.2.3, 4.3.2.7).

Everything comes from one ``random.Random(seed)`` per ``TpccRandom``: never the
global generator, never the clock, never Python's salted hash(). The same seed
gives the same sequence in every process and on every Python >= 3.9 (``random()``
and ``randbytes()`` are specified for integer seeds).

Strings are cut from pools of uniformly random characters built in bulk (one
``randbytes`` call per ~64 KiB of characters, with rejection so that every
character of the alphabet is equally likely); consecutive strings take
consecutive, non-overlapping pieces, so they are independent and uniform exactly
as per-character draws would be, at a fraction of the cost.
"""

from __future__ import annotations

import hashlib
import random
import string
from dataclasses import dataclass

# Clause 4.3.2.2: a-strings are alphanumeric, n-strings numeric.
ALPHANUMERIC = string.ascii_letters + string.digits
NUMERIC = string.digits

# Clause 4.3.2.3: C_LAST is the concatenation of the syllables for the three digits
# of a number in [0..999].
SYLLABLES = ("BAR", "OUGHT", "ABLE", "PRI", "PRES", "ESE", "ANTI", "CALLY", "ATION", "EING")
LAST_NAMES = tuple(
    SYLLABLES[n // 100] + SYLLABLES[n // 10 % 10] + SYLLABLES[n % 10] for n in range(1000)
)

ORIGINAL = "ORIGINAL"
ORIGINAL_PERCENT = 10  # clause 4.3.3.1: i_data and s_data contain ORIGINAL in 10% of rows

# NURand A values (clause 2.1.6) and the C_LAST run/load delta rule (clause 2.1.6.1).
A_C_LAST = 255
A_C_ID = 1023
A_OL_I_ID = 8191
C_LAST_DELTA_MIN = 65
C_LAST_DELTA_MAX = 119
C_LAST_DELTA_EXCLUDED = (96, 112)

_POOL_RAW_BYTES = 1 << 16


def derive_seed(seed: int, *parts: object) -> int:
    """A 64-bit seed that depends only on (seed, parts): stable across processes."""
    text = ":".join(["ordo-tpcc", str(seed), *map(str, parts)])
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def _rejection_table(alphabet: str) -> tuple[bytes, bytes]:
    """A bytes.translate table mapping a random byte to a character of ``alphabet``
    uniformly, and the bytes to delete (the remainder that would bias the mapping)."""
    usable = 256 - 256 % len(alphabet)
    table = bytes(ord(alphabet[b % len(alphabet)]) if b < usable else 0 for b in range(256))
    return table, bytes(range(usable, 256))


_ALNUM_TABLE = _rejection_table(ALPHANUMERIC)
_DIGIT_TABLE = _rejection_table(NUMERIC)


class _CharPool:
    """An endless stream of uniform characters from one alphabet, consumed in slices."""

    __slots__ = ("_rng", "_table", "_delete", "_chars", "_pos")

    def __init__(self, rng: random.Random, table: tuple[bytes, bytes]) -> None:
        self._rng = rng
        self._table, self._delete = table
        self._chars = ""
        self._pos = 0

    def take(self, n: int) -> str:
        pos = self._pos
        end = pos + n
        if end > len(self._chars):
            self._refill(n)
            pos, end = 0, n
        self._pos = end
        return self._chars[pos:end]

    def _refill(self, n: int) -> None:
        chars = self._chars[self._pos :]
        while len(chars) < n:
            raw = self._rng.randbytes(max(_POOL_RAW_BYTES, 2 * n))
            chars += raw.translate(self._table, self._delete).decode("ascii")
        self._chars = chars
        self._pos = 0


@dataclass(frozen=True)
class NURandC:
    """The run-time constants C of NURand (clause 2.1.6), one per A value."""

    c_last: int  # A = 255
    c_id: int  # A = 1023
    ol_i_id: int  # A = 8191

    @classmethod
    def for_load(cls, rng: TpccRandom) -> NURandC:
        """Constants for populating the database (C-Load): each uniform in [0..A]."""
        return cls(
            c_last=rng.uniform(0, A_C_LAST),
            c_id=rng.uniform(0, A_C_ID),
            ol_i_id=rng.uniform(0, A_OL_I_ID),
        )

    @classmethod
    def for_run(cls, load: NURandC, rng: TpccRandom) -> NURandC:
        """Constants for the measurement interval (C-Run), per clause 2.1.6.1.

        Only C_LAST is constrained: |C_Run - C_Load| must lie in [65..119] and be
        neither 96 nor 112, so that run-time last names are not the load-time hot
        spots. C-Run is drawn uniformly among the values in [0..255] that satisfy
        it (at least 55 exist for every C-Load). C for C_ID and OL_I_ID is drawn
        afresh, uniform in [0..A]; the spec puts no relation on those.
        """
        candidates = [c for c in range(A_C_LAST + 1) if valid_c_last_run(load.c_last, c)]
        return cls(
            c_last=candidates[rng.uniform(0, len(candidates) - 1)],
            c_id=rng.uniform(0, A_C_ID),
            ol_i_id=rng.uniform(0, A_OL_I_ID),
        )

    def for_a(self, a: int) -> int:
        if a == A_C_LAST:
            return self.c_last
        if a == A_C_ID:
            return self.c_id
        if a == A_OL_I_ID:
            return self.ol_i_id
        raise ValueError(f"NURand A must be {A_C_LAST}, {A_C_ID} or {A_OL_I_ID}, not {a}")


def valid_c_last_run(c_load: int, c_run: int) -> bool:
    """Clause 2.1.6.1: may C_Run be used for C_LAST given C_Load?"""
    delta = abs(c_run - c_load)
    return (
        0 <= c_run <= A_C_LAST
        and C_LAST_DELTA_MIN <= delta <= C_LAST_DELTA_MAX
        and delta not in C_LAST_DELTA_EXCLUDED
    )


class TpccRandom:
    """Seeded TPC-C random values. Without ``c``, NURand constants are drawn for load
    from this generator's own stream (deterministically, before anything else)."""

    def __init__(self, seed: int, c: NURandC | None = None) -> None:
        self._rng = random.Random(seed)
        self._random = self._rng.random
        self._alnum = _CharPool(self._rng, _ALNUM_TABLE)
        self._digits = _CharPool(self._rng, _DIGIT_TABLE)
        self.c = c if c is not None else NURandC.for_load(self)

    def uniform(self, x: int, y: int) -> int:
        """random(x, y) of clause 2.1.5: an integer uniform in [x..y].

        random() < 1 and, for an integer n < 2**53, random() * n rounds to < n,
        so the result never exceeds y; the bias is below 2**-53 * n.
        """
        return x + int(self._random() * (y - x + 1))

    def chance(self, percent: float) -> bool:
        """True with probability percent/100."""
        return self._random() * 100 < percent

    def nurand(self, a: int, x: int, y: int) -> int:
        """NURand(A, x, y) of clause 2.1.6, with this generator's constant C for A."""
        c = self.c.for_a(a)
        return ((self.uniform(0, a) | self.uniform(x, y)) + c) % (y - x + 1) + x

    def a_string(self, x: int, y: int) -> str:
        """Random a-string [x..y] (clause 4.3.2.2): alphanumeric, length uniform in [x..y]."""
        return self._alnum.take(x if x == y else self.uniform(x, y))

    def n_string(self, x: int, y: int) -> str:
        """Random n-string [x..y] (clause 4.3.2.2): digits, length uniform in [x..y]."""
        return self._digits.take(x if x == y else self.uniform(x, y))

    def zip(self) -> str:
        """Clause 4.3.2.7: four random digits followed by the constant "11111"."""
        return self._digits.take(4) + "11111"

    def data_with_original(self, x: int, y: int) -> str:
        """i_data / s_data (clause 4.3.3.1): a-string [x..y]; in 10% of rows "ORIGINAL"
        overwrites it at a random position (length unchanged)."""
        data = self.a_string(x, y)
        if self.chance(ORIGINAL_PERCENT):
            pos = self.uniform(0, len(data) - len(ORIGINAL))
            data = data[:pos] + ORIGINAL + data[pos + len(ORIGINAL) :]
        return data

    def random_last_name(self) -> str:
        """C_LAST from NURand(255, 0, 999) (clauses 2.1.6 and 4.3.2.3)."""
        return LAST_NAMES[self.nurand(A_C_LAST, 0, 999)]

    @staticmethod
    def last_name(num: int) -> str:
        return last_name(num)

    def permutation(self, n: int) -> list[int]:
        """A random permutation of [1..n] (clause 4.3.3.1, O_C_ID)."""
        values = list(range(1, n + 1))
        self._rng.shuffle(values)
        return values


def last_name(num: int) -> str:
    """C_LAST for a number in [0..999] (clause 4.3.2.3), e.g. 371 -> PRICALLYOUGHT."""
    if not 0 <= num <= 999:
        raise ValueError(f"last name number must be in [0..999], not {num}")
    return LAST_NAMES[num]
