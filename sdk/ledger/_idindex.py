"""A set of record ids, with a seq and a few flags each, in 16 bytes an id.

A check that walks a ledger of a million records must know which ids it has
seen (a record stored twice, the record an evidence row names, a chain
parent) without keeping a million strings: 16 bytes an id here (a 64-bit
keyed fingerprint and a 64-bit value), against some 150 in a dict of str.

Past :data:`MEMORY_IDS` ids a table moves to a temporary file, read and
written a probe at a time: the process's memory stays the same whatever the
ledger's size, and the file is the kernel's to cache or write out. A file
that cannot be made (no room, no temporary directory) leaves the table in
memory: the walk goes on, using more memory.

The fingerprints are keyed with a secret drawn for each index, so nobody
who writes ids into a ledger can make two of them collide on purpose; by
chance, two of a million ids share one with a probability below one in ten
million (then an id would be taken for one seen before).
"""

from __future__ import annotations

import hashlib
import os
import struct
import tempfile
from array import array
from collections.abc import Iterator
from typing import Protocol

__all__ = ["IdIndex", "MEMORY_IDS"]

_EMPTY = 0
#: the most of its slots a table fills before it grows (linear probing stays short up to here)
_FILL = 0.7
_MAX_SEQ = (1 << 60) - 1
#: ids a table holds in memory; past them it moves to a file
MEMORY_IDS = 1 << 18
#: slots a file table reads at once when probing (linear probing rarely goes past them)
_PROBE = 8
_PROBE_READ = struct.Struct(f"={2 * _PROBE}q")  # native order, as array("q") reads them
_SLOT = struct.Struct("=qq")
#: a file table needs pread, pwrite and room taken up front (not every system has them)
_FILES = all(hasattr(os, name) for name in ("pread", "pwrite", "posix_fallocate"))


class _Table(Protocol):
    size: int

    def find(self, fp: int) -> tuple[int, int, int]: ...
    def put(self, at: int, fp: int, value: int) -> None: ...
    def items(self) -> Iterator[tuple[int, int]]: ...
    def close(self) -> None: ...


class _Memory:
    """Slots in one array: key then value, 8 bytes each."""

    __slots__ = ("size", "_slots")

    def __init__(self, size: int) -> None:
        self.size = size
        self._slots = array("q", bytes(16 * size))

    def find(self, fp: int) -> tuple[int, int, int]:
        """The slot holding ``fp`` or the empty one it would go in: (slot, its key, its value)."""
        slots, size = self._slots, self.size
        i = fp % size
        while True:
            k = slots[2 * i]
            if k == fp or k == _EMPTY:
                return i, k, slots[2 * i + 1]
            i += 1
            if i == size:
                i = 0

    def put(self, at: int, fp: int, value: int) -> None:
        self._slots[2 * at], self._slots[2 * at + 1] = fp, value

    def items(self) -> Iterator[tuple[int, int]]:
        slots = self._slots
        for j in range(0, 2 * self.size, 2):
            if slots[j] != _EMPTY:
                yield slots[j], slots[j + 1]

    def close(self) -> None:
        self._slots = array("q")


class _File:
    """Slots in an unlinked temporary file, read and written with pread and pwrite.

    Raises:
        OSError: no file could be made with room for the slots.
    """

    __slots__ = ("size", "_file", "_fd")

    def __init__(self, size: int) -> None:
        self.size = size
        self._file = tempfile.TemporaryFile(prefix="capseal-ids-")  # unlinked at once: nothing is left behind
        try:
            self._fd = self._file.fileno()
            os.posix_fallocate(self._fd, 0, 16 * size)  # the room taken now, so no write fails later
        except BaseException:
            self._file.close()
            raise

    def find(self, fp: int) -> tuple[int, int, int]:
        fd, size = self._fd, self.size
        i = fp % size
        while True:
            buf = os.pread(fd, 16 * _PROBE, 16 * i)
            got = _PROBE_READ.unpack(buf) if len(buf) == 16 * _PROBE else struct.unpack(f"={len(buf) // 8}q", buf)
            for j in range(0, len(got), 2):
                k = got[j]
                if k == fp or k == _EMPTY:
                    return i + j // 2, k, got[j + 1]
            i += len(got) // 2
            if i >= size:
                i = 0

    def put(self, at: int, fp: int, value: int) -> None:
        os.pwrite(self._fd, _SLOT.pack(fp, value), 16 * at)

    def items(self) -> Iterator[tuple[int, int]]:
        chunk = 1 << 16  # slots read at once
        for start in range(0, self.size, chunk):
            buf = os.pread(self._fd, 16 * min(chunk, self.size - start), 16 * start)
            got = array("q", buf)
            for j in range(0, len(got), 2):
                if got[j] != _EMPTY:
                    yield got[j], got[j + 1]

    def close(self) -> None:
        self._file.close()


