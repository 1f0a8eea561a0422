"""Sealed records into the ledger, in order: the ordered writer of a producer.

What it keeps, so that the ledger never holds a record its own verifier fails:

* **epoch pairing** — an epoch's boundary capsule is written only together
  with the epoch's first record (both or neither: opening a producer and
  sealing nothing leaves the ledger unchanged, and a refused first record
  leaves no boundary behind); a later record of the epoch goes in behind that
  pair while it is on its way, and is refused with it;
* **parent before child** — a record chained to one still on its way is
  accepted (the child is written only if the parent is), and a chain parent
  that is neither in the ledger nor on its way is refused (-05 §6 check 6);
* **observers** — callbacks told of each record once it is durable.

Nothing here waits for a commit: :meth:`OrderedWriter.enqueue` runs on the
signing pipeline's finishing thread and inside observers too.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any

from ..arguments import timeout as timeout_arg
from ..errors import DuplicateRecordError, InputError, LedgerError
from ..ledger import Ledger, LedgerEntry, PendingAppend, StoredEntry
from ..record import SealedRecord, epistemic_type_for_capsule

__all__ = ["PendingRecord", "OrderedWriter"]

_STORED_PARENTS = 64  # chain parents remembered as found in the ledger (see OrderedWriter.known)


class PendingRecord:
    """A record on its way into the ledger (see :meth:`capseal.Producer.submit`).

    ``result()`` returns the sealed record once it is durable, or raises what
    refused it: the device (a signature that failed or did not verify) or the
    ledger (e.g. DuplicateRecordError for a reused action_id). Nothing is
    written for a refused record."""

    __slots__ = ("capsule_id", "_record", "_pending", "_error", "_ready", "_future")

    def __init__(self, capsule_id: str, record: SealedRecord | None = None, pending: PendingAppend | None = None) -> None:
        self.capsule_id = capsule_id
        self._record = record
        self._pending = pending
        self._error: BaseException | None = None
        self._ready = threading.Event()
        self._future: Future[SealedRecord] | None = None
        if record is not None:
            self._ready.set()

    @property
    def future(self) -> Future[SealedRecord]:
        """A ``concurrent.futures.Future`` of :meth:`result`: done once the
        record is durable (its result the sealed record) or refused (its
        exception what refused it). ``asyncio.wrap_future`` takes it."""
        with _waiters_lock:
            if self._future is None:
                self._future = _waiters().submit(self.result)
            return self._future

    def resolve(self, record: SealedRecord, pending: PendingAppend) -> None:
        """Signed and handed to the ledger (called by the writer's caller).

        Args:
            record: the sealed record.
            pending: its ledger append.
        """
        self._record, self._pending = record, pending
        self._ready.set()

    def fail(self, error: BaseException) -> None:
        """Refused before it reached the ledger (a device error).

        Args:
            error: what refused it; :meth:`result` raises it.
        """
        self._error = error
        self._ready.set()

    @property
    def append(self) -> PendingAppend | None:
        """Its ledger append, once it has one."""
        return self._pending

    @property
    def error(self) -> BaseException | None:
        """What refused it before the ledger, if anything did."""
        return self._error

    def settled(self) -> bool:
        """Refused, or appended and done (durable or refused by the ledger).

        Returns:
            True once :meth:`result` would return or raise without waiting.
        """
        pending = self._pending
        return self._error is not None or (pending is not None and pending.done)

    def result(self, timeout: float | None = None) -> SealedRecord:
        """The sealed record, once durable.

        Args:
            timeout: seconds to wait at most (None: no limit).

        Returns:
            The record, with its ledger ``seq``.

        Raises:
            LedgerError: not signed, or not durable, within ``timeout``.
            SignerError, LedgerError, DuplicateRecordError: what refused it.
        """
        timeout = timeout_arg(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._ready.wait(timeout):
            raise LedgerError(f"record {self.capsule_id[:16]}… not signed within {timeout} s")
        if self._error is not None:
            raise self._error
        assert self._record is not None and self._pending is not None
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        stored = self._pending.result(remaining)
        return SealedRecord(self._record.capsule, self._record.envelopes, None, seq=stored.seq)


# the threads that wait on PendingRecord.future's behalf (made on first use in each process)
_waiters_lock = threading.Lock()
_waiter_pool: tuple[int, ThreadPoolExecutor] | None = None


def _waiters() -> ThreadPoolExecutor:
    global _waiter_pool
    if _waiter_pool is None or _waiter_pool[0] != os.getpid():  # a forked process makes its own
        _waiter_pool = (os.getpid(), ThreadPoolExecutor(64, thread_name_prefix="capseal-wait"))
    return _waiter_pool[1]


class OrderedWriter:
    """One producer's records into its ledger, in order (see the module docstring).

    Args:
        ledger: the ledger written to.
        stream: the producer's stream key (its operator and developer).
        lock: held while the epoch changes or a record is queued against it
            (the producer also holds it while it makes its pipeline or closes).
    """

    def __init__(self, ledger: Ledger, stream: str, lock: threading.Lock) -> None:
        self.ledger = ledger
        self.stream = stream
        self.lock = lock
        self.epoch_id: str = ""
        self.epoch_record: SealedRecord | None = None
        self._armed: LedgerEntry | None = None  # the boundary, until it goes in with the epoch's first record
        self._sent: PendingAppend | None = None  # the boundary while its pair is on the way
        self._recent: dict[str, PendingRecord] = {}  # see keep_findable
        self._recent_lock = threading.Lock()
        # chain parents found in the ledger, the latest few: the ledger is append-only, so one found
        # stays there, and a producer chaining to the same record does not ask the ledger each time
        self._stored_parents: dict[str, None] = {}
        self._observers: list[Callable[[SealedRecord], object]] = []
        self._id_observers: list[Callable[[str, int, bool], object]] = []

    # ------------------------------------------------------------------ epochs

    def open_epoch(self, epoch_id: str, record: SealedRecord, boundary: LedgerEntry | None) -> None:
        """Make ``epoch_id`` the open epoch, its boundary ``record`` armed
        (``boundary``: written with the epoch's first record) or already in
        the ledger (None). Under the lock: a record assembled meanwhile on
        another thread is in one epoch or the other, never in one whose
        boundary is not armed."""
        with self.lock:
            self.epoch_id, self.epoch_record, self._armed = epoch_id, record, boundary

    @property
    def epoch_opened(self) -> bool:
        """True once the open epoch's boundary capsule is in the ledger queue."""
        return self._armed is None

    def entry(self, record: SealedRecord, *, tag: str | None = None) -> LedgerEntry:
        """The ledger entry of a sealed capsule record of this producer."""
        capsule = record.capsule
        return LedgerEntry(
            record_id=record.capsule_id,
            record_type="capsule",
            epistemic_type=epistemic_type_for_capsule(capsule),
            body=record.body_bytes(),
            action_id=capsule["action_id"],
            stream=self.stream,
            tag=tag,
        )

    # ------------------------------------------------------------------ parents

    def parent_known(self, body: Mapping[str, Any]) -> PendingRecord | None:
        """The chain parent of ``body``, checked before anything is signed.

        Returns:
            The parent's PendingRecord while it is on its way (not waited for:
            the child is written only if the parent is), else None.

        Raises:
            InputError: a parent neither in this ledger nor on its way.
        """
        chain = body.get("chain")
        parent = chain.get("parent_capsule_id") if isinstance(chain, Mapping) else None
        boundary = self.epoch_record
        if not isinstance(parent, str) or len(parent) != 64 or (boundary is not None and parent == boundary.capsule_id):
            return None  # no chain, a malformed one (refused with its own message later), or the epoch's boundary
        return self.known(parent)

    def known(self, parent: str) -> PendingRecord | None:
        """``parent``'s PendingRecord while it is on its way, None once it is
        in the ledger.

        Raises:
            InputError: it is neither.
        """
        on_its_way = self._recent.get(parent)
        if on_its_way is not None or parent in self._stored_parents:
            return on_its_way
        if self.ledger.has_record(parent):
            with self._recent_lock:
                stored = self._stored_parents
                stored[parent] = None
                if len(stored) > _STORED_PARENTS:
                    del stored[next(iter(stored))]
            return None
        raise InputError(f"chain parent {parent[:16]}… is not in {self.ledger.path.name}: a chain names a record "
                         "of the same ledger (-05 §6 check 6)")

    def keep_findable(self, pending: PendingRecord) -> PendingRecord:
        """Keep a submitted record findable by id while it is on its way (see
        :meth:`known`). Records that are done leave from the front, so this
        holds about as many records as are under way."""
        with self._recent_lock:
            recent = self._recent
            recent[pending.capsule_id] = pending
            while recent:
                first = next(iter(recent.values()))
                if not first.settled():
                    break
                del recent[first.capsule_id]
        return pending

    def unwritten(self) -> list[PendingAppend]:
        """The ledger appends of this producer's records not yet durable or refused."""
        with self._recent_lock:
            pending = [r.append for r in self._recent.values()]
        return [p for p in pending if p is not None and not p.done]

    # ------------------------------------------------------------------ into the ledger

    def enqueue(self, record: SealedRecord, *, wake: bool, parent: PendingRecord | None = None) -> PendingAppend:
        """Hand ``record`` to the ledger, in order (see the module docstring).

        Args:
            record: a sealed capsule record of this producer.
            wake: start a group commit now (False: the caller will wait for it).
            parent: its chain parent's PendingRecord while that is on its way.

        Returns:
            The ledger append.

        Raises:
            LedgerError: its parent, or its epoch's boundary, was refused.
            DuplicateRecordError: its action id or capsule is in the ledger.
            InputError: its epoch was opened by another producer meanwhile.
        """
        entry = self.entry(record)
        callback = partial(self._notify_sealed, record) if self._observers else None
        after = self._parent_append(record, parent)
        with self.lock:
            sent = self._sent
            if sent is not None:
                if sent.stored is not None:
                    self._sent = None
                elif sent.error is not None:  # refused with its first record: it goes in with the next one
                    self._sent = None
                    if self._armed is None:
                        self._armed = sent.entry
                else:
                    after += (sent,)  # on its way: behind it, and only if it is written
            return self._enqueue_locked(record, entry, callback, after, wake)

    def _enqueue_locked(self, record: SealedRecord, entry: LedgerEntry, callback: Any,
                        after: tuple[PendingAppend, ...], wake: bool) -> PendingAppend:
        armed = self._armed
        epoch = record.capsule.get("epoch_id")
        if epoch != self.epoch_id:  # assembled before a rotation: its own epoch's boundary must go in first
            opens = f"{epoch}/opens"
            if not any(a.entry.action_id == opens for a in after) and not self.ledger.has_action_id(opens):
                raise LedgerError(f"record {record.capsule_id[:16]}… not written: its epoch {epoch!r} was rotated "
                                  "before its boundary was written; seal it again")
            return self.ledger.submit(entry, callback, wake=wake, after=after)
        if armed is None:
            return self.ledger.submit(entry, callback, wake=wake, after=after)
        # the boundary is written only with the epoch's first record (a duplicate
        # action id refuses both): checked here too, so a refusal keeps it armed
        if self.ledger.has_action_id(str(armed.action_id)):
            raise InputError(f"epoch {self.epoch_id!r} was opened by another producer of {self.ledger.path.name} "
                             "meanwhile; an epoch id is never reused (-05 §5.2): call rotate_epoch()")
        capsule = record.capsule
        if self.ledger.has_action_id(capsule["action_id"]) or self.ledger.has_record(record.capsule_id):
            raise DuplicateRecordError(f"action_id {capsule['action_id']!r} (or this capsule) is already in "
                                       f"{self.ledger.path.name}")
        lead, pending = self.ledger.submit_pair(armed, entry, self._notify_epoch if self._observers else None,
                                                callback, wake=wake, after=after)
        self._armed, self._sent = None, lead
        return pending

    @staticmethod
    def _parent_append(record: SealedRecord, parent: PendingRecord | None) -> tuple[PendingAppend, ...]:
        """The ledger append of ``record``'s chain parent while it may not be
        durable yet; the record is refused now if the parent already was."""
        if parent is None:
            return ()
        append = parent.append
        error = parent.error if parent.error is not None else (append.error if append is not None else None)
        if error is not None:
            raise LedgerError(f"record {record.capsule_id[:16]}… not written: its chain parent "
                              f"{parent.capsule_id[:16]}… was refused ({error})")
        return () if append is None else (append,)

    # ------------------------------------------------------------------ observers

    def add_observer(self, callback: Callable[[SealedRecord], object]) -> None:
        """Call ``callback(record)`` after each record is durable."""
        self._observers.append(callback)

    def add_id_observer(self, callback: Callable[[str, int, bool], object]) -> None:
        """Call ``callback(capsule_id, seq, epoch_boundary)`` after each record
        is durable, from the ledger's commit listener (nothing of the record
        waits for its commit)."""
        if not self._id_observers:
            self.ledger.add_commit_listener(self._on_commit)
        self._id_observers.append(callback)

    @property
    def has_id_observers(self) -> bool:
        return bool(self._id_observers)

    def stop_id_observers(self) -> None:
        """Report what was submitted, then stop listening to the ledger's commits."""
        if self._id_observers:
            self.ledger.flush()
            self.ledger.remove_commit_listener(self._on_commit)

    def _on_commit(self, entries: list[StoredEntry]) -> None:
        stream = self.stream
        for e in entries:
            if e.stream == stream and e.record_type == "capsule":
                for callback in self._id_observers:
                    try:
                        callback(e.record_id, e.seq, e.tag == "epoch_boundary")
                    except Exception:  # an observer never undoes a durable seal
                        pass

    def _notify_sealed(self, record: SealedRecord, stored: StoredEntry) -> None:
        # the record as sealed (what the caller gets back), not re-parsed from the stored JSON
        self._dispatch(SealedRecord(record.capsule, record.envelopes, None, seq=stored.seq))

    def _notify_epoch(self, stored: StoredEntry) -> None:
        self._dispatch(SealedRecord.from_json(stored.record(), seq=stored.seq))

    def _dispatch(self, record: SealedRecord) -> None:
        for callback in self._observers:
            try:
                callback(record)
            except Exception:  # an observer never undoes a durable seal
                pass
