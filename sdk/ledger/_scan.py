"""Reading a ledger table on past damage, for those who must see all of it.

A verifier has to report every row it can still read, not stop at the first
page SQLite cannot read (a bit flip, a file cut short) or an undecodable
value. :func:`rows` reads in batches while they read; through a batch that
does not, one row at a time up to the damage; then it probes past the damage
(doubling, then halving the distance: one B-tree descent each, never a scan)
for the first key from which reading works again, notes the stretch it
skipped, and goes on from there.

:func:`pages` is the plain form, for either engine: a keyset query read page
by page, its errors left to the caller.

Everything goes through the ledger's ``query`` (its lock, its snapshot, its
busy handling): a lock held too long is LedgerBusyError, never taken for
damage.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["rows", "pages", "FIRST_SEQ", "FIRST_MEMBER", "seq_key", "member_key"]

Query = Callable[[str, tuple[Any, ...]], list[Any]]


def rows(query: Query, sql: str, batch: int, damaged: list[str] | None, what: str) -> Iterator[Any]:
    """The rows of a keyed query, in batches.

    Args:
        query: the ledger's query function.
        sql: a SELECT whose first column is the key, ``WHERE key > ?``, in
            key order, ``LIMIT ?``.
        batch: rows per query.
        damaged: None to raise SQLite's errors; or a list, to skip each
            stretch of rows that cannot be read and describe it there.
        what: the key's name in those descriptions ("seq", "evidence").

    Returns:
        An iterator of the rows read, in key order.

    Raises:
        sqlite3.DatabaseError: without ``damaged``, a page SQLite cannot read.
    """
    last = 0
    while True:
        if damaged is None:
            got, error = query(sql, (last, batch)), None
        else:
            got, error = _read_up_to_damage(query, sql, last, batch)
        yield from got
        if got:
            last = got[-1][0]
        if error is None:
            if len(got) < batch:
                return
            continue
        assert damaged is not None
        resume, found = _past_damage(query, sql, last)
        if resume is None or found is None:
            damaged.append(f"{what} {last}: the rows after it cannot be read ({error})")
            return
        damaged.append(f"{what} {last}: the rows after it cannot be read ({error}); read on from {what} {found}")
        last = resume


#: the key before every ``seq`` (records) and every ``(record_seq, eid)`` (evidence members)
FIRST_SEQ = (-(1 << 62),)
FIRST_MEMBER = (-(1 << 62), -(1 << 62))


def seq_key(row: Any) -> tuple[Any, ...]:
    """The key of a row whose first column is ``seq``."""
    return (row[0],)


def member_key(row: Any) -> tuple[Any, ...]:
    """The key of an evidence-members row: ``(record_seq, eid)``."""
    return (row[0], row[1])


def pages(query: Query, sql: str, batch: int, start: tuple[Any, ...],
          key: Callable[[Any], tuple[Any, ...]]) -> Iterator[Any]:
    """The rows of a keyset query, one page of ``batch`` rows at a time.

    Args:
        query: the ledger's query function.
        sql: a SELECT in key order whose parameters are the last key read
            (its columns, in order) and then the page size.
        batch: rows per page.
        start: the key before the first row.
        key: the key of a row.

    Returns:
        An iterator of the rows, in key order.
    """
    last = start
    while True:
        got = query(sql, (*last, batch))
        yield from got
        if len(got) < batch:
            return
        last = key(got[-1])


def _read_one(query: Query, sql: str, after: int) -> tuple[Any, str | None]:
    """The first row keyed ``> after`` (None: none), or None and why it cannot be read."""
    try:
        got = query(sql, (after, 1))
    except sqlite3.DatabaseError as exc:  # a lock is LedgerBusyError by now: never taken for damage
        return None, str(exc)[:200]
    if got and got[0][0] <= after:  # a damaged page can give rows out of order (rowid 0 from zeroes)
        return None, "rows out of order (a damaged page)"
    return (got[0] if got else None), None


def _read_up_to_damage(query: Query, sql: str, last: int, batch: int) -> tuple[list[Any], str | None]:
    """Up to ``batch`` rows keyed ``> last``, stopping before the first one
    SQLite cannot read (then its error, else None)."""
    try:
        got = query(sql, (last, batch))
        if all(b[0] > a[0] for a, b in zip([(last,), *got], got)):
            return got, None
    except sqlite3.DatabaseError:
        pass
    got = []
    while len(got) < batch:
        row, error = _read_one(query, sql, got[-1][0] if got else last)
        if error is not None:
            return got, error
        if row is None:
            break
        got.append(row)
    return got, None


def _past_damage(query: Query, sql: str, last: int) -> tuple[int | None, int | None]:
    """After a read error past key ``last``: the smallest ``resume`` found from
    which reading rows keyed ``> resume`` works, and the first key there
    (None: none after it); ``(None, None)`` when there is no such point."""
    def probe(after: int) -> tuple[bool, int | None]:
        row, error = _read_one(query, sql, after)
        return error is None, (None if row is None else row[0])

    lo, hi = 0, 1
    ok, key = probe(last + hi)
    while not ok:
        if hi >= 1 << 62:
            return None, None
        lo, hi = hi, hi * 2
        ok, key = probe(last + hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        ok, found = probe(last + mid)
        if ok:
            hi, key = mid, found
        else:
            lo = mid
    return last + hi, key
