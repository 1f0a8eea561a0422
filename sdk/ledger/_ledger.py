"""The :class:`Ledger` facade: the durable, append-only capseal ledger.

It does the ledger's work over an engine (:mod:`capseal.ledger.storage`:
SQLite for a file, PostgreSQL for a ``postgresql://`` URL): group commit (:mod:`._commit`, :mod:`._group`), evidence
(:mod:`._evidence`), chain checks (:mod:`._chain`), export and import
(:mod:`._transfer`), fork safety (:mod:`._fork`).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import IO, Any, cast

from ..arguments import count, seconds
from ..arguments import timeout as timeout_arg
from ..errors import InputError, LedgerCorruptError
from . import _chain, _evidence_write, _fork, _transfer
from ._commit import Arrival, GroupCommit, PendingAppend, Stats
from ._evidence import EvidenceEntry, SlotReader
from ._format import LedgerEntry, StoredEntry
from ._group import write_group
from ._idindex import IdIndex
from ._pg_url import DatabaseURL, as_url
from ._reads import LedgerReads
from ._sqlite import SQLiteStorage
from .storage import Storage

__all__ = ["Ledger"]


class Ledger(LedgerReads):
    """An append-only capseal ledger in one SQLite file, or in a PostgreSQL database.

    Thread-safe. Several processes may append to the same file (SQLite's write
    lock serializes them; each transaction reads the chain head under it),
    each through a Ledger it opened itself: one inherited through fork()
    refuses every call (LedgerForkedError). Given a ``postgresql://`` URL
    (the ``postgres`` extra), any number of processes on any number of hosts
    append to one ledger at once, with the same API, rows and hashes. Every
    read below may raise LedgerBusyError, LedgerClosedError or
    LedgerForkedError (and, on PostgreSQL, LedgerUnavailableError).

    Args:
        path: the ledger file (made a ledger if new or empty), or a
            ``postgresql://`` URL (its schema made a ledger if empty; the
            password is never shown: ``path`` is then a :class:`DatabaseURL`).
        readonly: open an existing ledger for reading only.
        synchronous: SQLite's ``synchronous``: FULL (durable on acknowledgement), EXTRA or NORMAL.
        group_window: seconds the committer lets a group of :meth:`submit`
            calls fill before one fsynced commit (an fsync costs far more
            than an insert); :meth:`append` never waits for it.
        group_max: records that end the window early.
        lock_timeout: seconds opening or a commit waits for another
            process's lock on the file before LedgerBusyError (on PostgreSQL
            also the wait for the server).

    Raises:
        InputError: a setting out of range.
        LedgerError: no ledger can be opened at ``path`` (NotALedgerError,
            LedgerFormatError, LedgerCorruptError, LedgerBusyError say why;
            LedgerUnavailableError, LedgerAccessDeniedError for a server).
        MissingExtraError: a ``postgresql://`` URL without psycopg installed.
        LedgerForkedError: this process was forked while the file was in use.
    """

    _lenient_reads = False  # read on past damage: only the audit's read-only reader (AuditLedger) sets it

    def __init__(
        self,
        path: str | os.PathLike[str] | DatabaseURL,
        *,
        readonly: bool = False,
        synchronous: str = "FULL",
        group_window: float = 0.008,
        group_max: int = 256,
        lock_timeout: float = 30.0,
    ) -> None:
        url = as_url(path)
        # typed as the file's path for the many callers of a file ledger; a server ledger's is its
        # DatabaseURL, which has what a message needs of a path (``name`` and ``str()``, redacted), see ``url``
        self.path: Path = cast(Path, url) if url is not None else Path(cast('str | os.PathLike[str]', path))
        self.url: DatabaseURL | None = url  #: the database URL of a ledger on a server (None: a file)
        self.readonly = readonly
        window, group_max = seconds(group_window, "group_window"), count(group_max, "group_max")
        lock_timeout = seconds(lock_timeout, "lock_timeout")
        if synchronous not in ("FULL", "NORMAL", "EXTRA"):
            raise InputError("synchronous must be FULL, EXTRA or NORMAL")
        self._guard = _fork.ForkGuard(self.path)
        self._storage = storage = open_storage(self, synchronous=synchronous, lock_timeout=lock_timeout)
        self._commits = GroupCommit(storage, partial(write_group, storage, name=storage.name), self._guard,
                                    label=repr(self), readonly=readonly, window=window, group_max=group_max)
        self.stats: Stats = self._commits.stats  #: what group commit did (commits, records, the largest group)
        self._slots = SlotReader(storage.evidence_body)
        _connect(self, storage, self._commits)

    # ------------------------------------------------------------------ state

    @property
    def group_window(self) -> float:
        """Seconds the committer lets a group fill."""
        return self._commits.window

    @property
    def group_max(self) -> int:
        """Records that end the group window early."""
        return self._commits.group_max

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has run (in a forked copy: once it was called there)."""
        return self._commits.closed

    @property
    def forked(self) -> bool:
        """True in a process forked from the one that opened it (every call but :meth:`close` is refused)."""
        return self._guard.forked

    def refuse_if_forked(self, what: str) -> None:
        """Refuse ``what`` in a forked copy of this ledger.

        Args:
            what: the call refused ("Producer()").

        Raises:
            LedgerForkedError: this process was forked from the ledger's.
        """
        if self._guard.forked:
            raise self._guard.error(what)

    def refuse_inside_commit(self, what: str) -> None:
        """Refuse ``what`` from a callback a commit runs (an observer, a commit
        listener): a call that waits for a commit would wait on its own thread.

        Args:
            what: the call refused ("seal()").

        Raises:
            LedgerError: called from inside a commit.
        """
        self._commits.refuse_inside_commit(what)

    def wait(self, appends: Sequence[PendingAppend], timeout: float | None = None) -> None:
        """Wait until ``appends`` (of :meth:`submit`) are durable or refused,
        committing them on this thread when nobody else is.

        Args:
            appends, timeout: the appends; seconds to wait at most (None: no limit).

        Raises:
            LedgerError: ``timeout`` passed, or called from inside a commit (LedgerForkedError: forked).
        """
        self._commits.wait(appends, timeout_arg(timeout))

    def unfinished(self) -> int:
        """How many submitted records are not yet durable or refused.

        Returns:
            That number (0 once closed, or forked).
        """
        return self._commits.unfinished()

    # ------------------------------------------------------------------ closing

    def close(self) -> None:
        """Drain what was submitted (it becomes durable), then close.

        In a forked copy, only marks this copy closed (nothing touched or
        written): close() runs in ``with`` exits and ``finally`` blocks a
        forked child may pass through, where an error would hide the real one.

        Raises:
            LedgerError: called from inside a commit of this ledger.
        """
        commits = self._commits
        if self._guard.forked:
            commits.closed = True
            return
        commits.refuse_inside_commit("close()")
        if not commits.stop():
            return
        storage = self._storage
        with storage.write_lock:
            commits.finish()
            released = storage.close()
        if released:  # else the last snapshot still open takes the ledger off the fork machinery's list
            _fork.forget(self)

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Ledger({str(self.path)!r}{', readonly' if self.readonly else ''})"

    def _fork_parts(self) -> tuple[Storage, GroupCommit, _fork.ForkGuard]:
        """What the fork machinery (:class:`._fork.Forkable`) takes, marks and keeps."""
        return self._storage, self._commits, self._guard

    # ------------------------------------------------------------------ writing

    def append(self, entry: LedgerEntry) -> StoredEntry:
        """Append one record.

        Args:
            entry: the record.

        Returns:
            The row as stored, once it is durable.

        Raises:
            DuplicateRecordError: its record id or action id is in the ledger.
            LedgerError: refused otherwise (read-only, closed, inside a commit, …).
        """
        return self._commits.append([entry], "append()")[0]

    def append_many(self, entries: Sequence[LedgerEntry]) -> list[StoredEntry]:
        """Append records in order; a refused one does not stop the others.

        Args:
            entries: the records.

        Returns:
            The rows stored, once durable.

        Raises:
            DuplicateRecordError, LedgerError: the first refusal, once the others are stored.
        """
        return self._commits.append(entries, "append_many()")

    def add_commit_listener(self, listener: Callable[[list[StoredEntry]], object]) -> None:
        """Call ``listener(entries)`` on the committing thread after every
        commit, with the records it made durable, in seq order (one call per
        commit, not an object per record). It must not block; an error in it
        never undoes the commit.

        Args:
            listener: the callable.
        """
        self._commits.listeners.append(listener)

    def remove_commit_listener(self, listener: Callable[[list[StoredEntry]], object]) -> None:
        """Stop calling ``listener`` (nothing happens if it was not added).

        Args:
            listener: a callable given to :meth:`add_commit_listener`.
        """
        if listener in self._commits.listeners:
            self._commits.listeners.remove(listener)

    def arriving(self) -> Arrival:
        """``with`` it around making and queueing an append this thread then waits for (a commit made
        meanwhile lets it join; a lone caller is not delayed). Returns: the context manager."""
        return self._commits.arriving()

    def submit(
        self, entry: LedgerEntry, on_durable: Callable[[StoredEntry], None] | None = None, *, wake: bool = True,
        after: tuple[PendingAppend, ...] = (),
    ) -> PendingAppend:
        """Queue a record and return at once; a committer thread writes queued
        records in groups (one fsync per group).

        Args:
            entry: the record.
            on_durable: run on the committing thread right after the commit (keep it short).
            wake: False: the caller commits it itself when it waits on ``result()``.
            after: appends queued earlier (a chain parent, an epoch boundary)
                that this one needs: if one of them is refused, so is this one.

        Returns:
            The append: durable (acknowledged) only when its ``result()`` returns.

        Raises:
            LedgerError: read-only or closed (LedgerForkedError: in a forked copy).
        """
        pending = PendingAppend(entry, self._commits, on_durable)
        pending.after = after
        self._commits.enqueue((pending,), wake=wake)
        return pending

    def submit_pair(
        self, lead: LedgerEntry, entry: LedgerEntry, on_lead: Callable[[StoredEntry], None] | None = None,
        on_durable: Callable[[StoredEntry], None] | None = None, *, wake: bool = True,
        after: tuple[PendingAppend, ...] = (),
    ) -> tuple[PendingAppend, PendingAppend]:
        """Queue ``lead`` and ``entry`` to be written together, in that order,
        or neither. Why: an epoch-boundary capsule goes in with the epoch's
        first record; alone (its record refused) it would be found by the
        epoch's real first record.

        Args:
            lead, entry: written in that order.
            on_lead, on_durable, wake: as for :meth:`submit`.
            after: appends ``entry`` needs (as for :meth:`submit`).

        Returns:
            The two appends.

        Raises:
            LedgerError: as :meth:`submit`.
        """
        first = PendingAppend(lead, self._commits, on_lead)
        second = PendingAppend(entry, self._commits, on_durable)
        second.lead, second.after = first, after
        self._commits.enqueue((first, second), wake=wake)
        return first, second

    def flush(self, timeout: float | None = None) -> None:
        """Wait until everything submitted so far is durable (or refused).

        Args:
            timeout: seconds to wait at most (None: no limit).

        Raises:
            LedgerError: ``timeout`` passed, or called from inside a commit (LedgerForkedError: forked).
        """
        self._commits.flush(timeout_arg(timeout))

    def add_evidence(self, record_id: str, evidence: dict[str, Any] | None) -> EvidenceEntry:
        """Append an evidence state for a record; its earlier states stay in history.

        Args:
            record_id: the record's id.
            evidence: a filled slot, or None to record that the slot is empty again.

        Returns:
            The evidence row, once durable.

        Raises:
            ValueError: ``evidence`` is an empty object.
            LedgerError: no such record (nothing written), or read-only, closed.
        """
        return _evidence_write.add_slot(self._commits.side_write, self._storage, self.path.name, record_id, evidence)

    def add_evidence_batch(self, record_ids: Sequence[str], merkle_root: bytes, shared: Mapping[str, Any]) -> EvidenceEntry:
        """Append ONE quote over many records: a batch row and an index row
        per record, in one transaction (every slot appears, or none); each
        slot and inclusion proof is rebuilt on read (:func:`batch_slot`).
        Checking the quote is the writer's job.

        Args:
            record_ids: the records, in leaf order.
            merkle_root: their RFC 9162 root (the quote's qualifyingData; one from
                :func:`batch_root` of the same ids is not hashed again).
            shared: the quote members every slot carries (filled, without ``binding``).

        Returns:
            The batch row, once durable.

        Raises:
            ValueError: the ids are not distinct capsule ids hashing to
                ``merkle_root``, or ``shared`` is not as above (nothing written).
            LedgerError: a record is unknown (nothing written), or read-only, closed.
        """
        return _evidence_write.add_batch(self._commits.side_write, self._storage, self.path.name, record_ids,
                                         merkle_root, shared)

    # ------------------------------------------------------------------ integrity

    def check_chain(self, *, on_record: Callable[[StoredEntry], object] | None = None, index: IdIndex | None = None,
                    rows: _chain.CheckedRows | None = None, damaged: list[str] | None = None) -> list[str]:
        """Recompute both hash chains and the evidence index, in one snapshot,
        the rows read as a stream (what is kept of each record is its id, in
        16 bytes, in a temporary file past a quarter of a million: see :class:`IdIndex`).

        What the file holds never raises here: a row SQLite cannot read, a column of another type, a hash
        that is not hex or a record stored twice is a problem of its own, and the rows around it are still checked.

        Args:
            on_record: called with every record row as it is checked, in seq order (damaged ones too).
            index: filled with every record id's first seq (an :class:`IdIndex`).
            rows, damaged: the rows as the caller read them here (:meth:`entries` with ``damaged``), each with
                whether its row hash matches (None: checked here); by default they are read here.

        Returns:
            The problems found, one sentence each (empty when intact).
        """
        with self.snapshot():
            return _chain.check(self._storage, on_record=on_record, index=index, rows=rows, damaged=damaged)

    # ------------------------------------------------------------------ export / import

    def export_jsonl(self, out: IO[bytes]) -> int:
        """Write every row as one JSON line (records, then evidence), in one snapshot.

        Args:
            out: a binary stream.

        Returns:
            How many lines were written.

        Raises:
            LedgerCorruptError: a part of the file cannot be read (what was written
                is no whole export), or an evidence row is damaged.
        """
        with self.snapshot():
            try:
                return _transfer.export_lines(self.entries(), self.evidence_entries(), out)
            except self._storage.damage_errors as exc:
                raise LedgerCorruptError(f"{self.path} is damaged ({exc}); the export is not whole") from None

    @classmethod
    def import_jsonl(cls, src: IO[bytes], path: str | os.PathLike[str] | DatabaseURL) -> Ledger:
        """Build a new ledger at ``path`` from an export, checking every hash.

        Args:
            src: the export (a binary stream of JSON lines).
            path: where the new ledger goes; nothing may be there yet.

        Returns:
            The new ledger, open.

        Raises:
            MalformedJSONError: a line is malformed (no file is left at ``path``).
            LedgerCorruptError: a hash chain breaks, a batch does not hash to its root (likewise).
            LedgerError: ``path`` exists, or the ledger cannot be made there
                (a ``postgresql://`` URL: its schema is not empty).
        """
        url = as_url(path)
        if url is not None:
            from ._pg_transfer import import_into

            import_into(url, src, lock_timeout=30.0)
            return cls(url)
        target = Path(cast('str | os.PathLike[str]', path))
        _transfer.import_file(cls, cls.close, lambda ledger: ledger._storage, src, target)
        return cls(target)


