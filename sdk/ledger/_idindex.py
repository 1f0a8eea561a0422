"""A set of record ids, with a seq and a few flags each, in 16 bytes an id.

A check that walks a ledger of a million records must know which ids it has
seen (a record stored twice, the record an evidence row names, a chain
parent) without keeping a million strings: 16 bytes an id here (a 64-bit
keyed fingerprint and a 64-bit value), against some 150 in a dict of str.

The fingerprints are keyed with a secret drawn for each index, so nobody
who writes ids into a ledger can make two of them collide on purpose; by
chance, two of a million ids share one with a probability below one in ten
million (then an id would be taken for one seen before).
"""

from __future__ import annotations

import hashlib
import os
from array import array

__all__ = ["IdIndex"]

_EMPTY = 0
#: the most of its slots a table fills before it grows (linear probing stays short up to here)
_FILL = 0.7
_MAX_SEQ = (1 << 60) - 1


class IdIndex:
    """Record ids -> (seq, flags), in open addressing over two arrays.

    Args:
        expected: how many ids are likely (the table is sized for them; it grows past them).
    """

    __slots__ = ("_key", "_keys", "_values", "_size", "_used")

    def __init__(self, expected: int = 1024) -> None:
        self._key = os.urandom(16)
        # as many slots as the ids need at the fill allowed, not the next power of two (up to twice that)
        size = max(1024, int(expected / _FILL) + 1)
        self._keys = array("q", bytes(8 * size))
        self._values = array("q", bytes(8 * size))
        self._size = size
        self._used = 0

    def __len__(self) -> int:
        return self._used

    def _fingerprint(self, record_id: str) -> int:
        digest = hashlib.blake2b(record_id.encode("utf-8", "surrogatepass"), digest_size=8, key=self._key).digest()
        return int.from_bytes(digest, "little", signed=True) or 1

    def _slot(self, fp: int) -> int:
        keys, size = self._keys, self._size
        i = fp % size
        while True:
            k = keys[i]
            if k == fp or k == _EMPTY:
                return i
            i += 1
            if i == size:
                i = 0

    def add(self, record_id: str, seq: int, flags: int = 0) -> int | None:
        """Add ``record_id`` at ``seq`` unless it is there.

        Args:
            record_id: the id.
            seq: its row's position (kept for the first time an id is added).
            flags: bits 0-3 to set on it.

        Returns:
            None for a new id; the seq it was first added with, when it was there (flags are OR-ed in).
        """
        fp = self._fingerprint(record_id)
        i = self._slot(fp)
        if self._keys[i] == fp:
            self._values[i] |= flags & 15
            return self._values[i] >> 4
        self._keys[i] = fp
        self._values[i] = (min(max(seq, 0), _MAX_SEQ) << 4) | (flags & 15)
        self._used += 1
        if self._used > self._size * _FILL:
            self._grow()
        return None

    def get(self, record_id: str) -> tuple[int, int] | None:
        """``(seq, flags)`` of ``record_id``, or None when it was never added."""
        fp = self._fingerprint(record_id)
        i = self._slot(fp)
        if self._keys[i] != fp:
            return None
        value = self._values[i]
        return value >> 4, value & 15

    def seq(self, record_id: str) -> int | None:
        """The seq ``record_id`` was first added with, or None."""
        found = self.get(record_id)
        return None if found is None else found[0]

    def has(self, record_id: str, flag: int) -> bool:
        """Whether ``record_id`` was added with ``flag`` set."""
        found = self.get(record_id)
        return found is not None and bool(found[1] & flag)

    def _grow(self) -> None:
        keys, values = self._keys, self._values
        size = 2 * self._size
        self._keys = array("q", bytes(8 * size))
        self._values = array("q", bytes(8 * size))
        self._size = size
        new_keys, new_values = self._keys, self._values
        for k, v in zip(keys, values):
            if k != _EMPTY:
                i = self._slot(k)
                new_keys[i], new_values[i] = k, v
