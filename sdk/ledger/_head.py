"""How far a ledger has come, kept where a loss can be seen.

Each of a ledger's two hash chains (records, evidence) has its head — the
last row's seq (or eid) and row hash — recorded twice:

* in ``meta`` (keys ``head`` and ``evidence_head``), by the transaction that
  appends the rows. Rows deleted from the end behind SQLite's back leave it
  naming a row that is gone;
* in a side file beside the ledger (``<ledger>-head``), written after each
  commit. A ``-wal`` lost before it was checkpointed takes its commits, and
  the ``meta`` head they wrote, with it; not this file.

Both are lower bounds, never ahead of what was committed: the ``meta`` head
commits with its rows, and the side file is written after the COMMIT
returns. So a head the ledger does not reach, or reaches with another row, is
a loss or a rewrite, never a race; a head that lags (another process's write
landing after a later one, or a capseal without heads appending) only checks
less. A side file whose ledger id is not the ledger's (left by a ledger that
was deleted and made anew at that path) is not read.

What no head here shows: rows deleted together with a rewrite of both heads
(or with the side file), or a chain rebuilt from some row on. Only a head kept
out of the writer's reach (a signed checkpoint, a transparency receipt) shows
those.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Sequence
from typing import Any

from ..canonical import is_hex64
from .storage import Head

__all__ = ["SUFFIX", "SideFile", "meta_heads", "problems_before_write", "ledger_id", "side_heads", "row_hash_at", "shortfall"]

#: the side file's name: the ledger's, with this added
SUFFIX = "-head"
_META_KEY = {"records": "head", "evidence": "evidence_head"}
_TABLE = {"records": ("records", "seq"), "evidence": ("evidence", "eid")}
_SLOT = 256  # bytes per chain in the side file: records at 0, evidence at _SLOT
_OFFSET = {"records": 0, "evidence": _SLOT}
_SIDE = re.compile(r"capseal-head/1 (records|evidence) ([0-9a-f]{32}) ([0-9]{1,19}) ([0-9a-f]{64}) ([0-9a-f]{16}) *\n")
_META = re.compile(r"([0-9]{1,19}) ([0-9a-f]{64})")

Query = Callable[[str, tuple[Any, ...]], Sequence[Any]]


def _what(kind: str) -> str:
    return "seq" if kind == "records" else "evidence"


def ledger_id(query: Query, *, create: bool = False) -> str | None:
    """The ledger's id (32 hex digits, made when it was created).

    Args:
        query: runs SQL on the ledger's connection.
        create: make a missing id (inside a write transaction).

    Returns:
        The id, or None for a ledger made before ledgers had one (unless made now).
    """
    rows = query("SELECT value FROM meta WHERE key='ledger_id'", ())
    if rows and type(rows[0][0]) is str:
        return str(rows[0][0])
    if not create:
        return None
    new = os.urandom(16).hex()
    query("INSERT OR REPLACE INTO meta(key, value) VALUES ('ledger_id', ?)", (new,))
    return new


def meta_heads(query: Query) -> tuple[list[Head], list[str]]:
    """The heads recorded in ``meta``.

    Args:
        query: runs SQL on the ledger's connection.

    Returns:
        The heads, and a description of each one that is damaged (not
        ``<position> <row hash>``).
    """
    heads: list[Head] = []
    damaged: list[str] = []
    for kind, key in _META_KEY.items():
        rows = query("SELECT value FROM meta WHERE key=?", (key,))
        if not rows:
            continue
        value = rows[0][0]
        match = _META.fullmatch(value) if type(value) is str else None
        if match is None:
            damaged.append(f"the meta head of the {kind} chain is damaged ({str(value)[:80]!r})")
            continue
        heads.append(Head(kind, int(match[1]), match[2], "its meta head"))
    return heads, damaged


def _slot(kind: str, ident: str, position: int, row_hash: str) -> bytes:
    text = f"capseal-head/1 {kind} {ident} {position} {row_hash}"
    text += " " + hashlib.sha256(text.encode()).hexdigest()[:16]  # a torn write reads as unreadable, not as a head
    return text.encode().ljust(_SLOT - 1) + b"\n"


def side_heads(path: str) -> tuple[list[tuple[str, Head]], list[str]]:
    """The heads in the side file of the ledger at ``path``.

    Read it before the transaction the heads are checked in begins (or while
    holding the write lock): it is written after each commit, so it then
    names nothing that transaction cannot see.

    Args:
        path: the ledger file's real path.

    Returns:
        Each head with the ledger id it was written for (only those of the
        ledger's own id count), and a description of each slot that is
        unreadable (torn, or edited); nothing for a missing file.
    """
    side = path + SUFFIX
    try:
        with open(side, "rb") as fh:
            data = fh.read(2 * _SLOT)
    except OSError:
        return [], []
    heads: list[tuple[str, Head]] = []
    problems: list[str] = []
    name = os.path.basename(side)
    for kind, offset in _OFFSET.items():
        raw = data[offset : offset + _SLOT]
        if not raw.strip(b"\x00 "):
            continue  # never written
        match = _SIDE.fullmatch(raw.decode("ascii", "replace"))
        if match is None or match[1] != kind or _slot(kind, match[2], int(match[3]), match[4]) != raw:
            problems.append(f"the {kind} head in {name} is unreadable (torn or edited)")
            continue
        heads.append((match[2], Head(kind, int(match[3]), match[4], f"its head file {name}")))
    return heads, problems


class SideFile:
    """The side file as one Ledger writes it: opened on the first write, each
    chain's slot overwritten in place after each commit. Best effort: a file
    that cannot be opened or written (a directory gone read-only, a symlink
    in its place) is given up on, and never fails an append (the rows are
    durable already); the ``meta`` head still checks deletions."""

    def __init__(self, ledger_path: str) -> None:
        self.path = ledger_path + SUFFIX
        self._ledger_path = ledger_path
        self._fd: int | None = None
        self._given_up = False

    def write(self, kind: str, ident: str | None, position: int, row_hash: str) -> None:
        if self._given_up or ident is None:
            return
        try:
            if self._fd is None:
                mode = os.stat(self._ledger_path).st_mode & 0o666  # readable by whoever may read the ledger
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, mode)
            os.pwrite(self._fd, _slot(kind, ident, position, row_hash), _OFFSET[kind])
        except OSError:
            self._given_up = True
            self.close()

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass


def row_hash_at(query: Query, kind: str, position: int) -> Any:
    """The stored row hash of a chain's row.

    Args:
        query: runs SQL on the ledger's connection.
        kind: "records" or "evidence".
        position: the row's seq or eid.

    Returns:
        The stored value, or None when there is no such row.
    """
    table, key = _TABLE[kind]
    rows = query(f"SELECT row_hash FROM {table} WHERE {key}=?", (position,))
    return rows[0][0] if rows else None


def shortfall(head: Head, last: int, hash_at: Callable[[int], Any]) -> tuple[str, str] | None:
    """How a chain falls short of a head it recorded.

    Args:
        head: the recorded head.
        last: the position of the chain's last row (0: none).
        hash_at: the stored row hash at a position (None: no such row).

    Returns:
        ``("missing", why)`` when rows are gone from its end, ``("rewritten",
        why)`` when the row at the head is another one; None when it reaches
        the head.
    """
    what = _what(head.kind)
    if last < head.position:
        ends = f"ends at {what} {last}" if last else "holds no rows"
        cause = "deleted, or the file cut short"
        if head.source.startswith("its head file"):  # the meta head went with a lost -wal; this file did not
            cause = "deleted, the file cut short, or its -wal lost before it was checkpointed"
        return "missing", (f"the {head.kind} chain {ends}, but {head.source} recorded {what} {head.position}: "
                           f"rows were lost from its end ({cause})")
    if hash_at(head.position) != head.row_hash:
        return "rewritten", (f"{what} {head.position} is not the row {head.source} recorded there: "
                             "the chain was rewritten from that row on")
    return None


def problems_before_write(query: Query, path: str, ident: str | None, kind: str, last: tuple[int, Any]) -> list[str]:
    """Why a chain must not be appended to. Call it inside the write
    transaction, holding the write lock: the side file then names no commit
    the transaction cannot see.

    Args:
        query: runs SQL on the writing connection.
        path: the ledger file's real path (its side file is beside it).
        ident: the ledger's id.
        kind: "records" or "evidence".
        last: the chain's last row, (position, row hash).

    Returns:
        The reasons: a damaged last row hash, a damaged ``meta`` head, a head
        (in ``meta`` or the side file) the chain falls short of. An unreadable
        side file slot is none (the write overwrites it).
    """
    problems: list[str] = []
    if not is_hex64(last[1]):
        problems.append(f"the last row's row_hash is damaged ({str(last[1])[:70]!r})")
    heads, damaged = meta_heads(query)
    problems += damaged
    heads += [head for owner, head in side_heads(path)[0] if owner == ident]
    for head in heads:
        if head.kind == kind:
            found = shortfall(head, last[0], lambda n: row_hash_at(query, kind, n))
            if found is not None:
                problems.append(found[1])
    return problems
