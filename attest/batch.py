"""Batch evidence: one TPM quote per batch of sealed capsules.

Why batches: a real TPM is slow to quote, and an agent seals capsules far
faster than a TPM can quote them one by one (bench/evidence.py has figures). So the seal path only hands
the capsule id to this worker (:meth:`BatchEvidence.observe`, a non-blocking
list append, run by the producer right after the record is durable) and never
waits on the TPM. The worker collects ids until ``max_records`` are waiting or
the oldest has waited ``max_delay`` seconds, builds the RFC 9162 Merkle tree
over their raw ids, takes ONE quote whose qualifyingData is the root, verifies
it, and writes the batch — the quote once, the record ids in leaf order — in
one ledger transaction; each record's slot (the quote plus its inclusion
proof) is rebuilt from that when it is read.

What it promises:

* a record's slot is null until its batch lands, then filled and verified;
* a failed quote leaves its records null (counted in ``stats``): never a
  partial slot, never ``{}``;
* a batch is written whole or not at all (``Ledger.add_evidence_batch``: the
  quote once, the record ids in leaf order);
* ``close(drain=True)`` quotes everything queued; ``close(drain=False)``
  leaves what is still queued null;
* records named "solo" (the epoch-boundary capsule, see :mod:`.platform`)
  get a quote over their own id instead of a Merkle root.

A worker belongs to the process that started it. In a process forked from
that one without exec, its thread is not there, so nothing queued would ever
be quoted: every observe, submit or flush on the inherited worker raises
EvidenceForkedError before anything is queued (a flush must not answer "all
quoted" for ids the parent's thread had already taken), and ``close()`` only
marks that copy closed (see :func:`_inherited`); a worker created
there, on a ledger and quoter opened there, works normally.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from capseal.arguments import count, seconds
from capseal.canonical import is_hex64
from capseal.errors import EvidenceError, EvidenceForkedError, InputError
from capseal.ledger import batch_root
from capseal.process import ForkCopies

from .quoter import Quoter, quote_record, self_policy
from .writer import write_batch

__all__ = ["BatchEvidence", "BatchStats"]

log = logging.getLogger("capseal.attest")


@dataclass
class BatchStats:
    """Counters a caller (or the benchmark) can read at any time."""

    batches: int = 0
    records_quoted: int = 0
    solo_quoted: int = 0
    failed_batches: int = 0
    records_left_null: int = 0
    largest_batch: int = 0
    last_error: str | None = None
    quote_seconds: deque[float] = field(default_factory=lambda: deque(maxlen=1000))  # the latest quotes


@dataclass(frozen=True)
class _Item:
    """A record that gets a quote of its own (ordinary records are queued as
    plain ``(capsule_id, observed_at)`` tuples: cheaper on the seal path)."""

    capsule_id: str
    observed_at: float
    solo: bool = True
    record: Any = None


class _Flush:
    __slots__ = ("event",)

    def __init__(self) -> None:
        self.event = threading.Event()


_STOP = object()


# ---------------------------------------------------------------------------- fork

def _inherited(worker: BatchEvidence) -> None:
    """In a forked child: every later observe, submit or flush on a parent's
    worker raises EvidenceForkedError.

    Why a flag: the seal path's ``observe_id`` keeps its one attribute test
    (``_accepting`` goes false too; the fork is told apart from a close only
    on that cold branch). Why refuse at all: the worker thread does not exist
    in the child, so an id queued there is never quoted, and ids the parent's
    thread had already taken into its batch are gone from the buffer a flush
    looked at. Closed workers are marked too: whatever their state, the thread
    that would settle it is the parent's. Nothing else is touched here (a
    parent thread may have held the worker's locks at the fork).
    """
    worker._forked = True
    worker._accepting = False


#: the workers made in this process (those a fork() hands to a child)
_WORKERS: ForkCopies[BatchEvidence] = ForkCopies(_inherited)


class BatchEvidence:
    """The background worker. Use as ``producer.add_id_observer(batch.observe_id)``
    (or :func:`capseal.attest.attach`, which does that and also makes capsules
    cite the epoch boundary); ``observe(record)`` serves record observers.

    ``on_batch(capsule_ids, written_at)`` runs on the worker after a batch's
    slots are durable (the benchmark measures seal→evidence latency with it).
    ``solo_if(record)`` picks records that get a quote of their own.
    ``max_records`` (a whole number from 1) and ``max_delay`` (seconds, 0 to
    ``threading.TIMEOUT_MAX``) outside those ranges are refused (InputError).

    A worker inherited through fork() refuses every call but ``close()``
    (EvidenceForkedError); create a new one in the child. One cannot be
    created on a ledger inherited that way (LedgerForkedError): its batches
    could only fail.
    """

    def __init__(
        self,
        ledger: Any,
        quoter: Quoter,
        *,
        max_records: int = 512,
        max_delay: float = 0.25,
        solo_if: Callable[[Any], bool] | None = None,
        on_batch: Callable[[list[str], float], None] | None = None,
        start: bool = True,
    ) -> None:
        _check_limits(max_records, max_delay)
        if getattr(ledger, "forked", False):  # as Producer(): a worker that could only fail
            ledger.refuse_if_forked("BatchEvidence()")
        self.ledger = ledger
        self.quoter = quoter
        self.max_records = max_records
        self.max_delay = max_delay
        self.solo_if = solo_if
        self.on_batch = on_batch
        self.stats = BatchStats()
        self._stats_lock = threading.Lock()
        self._solo_seen: set[str] = set()  # capsule ids queued for a quote of their own
        self._policy = self_policy(quoter.identity)
        # The hand-off from the seal path is a plain list append (atomic under
        # the GIL): the worker is woken once per batch (first item, a full
        # batch, flush, close), never once per record — per-record wake-ups
        # would make the worker fight the sealing thread for the GIL.
        self._buf: list[Any] = []
        self._wake = threading.Event()
        self._accepting = True
        self._discard = False
        self._pid = os.getpid()  # the process that started it (named in EvidenceForkedError)
        self._forked = False  # set in a forked child by _inherited
        self._thread = threading.Thread(target=self._run, name="capseal-attest-batch", daemon=True)
        _WORKERS.add(self)
        if start:
            self._thread.start()

    # ------------------------------------------------------------------ producer side (never blocks)

    def observe(self, record: Any) -> None:
        """The producer observer: queue this durable record's id. Non-blocking.

        Args:
            record: the sealed record (an epoch boundary gets a quote of its own).

        Raises:
            EvidenceForkedError: the worker was inherited through fork().
        """
        if not self._accepting:
            if self._forked:
                raise self._fork_error("observe()")
            return  # after close: the slot stays null
        if self.solo_if is not None and self.solo_if(record):
            self._put_solo(_Item(record.capsule_id, time.monotonic(), True, record))
        else:
            self._put((record.capsule_id, time.monotonic()))

    def observe_id(self, capsule_id: str, seq: int, epoch_boundary: bool) -> None:
        """The producer's id observer: queue this durable record. Non-blocking.

        Args:
            capsule_id: the record's capsule id.
            seq: its ledger sequence number (unused: the ledger is asked by id).
            epoch_boundary: whether it is the epoch-boundary capsule, which gets a
                quote of its own (read back from the ledger).

        Raises:
            EvidenceForkedError: the worker was inherited through fork().
        """
        if not self._accepting:  # the hot path's one test: a fork clears it too
            if self._forked:
                raise self._fork_error("observe_id()")
            return
        if epoch_boundary:
            self._put_solo(_Item(capsule_id, time.monotonic(), True, None))
        else:
            self._put((capsule_id, time.monotonic()))

    def submit(self, capsule_id: str) -> None:
        """Queue a capsule id that is already in the ledger (e.g. a backfill).

        Args:
            capsule_id: 64 lower-case hex digits.

        Raises:
            InputError: a malformed id, or one the ledger does not hold (in a batch
                it would fail every record quoted with it).
            EvidenceForkedError: the worker was inherited through fork().
        """
        if self._forked:
            raise self._fork_error("submit()")
        if not (isinstance(capsule_id, str) and is_hex64(capsule_id)):
            raise InputError(f"submit() takes a capsule id (64 lower-case hex digits), not {capsule_id!r:.80}")
        if not self.ledger.has_record(capsule_id):
            raise InputError(f"capsule {capsule_id[:16]}… is not in {_ledger_name(self.ledger)}; submit() queues "
                             "records already sealed there")
        if self._accepting:
            self._put((capsule_id, time.monotonic()))

    def _put_solo(self, item: _Item) -> None:
        """Queue a record for a quote of its own, once: attach() may learn of
        an epoch boundary both from the producer and by reading the ledger."""
        with self._stats_lock:
            if item.capsule_id in self._solo_seen:
                return
            self._solo_seen.add(item.capsule_id)
        self._put(item)

    def _put(self, item: Any, *, wake: bool = False) -> None:
        buf = self._buf
        buf.append(item)
        n = len(buf)
        if wake or n == 1 or n >= self.max_records or type(item) is not tuple:
            self._wake.set()

    # ------------------------------------------------------------------ lifecycle

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything queued before this call has been quoted (or has failed).

        Args:
            timeout: seconds to wait at most (None: no limit).

        Returns:
            True when done; False on timeout.

        Raises:
            EvidenceForkedError: in a forked process (the thread that would do it is not there).
        """
        if self._forked:
            raise self._fork_error("flush()")
        if not self._thread.is_alive():
            return not self._buf
        marker = _Flush()
        self._put(marker, wake=True)
        return marker.event.wait(timeout)

    def close(self, *, drain: bool = True, timeout: float | None = None) -> bool:
        """Stop. A batch already being quoted is finished (whole or not at all).
        Call before closing the ledger.

        In a process forked from the one that started it, only marks this copy
        closed: no wait for the parent's thread (not there), no lock or event
        the parent's thread may have held at the fork, no ledger or TPM call;
        the parent's worker is untouched. Why not raise: close() runs in
        ``with`` exits and ``finally`` blocks, where an error would hide the
        real one.

        Args:
            drain: quote what is queued first; otherwise those slots stay null.
            timeout: seconds to wait for the worker at most (None: no limit).

        Returns:
            True once the worker has ended; False if ``timeout`` passed first (a
            quote still under way: its batch may yet be written, so keep the
            ledger open until a later ``close()`` returns True).
        """
        if self._forked:  # _inherited already stopped it accepting
            return True
        self._accepting = False
        if not drain:
            self._discard = True
        self._put(_STOP, wake=True)
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def _fork_error(self, what: str) -> EvidenceForkedError:
        """The refusal of ``what`` on a worker inherited through fork(); names
        the ledger and the AK (its URI or TPM name: nothing secret)."""
        return EvidenceForkedError(
            f"{what}: the batch evidence worker for ledger {_ledger_name(self.ledger)} and AK "
            f"{_ak_name(self.quoter)} was started by process {self._pid}, and this is process {os.getpid()}, "
            f"forked from it: its worker thread (and TPM connection) belong to process {self._pid}, so nothing "
            "queued here would ever be quoted. Create a new BatchEvidence (or attach()) in this process, with "
            "a Ledger or Producer and a quoter opened there; nothing was queued")

    def __enter__(self) -> BatchEvidence:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ worker

    def _run(self) -> None:
        pending: list[tuple[str, float]] = []  # the batch being collected, oldest first
        stop = False
        while True:
            self._wake.clear()
            markers: list[_Flush] = []
            buf = self._buf
            taken = buf[: len(buf)]
            del buf[: len(taken)]  # appends that race this only land after the taken part
            for item in taken:
                if type(item) is tuple:
                    if self._discard:
                        self.stats.records_left_null += 1
                    else:
                        pending.append(item)
                elif item is _STOP:
                    stop = True
                elif isinstance(item, _Flush):
                    markers.append(item)
                elif self._discard:
                    self.stats.records_left_null += 1
                else:  # a solo record (epoch boundary): its own quote, now
                    self._quote_solo(item)
            if self._discard and pending:
                self.stats.records_left_null += len(pending)
                pending = []
            while len(pending) >= self.max_records:
                self._process(pending[: self.max_records])
                del pending[: self.max_records]
            now = time.monotonic()
            if pending and (markers or stop or now >= pending[0][1] + self.max_delay):
                self._process(pending)
                pending = []
            for m in markers:
                m.event.set()
            if stop and not self._buf:
                return
            if not stop:
                self._wake.wait(pending[0][1] + self.max_delay - now if pending else None)

    def _quote_solo(self, item: _Item) -> None:
        try:
            record = item.record if item.record is not None else self.ledger.get(item.capsule_id)
            if record is None:
                raise EvidenceError(f"no capsule {item.capsule_id} in the ledger")
            quote_record(record, self.quoter, ledger=self.ledger)
        except Exception as exc:  # the slot stays null; the seal is untouched
            self._failed(1, exc)
            return
        self.stats.solo_quoted += 1
        if self.on_batch is not None:
            self._notify([item.capsule_id])

    def _process(self, items: Sequence[tuple[str, float]]) -> None:
        if self._discard:
            self.stats.records_left_null += len(items)
            return
        ids = list(dict.fromkeys(cid for cid, _ in items))  # one leaf per record, in the order they were sealed
        try:
            root, first_proof = batch_root(ids)  # O(n) hashes, done once: the ledger rebuilds proofs on read
            started = time.monotonic()
            quote = self.quoter.take(root)
            self.stats.quote_seconds.append(time.monotonic() - started)
            write_batch(self.ledger, self._policy, ids, quote.shared_members(), root, first_proof)
        except Exception as exc:  # the whole batch stays null
            self._failed(len(ids), exc)
            return
        self._succeeded(ids)

    def _succeeded(self, ids: list[str]) -> None:
        with self._stats_lock:
            st = self.stats
            st.batches += 1
            st.records_quoted += len(ids)
            st.largest_batch = max(st.largest_batch, len(ids))
        if self.on_batch is not None:
            self._notify(ids)

    def _failed(self, count: int, exc: BaseException) -> None:
        with self._stats_lock:
            st = self.stats
            st.failed_batches += 1
            st.records_left_null += count
            st.last_error = f"{type(exc).__name__}: {exc}"
        log.warning("capseal.attest: %d record(s) left without evidence: %s", count, st.last_error)

    def _notify(self, ids: list[str]) -> None:
        try:
            self.on_batch(ids, time.monotonic())  # type: ignore[misc]
        except Exception:  # a callback never undoes a write
            pass


def _check_limits(max_records: Any, max_delay: Any) -> None:
    """Refuse (InputError, nothing started) batch limits the worker cannot
    keep. Why each: the worker waits ``max_delay`` seconds with
    ``Event.wait``, which raises OverflowError past ``threading.TIMEOUT_MAX``
    (inf included) and so killed the worker thread at its first batch, after
    which ``flush()`` answered True with the slots still null; a NaN delay
    never closes a batch by time and makes every wait return at once (a
    spinning CPU). ``max_records`` counts records: a whole number from 1."""
    count(max_records, "max_records")
    seconds(max_delay, "max_delay")


def _ledger_name(ledger: Any) -> str:
    """The ledger's file path (what LedgerForkedError names too)."""
    return str(getattr(ledger, "path", ledger))


def _ak_name(quoter: Any) -> str:
    """The AK's ``tpm2:`` URI (handle and TCTI) when the quoter has one, else
    its TPM name: public values only."""
    ref = getattr(getattr(quoter, "ak", None), "ref", None)
    if ref is not None:
        return str(ref.uri())
    return f"name {getattr(getattr(quoter, 'identity', None), 'name', '?')}"
