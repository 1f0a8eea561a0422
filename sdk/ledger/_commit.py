"""Group commit: many appends, one transaction, one fsync.

Appends are queued; whoever commits takes the whole queue into one
transaction (the ``write`` it is given: :func:`._group.write_group`). A thread waiting for its own append leads when
nobody is writing (a lone writer pays no thread hand-off); otherwise a
committer thread waits up to the group window for the group to fill. A
caller about to queue an append it will wait for says so first
(:meth:`GroupCommit.arriving`): a leader finding such callers under way
lets them queue before it commits, for about as long as queueing takes,
so threads sealing at once share a commit; a lone caller finds nobody and
commits at once. An append is acknowledged — durable — only once its
transaction is committed.
After each commit the appends' callbacks and the commit listeners run on
the committing thread, still holding the write lock, outside SQLite.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from ..errors import LedgerClosedError, LedgerError
from ._fork import ForkGuard
from ._format import LedgerEntry, StoredEntry
from .storage import Storage

__all__ = ["PendingAppend", "Stats", "GroupCommit", "Arrival"]

#: Shortest and longest a leader waits for callers under way to queue their
#: appends, in seconds (between them: twice as long as queueing has taken)
GATHER_MIN = 0.0005
GATHER_MAX = 0.004


class PendingAppend:
    """A record handed to the committer. ``result()`` returns the stored entry
    once its transaction is durable: that is the acknowledgement.

    Attributes:
        entry: the record.
        stored: the row written (set once durable), else None.
        error: why it was refused (set once decided), else None.
        done: decided (written or refused).
        lead: the record written with this one, or neither (a pair's lead).
        after: appends queued before this one that must be written first.
    """

    __slots__ = ("entry", "stored", "error", "done", "_group", "on_durable", "lead", "after")

    def __init__(self, entry: LedgerEntry, group: GroupCommit,
                 on_durable: Callable[[StoredEntry], None] | None = None) -> None:
        self.entry = entry
        self.on_durable = on_durable
        self.stored: StoredEntry | None = None
        self.error: BaseException | None = None
        self.done = False
        self._group = group
        self.lead: PendingAppend | None = None
        self.after: tuple[PendingAppend, ...] = ()

    def result(self, timeout: float | None = None) -> StoredEntry:
        """Wait until the record is durable.

        Args:
            timeout: seconds to wait at most (None: no limit).

        Returns:
            The row as stored.

        Raises:
            LedgerError (or a subclass, e.g. DuplicateRecordError): it was
                refused, or not acknowledged within ``timeout``.
            LedgerForkedError: called in a process forked from the ledger's.
        """
        self._group.wait([self], timeout)
        if self.error is not None:
            raise self.error
        assert self.stored is not None
        return self.stored


@dataclass
class Stats:
    """What group commit did: ``commits`` made, ``records`` written, the
    ``largest_group`` taken into one commit."""

    commits: int = 0
    records: int = 0
    largest_group: int = 0


class GroupCommit:
    """The append queue of one ledger and whoever commits it.

    Args:
        storage: the engine (its write lock is the one transaction at a time).
        write: writes a group in one durable transaction (the caller holds
            the write lock), setting each append's ``stored`` or ``error``;
            returns how many were written.
        guard: the ledger's fork flag.
        label: how the ledger names itself in messages.
        readonly: refuse every append.
        window: seconds the committer thread lets a group fill.
        group_max: appends that end the window early.
    """

    def __init__(self, storage: Storage, write: Callable[[list[PendingAppend]], int], guard: ForkGuard, *,
                 label: str, readonly: bool, window: float, group_max: int) -> None:
        self._write = write
        self._write_lock = storage.write_lock
        self._guard = guard
        self._label = label
        self._name = storage.name
        self._readonly = readonly
        self.window = window
        self.group_max = group_max
        self.stats = Stats()
        self.listeners: list[Callable[[list[StoredEntry]], object]] = []
        self._mutex = threading.Lock()
        self._cond = threading.Condition(self._mutex)
        self._queue: list[PendingAppend] = []
        self._in_flight: list[PendingAppend] = []
        self._committer: threading.Thread | None = None
        # evidence writers waiting for the write lock: under a steady stream of
        # appends the committer would re-take the (non-FIFO) lock forever, so it
        # steps aside while one waits (see side_write)
        self._side_writers = 0
        self._closing = False
        self.closed = False
        self.committing: int | None = None  # the thread inside drain (it runs the callbacks)
        self.in_callbacks: int | None = None  # that thread, once its COMMIT/ROLLBACK is over (see _fork)
        self._arriving = 0  # callers between arriving() and queueing the append they will wait for
        self._arrival_time = 0.0  # how long queueing takes them, smoothed (seconds)
        self._gathering = False  # a leader waits for them

    # ------------------------------------------------------------------ arrivals

    def arriving(self) -> Arrival:
        """A caller about to make an append and wait for it (``with`` around
        making and queueing it): while it is under way a leader lets it join
        the next commit (see the module docstring).

        Returns:
            The context manager.
        """
        return Arrival(self)

    def _arrive(self) -> bool:
        if self._guard.forked:  # before the mutex (see enqueue); nothing is counted in a forked copy
            return False
        with self._mutex:
            self._arriving += 1
        return True

    def _arrived(self, seconds: float) -> None:
        with self._mutex:
            self._arriving -= 1
            self._arrival_time += (seconds - self._arrival_time) / 8
            if self._gathering and (not self._arriving or len(self._queue) >= self.group_max):
                self._cond.notify_all()

    def _gather(self) -> None:
        """As a leader (the write lock held): let callers under way queue
        their appends, for at most about twice as long as queueing takes
        (within :data:`GATHER_MIN` and :data:`GATHER_MAX`); returns at once
        when none is."""
        with self._mutex:
            if not self._arriving:
                return
            deadline = time.monotonic() + min(max(2 * self._arrival_time, GATHER_MIN), GATHER_MAX)
            self._gathering = True
            try:
                while self._arriving and len(self._queue) < self.group_max and not self._closing:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
            finally:
                self._gathering = False

    # ------------------------------------------------------------------ queueing

    def enqueue(self, pendings: Sequence[PendingAppend], *, wake: bool) -> None:
        """Queue ``pendings`` (all at once: a pair goes into one group).

        Raises:
            LedgerForkedError, LedgerError (read-only), LedgerClosedError.
        """
        if self._guard.forked:  # before the mutex: a parent thread may have held it at the fork
            raise self._guard.error("appending a record")
        if self._readonly:
            raise LedgerError(f"{self._label} is read-only")
        with self._mutex:
            if self.closed or self._closing:
                raise LedgerClosedError(f"{self._label} is closed")
            self._queue.extend(pendings)
            if wake:
                if self._committer is None:
                    self._committer = threading.Thread(
                        target=self._commit_loop, name=f"capseal-ledger:{self._name}", daemon=True
                    )
                    self._committer.start()
                queued = len(self._queue)
                if queued == len(pendings) or queued >= self.group_max:  # wake the committer only when it matters
                    self._cond.notify_all()

    def append(self, entries: Sequence[LedgerEntry], what: str) -> list[StoredEntry]:
        """Append ``entries`` in order, committing them on this thread if nobody else does.

        Args:
            entries: the records.
            what: the call, for a refusal from inside a commit ("append()").

        Returns:
            The rows stored, once durable.

        Raises:
            DuplicateRecordError, LedgerError: the first refusal, once the others are stored.
        """
        if entries:
            self.refuse_inside_commit(what)  # before anything is queued
        pendings = [PendingAppend(e, self) for e in entries]
        for p in pendings:
            self.enqueue((p,), wake=False)
        self.wait(pendings, None)
        errors = [p.error for p in pendings if p.error is not None]
        if errors:
            raise errors[0]
        return [p.stored for p in pendings if p.stored is not None]

    def flush(self, timeout: float | None) -> None:
        """Wait until everything queued so far is durable or refused.

        Raises:
            LedgerForkedError, LedgerError: as :meth:`wait`.
        """
        if self._guard.forked:
            raise self._guard.error("flush()")
        with self._mutex:
            pendings = list(self._queue) + list(self._in_flight)
        self.wait(pendings, timeout)

    def unfinished(self) -> int:
        """Appends queued and not yet durable or refused (0 once closed or forked)."""
        if self._guard.forked:
            return 0
        with self._mutex:
            return 0 if self.closed else sum(not p.done for p in (*self._queue, *self._in_flight))

    def wait(self, pendings: Sequence[PendingAppend], timeout: float | None) -> None:
        """Wait for ``pendings``; when nobody is writing, commit the queue on
        this thread (group-commit leader) instead of handing it to another.

        Raises:
            LedgerForkedError: in a forked copy (nobody here would commit them).
            LedgerError: called from a commit callback, or ``timeout`` passed.
        """
        if self._guard.forked:  # the committer is not in this process: nobody would commit them
            raise self._guard.error("waiting for a record to be durable")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._mutex:
                if all(p.done for p in pendings):
                    return
            self.refuse_inside_commit("waiting for a record to be durable")  # durable ones never wait
            if not self._side_writers and self._write_lock.acquire(blocking=False):
                try:
                    self._gather()
                    self.drain()
                finally:
                    self._write_lock.release()
                continue
            with self._mutex:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise LedgerError(f"{self._label}: append not acknowledged within {timeout} s")
                self._cond.wait(0.05 if remaining is None else min(0.05, remaining))

    def refuse_inside_commit(self, what: str) -> None:
        """A callback run by a commit (an observer, a commit listener) that
        waits for a commit — flush, result(), seal(), append, close, an
        evidence write — would wait on the thread it runs on: refused with a
        clear error, before anything is queued, instead of hanging."""
        if self.committing == threading.get_ident():
            raise LedgerError(f"{what} from inside a commit of {self._name} (an observer or commit listener) "
                              "would wait on that commit; do it after the callback returns")

    def _commit_loop(self) -> None:
        while not self._guard.forked:  # a fork made in a commit callback carries on here: it must not commit
            with self._mutex:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue and self._closing:
                    return
                # group commit: let the group fill for up to the window
                deadline = time.monotonic() + self.window
                while self._queue and len(self._queue) < self.group_max and not self._closing:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
            while self._side_writers:  # let a waiting evidence writer in first
                time.sleep(0.0002)
            with self._write_lock:
                self.drain()

    @contextmanager
    def side_write(self) -> Iterator[None]:
        """Hold the write lock for a write beside the record stream
        (evidence), without being starved by the committer.

        Raises:
            LedgerForkedError, LedgerError (inside a commit), LedgerClosedError.
        """
        if self._guard.forked:
            raise self._guard.error("writing evidence")
        self.refuse_inside_commit("writing evidence")  # the commit holds the write lock
        with self._mutex:
            self._side_writers += 1
        try:
            self._write_lock.acquire()
        finally:
            with self._mutex:
                self._side_writers -= 1
        try:
            if self.closed or self._closing:
                raise LedgerClosedError(f"{self._label} is closed")
            yield
        finally:
            self._write_lock.release()

    # ------------------------------------------------------------------ committing

    def drain(self) -> None:
        """Commit everything queued right now. The caller holds the write lock."""
        if self._guard.forked:  # a fork made in a commit callback, carrying on: never through inherited connections
            raise self._guard.error("committing")
        self.committing = threading.get_ident()
        try:
            self._drain_batch()
        finally:
            self.committing = None

    def _drain_batch(self) -> None:
        with self._mutex:
            batch, self._queue = self._queue, []
            self._in_flight = batch
        if not batch:
            return
        interrupted: BaseException | None = None
        try:
            written = self._write(batch)
        except BaseException as exc:  # noqa: BLE001 - every waiter must learn the outcome
            if isinstance(exc, LedgerError):
                failure = exc
            elif isinstance(exc, Exception):
                failure = LedgerError(f"append to {self._name} failed: {exc}")
            else:  # Ctrl-C or exit while this thread led the commit: nothing was written, and it goes on up
                failure, interrupted = LedgerError(f"append to {self._name} interrupted "
                                                   f"({type(exc).__name__}); nothing was written"), exc
            for p in batch:
                p.error, p.stored = failure, None
        else:
            st = self.stats
            st.commits += 1
            st.records += written
            st.largest_group = max(st.largest_group, len(batch))
        self.in_callbacks = threading.get_ident()  # SQLite is between statements: a fork here is quiet
        try:
            self._run_callbacks(batch)
        finally:
            self.in_callbacks = None
        with self._mutex:
            for p in batch:
                p.done = True
                p.lead, p.after = None, ()  # decided: what it waited on may go (a chain would keep every body)
            self._in_flight = []
            self._cond.notify_all()
        if interrupted is not None:
            raise interrupted

    def _run_callbacks(self, batch: list[PendingAppend]) -> None:
        for p in batch:
            if p.stored is not None and p.on_durable is not None:
                try:
                    p.on_durable(p.stored)
                except Exception:  # a callback never undoes a durable append
                    pass
        if self.listeners:
            stored = [p.stored for p in batch if p.stored is not None]
            for listener in list(self.listeners):
                try:
                    listener(stored)
                except Exception:  # a listener never undoes a durable append
                    pass

    # ------------------------------------------------------------------ closing

    def stop(self) -> bool:
        """Refuse new appends and let the committer thread finish its queue.

        Returns:
            False when closed already.
        """
        with self._mutex:
            if self.closed:
                return False
            self._closing = True
            self._cond.notify_all()
            committer = self._committer
        if committer is not None:
            committer.join()
        return True

    def finish(self) -> None:
        """Commit what is left and mark the queue closed; the caller holds the write lock."""
        self.drain()
        with self._mutex:
            self.closed = True


class Arrival:
    """``with`` around making and queueing an append the caller will wait
    for (:meth:`GroupCommit.arriving`)."""

    __slots__ = ("_commits", "_start", "_counted")

    def __init__(self, commits: GroupCommit) -> None:
        self._commits = commits
        self._start = 0.0
        self._counted = False

    def __enter__(self) -> Arrival:
        self._counted = self._commits._arrive()
        self._start = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._counted:
            self._counted = False
            self._commits._arrived(time.monotonic() - self._start)
