"""Batch evidence: one TPM quote per batch of sealed capsules (issue 4 item 3).

Why batches: a real TPM takes tens to hundreds of milliseconds per quote, and
an agent seals thousands of capsules per second. So the seal path only hands
the capsule id to this worker (:meth:`BatchEvidence.observe`, a non-blocking
queue put, run by the producer right after the record is durable) and never
waits on the TPM. The worker collects ids until ``max_records`` are waiting or
the oldest has waited ``max_delay`` seconds, builds the RFC 9162 Merkle tree
over their raw ids, takes ONE quote whose qualifyingData is the root, verifies
it, and writes every record's slot — the quote plus that record's inclusion
proof — in one ledger transaction.

What it promises:

* a record's slot is null until its batch lands, then filled and verified;
* a failed quote leaves its records null (counted in ``stats``): never a
  partial slot, never ``{}``;
* a batch is written whole or not at all (``Ledger.add_evidence_many``);
* ``close(drain=True)`` quotes everything queued; ``close(drain=False)``
  leaves what is still queued null;
* records named "solo" (the epoch-boundary capsule, see :mod:`.platform`)
  get a quote over their own id instead of a Merkle root.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from capseal.errors import EvidenceError

from . import merkle
from .evidence import evidence_for_batch
from .quoter import Quoter, quote_record, self_policy
from .verify import verify_evidence

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
    quote_seconds: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class _Item:
    capsule_id: str
    observed_at: float
    solo: bool = False
    record: Any = None


class _Flush:
    __slots__ = ("event",)

    def __init__(self) -> None:
        self.event = threading.Event()


_STOP = object()


class BatchEvidence:
    """The background worker. Use as ``producer.add_observer(batch.observe)``
    (or :func:`capseal.attest.attach`, which also quotes the epoch boundary).

    ``on_batch(capsule_ids, written_at)`` runs on the worker after a batch's
    slots are durable (the benchmark measures seal→evidence latency with it).
    ``solo_if(record)`` picks records that get a quote of their own.
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
        if max_records < 1 or max_delay < 0:
            raise ValueError("max_records >= 1 and max_delay >= 0")
        self.ledger = ledger
        self.quoter = quoter
        self.max_records = max_records
        self.max_delay = max_delay
        self.solo_if = solo_if
        self.on_batch = on_batch
        self.stats = BatchStats()
        self._policy = self_policy(quoter.identity)
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._accepting = True
        self._discard = False
        self._thread = threading.Thread(target=self._run, name="capseal-attest-batch", daemon=True)
        if start:
            self._thread.start()

    # ------------------------------------------------------------------ producer side (never blocks)

    def observe(self, record: Any) -> None:
        """The producer observer: queue this durable record's id. Non-blocking."""
        if not self._accepting:
            return  # after close: the slot stays null
        solo = bool(self.solo_if and self.solo_if(record))
        self._queue.put(_Item(record.capsule_id, time.monotonic(), solo, record if solo else None))

    def submit(self, capsule_id: str) -> None:
        """Queue a capsule id that is already in the ledger (e.g. a backfill)."""
        if self._accepting:
            self._queue.put(_Item(capsule_id, time.monotonic()))

    # ------------------------------------------------------------------ lifecycle

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything queued before this call has been quoted (or
        has failed). Returns False on timeout."""
        if not self._thread.is_alive():
            return self._queue.empty()
        marker = _Flush()
        self._queue.put(marker)
        return marker.event.wait(timeout)

    def close(self, *, drain: bool = True, timeout: float | None = None) -> None:
        """Stop. ``drain``: quote what is queued first; otherwise those slots
        stay null. A batch already being quoted is finished (whole or not at
        all). Call before closing the ledger."""
        self._accepting = False
        if not drain:
            self._discard = True
        self._queue.put(_STOP)
        if self._thread.is_alive():
            self._thread.join(timeout)

    def __enter__(self) -> BatchEvidence:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ worker

    def _run(self) -> None:
        stop = False
        while not stop:
            first = self._queue.get()
            batch: list[_Item] = []
            markers: list[_Flush] = []
            stop = self._take(first, batch, markers)
            if not stop and not markers and batch:
                deadline = batch[0].observed_at + self.max_delay
                while len(batch) < self.max_records:
                    remaining = deadline - time.monotonic()
                    try:
                        item = self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait()
                    except queue.Empty:
                        break
                    stop = self._take(item, batch, markers)
                    if stop or markers:
                        break
            if stop:  # drain: everything still queued joins the last batches
                while True:
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    self._take(item, batch, markers)
            for i in range(0, len(batch), self.max_records):
                self._process(batch[i : i + self.max_records])
            for m in markers:
                m.event.set()

    def _take(self, item: Any, batch: list[_Item], markers: list[_Flush]) -> bool:
        if item is _STOP:
            return True
        if isinstance(item, _Flush):
            markers.append(item)
        elif self._discard:
            self.stats.records_left_null += 1
        elif item.solo:
            self._quote_solo(item)
        else:
            batch.append(item)
        return False

    def _quote_solo(self, item: _Item) -> None:
        try:
            quote_record(item.record, self.quoter, ledger=self.ledger)
        except Exception as exc:  # the slot stays null; the seal is untouched
            self._failed(1, exc)
            return
        self.stats.solo_quoted += 1
        if self.on_batch is not None:
            self._notify([item.capsule_id])

    def _process(self, items: Sequence[_Item]) -> None:
        if self._discard:
            self.stats.records_left_null += len(items)
            return
        ids = list(dict.fromkeys(it.capsule_id for it in items))  # one leaf per record
        try:
            leaves = [bytes.fromhex(cid) for cid in ids]
            if any(len(leaf) != 32 for leaf in leaves):
                raise EvidenceError("a capsule id is not 32 bytes")
            tree = merkle.build(leaves)
            started = time.monotonic()
            quote = self.quoter.take(tree.root)
            self.stats.quote_seconds.append(time.monotonic() - started)
            shared = quote.shared_members()
            n = len(ids)
            slots = [(cid, evidence_for_batch(shared, tree.root, i, n, tree.proofs[i])) for i, cid in enumerate(ids)]
            self._verify_before_write(ids, leaves, tree, slots[0])
            self.ledger.add_evidence_many(slots)
        except Exception as exc:  # the whole batch stays null
            self._failed(len(ids), exc)
            return
        st = self.stats
        st.batches += 1
        st.records_quoted += len(ids)
        st.largest_batch = max(st.largest_batch, len(ids))
        if self.on_batch is not None:
            self._notify(ids)

    def _verify_before_write(self, ids: list[str], leaves: list[bytes], tree: merkle.Tree, first: tuple[str, Any]) -> None:
        """The auditor's full check on one slot (signature, magic, type, root
        as extraData, PCR digest, AK), then every record's inclusion proof:
        the quote members are shared, so this covers every slot."""
        result = verify_evidence(first[0], self._policy, evidence=first[1])
        if not result.ok:
            raise EvidenceError(f"batch quote did not verify ({result.status}); nothing written")
        n = len(ids)
        for i, leaf in enumerate(leaves):
            if not merkle.verify_inclusion(leaf, i, n, tree.proofs[i], tree.root):
                raise EvidenceError(f"inclusion proof {i} of {n} does not verify; nothing written")

    def _failed(self, count: int, exc: BaseException) -> None:
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