def open_storage(ledger: Ledger, *, synchronous: str, lock_timeout: float) -> Storage:
    """The engine a new ledger keeps its rows in (not connected yet).

    Args:
        ledger: the ledger being made (its path, read-only flag, fork flag).
        synchronous: SQLite's ``synchronous`` setting.
        lock_timeout: seconds to wait for another process's lock.

    Returns:
        The PostgreSQL engine for a database URL, else the SQLite engine for the ledger's file.

    Raises:
        MissingExtraError: a database URL without psycopg installed.
    """
    me = weakref.ref(ledger)
    if ledger.url is not None:
        from ._pg import PGStorage  # psycopg only for a ledger on a server

        return PGStorage(ledger.url, label=repr(ledger), guard=ledger._guard, readonly=ledger.readonly,
                         synchronous=synchronous, lock_timeout=lock_timeout, on_released=lambda: _forget(me))
    return SQLiteStorage(ledger.path, label=repr(ledger), guard=ledger._guard, readonly=ledger.readonly,
                         synchronous=synchronous, lock_timeout=lock_timeout, lenient=ledger._lenient_reads,
                         on_released=lambda: _forget(me))


def _connect(ledger: Ledger, storage: Storage, commits: GroupCommit) -> None:
    """Open the engine's connections, registered with the fork machinery first."""
    _fork.before_opening(storage.location)  # in a forked process: the parent's connections to it first
    try:
        with storage.write_lock:  # a fork waits for the connections to be made (see _fork)
            _fork.register(ledger)
            storage.open()
    except BaseException:
        commits.closed = True
        _fork.forget(ledger)  # outside the write lock: a fork holding the registry may wait on it
        raise


def _forget(ref: weakref.ref[Ledger]) -> None:
    ledger = ref()
    if ledger is not None:
        _fork.forget(ledger)