def _table(size: int, *, on_file: bool) -> _Table:
    """Slots for ``size`` ids, empty: in a temporary file when ``on_file``
    and one can be made, else in memory."""
    if on_file and _FILES:
        try:
            return _File(size)
        except OSError:  # no file to be had: memory, then
            pass
    return _Memory(size)


class IdIndex:
    """Record ids -> (seq, flags), in open addressing over a table of slots.

    Args:
        expected: how many ids are likely (the table is sized for them; it grows past them).
        memory_ids: ids held in memory before the table moves to a file (None: :data:`MEMORY_IDS`;
            a table expected to hold more starts in one).
    """

    __slots__ = ("_key", "_table", "_used", "_memory_ids")

    def __init__(self, expected: int = 1024, *, memory_ids: int | None = None) -> None:
        self._key = os.urandom(16)
        self._memory_ids = MEMORY_IDS if memory_ids is None else memory_ids
        self._used = 0
        # as many slots as the ids need at the fill allowed, not the next power of two (up to twice that)
        self._table = _table(max(1024, int(expected / _FILL) + 1), on_file=expected > self._memory_ids)

    def __len__(self) -> int:
        return self._used

    @property
    def on_file(self) -> bool:
        """Whether the table lives in a temporary file (else in memory)."""
        return isinstance(self._table, _File)

    @property
    def slots(self) -> int:
        """The table's slots (it grows when the ids fill :data:`_FILL` of them)."""
        return self._table.size

    def _fingerprint(self, record_id: str) -> int:
        digest = hashlib.blake2b(record_id.encode("utf-8", "surrogatepass"), digest_size=8, key=self._key).digest()
        return int.from_bytes(digest, "little", signed=True) or 1

    def add(self, record_id: str, seq: int, flags: int = 0) -> int | None:
        """Add ``record_id`` at ``seq`` unless it is there.

        Args:
            record_id: the id.
            seq: its row's position (kept for the first time an id is added).
            flags: bits 0-3 to set on it.

        Returns:
            None for a new id; the seq it was first added with, when it was there (flags are OR-ed in).

        Raises:
            OSError: the table's file could not be written.
        """
        fp = self._fingerprint(record_id)
        at, k, value = self._table.find(fp)
        if k == fp:
            if flags & 15 & ~value:
                self._table.put(at, fp, value | (flags & 15))
            return value >> 4
        self._table.put(at, fp, (min(max(seq, 0), _MAX_SEQ) << 4) | (flags & 15))
        self._used += 1
        if self._used > self._table.size * _FILL:
            self._grow()
        return None

    def get(self, record_id: str) -> tuple[int, int] | None:
        """``(seq, flags)`` of ``record_id``, or None when it was never added.

        Raises:
            OSError: the table's file could not be read.
        """
        fp = self._fingerprint(record_id)
        _, k, value = self._table.find(fp)
        if k != fp:
            return None
        return value >> 4, value & 15

    def seq(self, record_id: str) -> int | None:
        """The seq ``record_id`` was first added with, or None."""
        found = self.get(record_id)
        return None if found is None else found[0]

    def has(self, record_id: str, flag: int) -> bool:
        """Whether ``record_id`` was added with ``flag`` set."""
        found = self.get(record_id)
        return found is not None and bool(found[1] & flag)

    def close(self) -> None:
        """Give back the table's file, if it has one (the index is empty after)."""
        old, self._table, self._used = self._table, _Memory(1024), 0
        old.close()

    def _grow(self) -> None:
        old = self._table
        new = _table(2 * old.size, on_file=self._used > self._memory_ids or isinstance(old, _File))
        for fp, value in old.items():
            at, _, _ = new.find(fp)
            new.put(at, fp, value)
        self._table = new
        old.close()
