"""A ledger walked for verification, its rows read as a stream (what is kept
of each record is its id, in 16 bytes, in a file past a quarter of a
million ids), the per-row work shared among processes.

Two passes over the record rows, both inside one snapshot:

1. **the chains**: each row's hash is recomputed (in the worker processes),
   the links between rows are followed here, in order; each capsule's store
   facts are noted in :class:`~capseal.ledger.IdIndex` tables (16 bytes an
   id): that it is in the store, that a capsule chains to it, that it is
   backfilled, the first capsule superseding it; the keys named by custody
   statements are learnt.
2. **the records**: each row is verified (Class-1 checks with those store
   facts, signatures) in the worker processes, and handed on in seq order.

Rows are read here and sent to the workers in batches, a few batches ahead:
nothing holds more than a window of rows. A small ledger is checked in this
process (starting workers costs more than it saves).
"""

from __future__ import annotations

import multiprocessing
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .findings import Finding
from .ledger import IdIndex, StoredEntry, row_hash
from .record import RECEIVED_CAPSULE
from .verify import StoreMembers, _block

__all__ = ["Walk", "StoreFacts", "capsule_facts", "default_jobs", "run_batches", "store_findings", "is_open"]

#: rows sent to a worker at once
BATCH = 400
#: below this many rows a ledger is checked in this process only
POOL_FROM = 3000

MEMBER, HAS_CHILD, BACKFILLED = 1, 2, 4

Progress = Callable[[str, int, int], object]


def default_jobs() -> int:
    """How many worker processes check records: the CPUs this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


@dataclass
class StoreFacts:
    """What the store-level checks need to know of every capsule of a ledger."""

    ids: IdIndex = field(default_factory=lambda: IdIndex(1 << 16))  # capsule id -> flags
    superseded: IdIndex = field(default_factory=IdIndex)  # parent id -> seq of the first capsule superseding it
    custody: list[Any] = field(default_factory=list)  # custody statements of epoch-boundary capsules

    def close(self) -> None:
        """Give back the tables' temporary files (the facts are empty after)."""
        self.ids.close()
        self.superseded.close()

    def members(self) -> StoreMembers:
        """The capsule ids of the store, for :func:`capseal.verify.verify`."""
        ids = self.ids
        return StoreMembers(lambda cid: ids.has(cid, MEMBER))

    def add(self, seq: int, facts: tuple[Any, ...]) -> None:
        """Note one capsule's facts (from :func:`capsule_facts`)."""
        cid, parent, relation, backfilled, custody = facts
        if isinstance(cid, str):
            self.ids.add(cid, 0, MEMBER | (BACKFILLED if backfilled else 0))
        if isinstance(parent, str):
            self.ids.add(parent, 0, HAS_CHILD)
            if relation == "supersedes":
                self.superseded.add(parent, seq)
        if custody is not None:
            self.custody.append(custody)


def capsule_facts(capsule: Mapping[str, Any], custody: Any) -> tuple[Any, ...]:
    """A capsule's store facts: (capsule id, chain parent, relation, backfilled, custody statement)."""
    chain = capsule.get("chain")
    chain = chain if isinstance(chain, Mapping) else None
    block = _block(capsule, "chain")
    parent = chain.get("parent_capsule_id") if chain is not None else None
    relation = block.get("relation") if block is not None else None
    pm = _block(capsule, "provenance_mode")
    backfilled = pm is not None and pm.get("mode") == "backfilled"
    return (capsule.get("capsule_id"), parent if isinstance(parent, str) else None, relation, backfilled, custody)


def store_findings(capsule: Mapping[str, Any], seq: int, facts: StoreFacts) -> list[Finding]:
    """The store-level findings of one capsule of the ledger (concurrent
    supersedes, the ``duplicates`` collapse), as ``verify_store`` gives them."""
    out: list[Finding] = []
    chain = _block(capsule, "chain")
    if chain is None or not isinstance(chain.get("parent_capsule_id"), str):
        return out
    parent = chain["parent_capsule_id"]
    if chain.get("relation") == "supersedes" and facts.superseded.seq(parent) != seq:
        out.append(Finding("concurrent_supersedes", f"a later supersedes over {parent}; the earliest is "
                           "authoritative (§5.5.4)", severity="info", check=6))
    if chain.get("relation") == "duplicates":
        out.append(Finding("duplicate_collapsed", f"'duplicates' over {parent}: count the pair once, the "
                           "contemporaneous parent governing (§5.4.3)", severity="info", check=9))
        if facts.ids.has(parent, BACKFILLED):
            out.append(Finding("duplicate_parent_not_contemporaneous", f"'duplicates' parent {parent} is itself "
                               "backfilled (§5.4.3)", severity="info", check=9))
    return out


def is_open(capsule: Mapping[str, Any], facts: StoreFacts) -> str | None:
    """The status of a capsule's effect when it is planned or dispatched and no capsule chains to it."""
    effect = capsule.get("effect")
    status = effect.get("status") if isinstance(effect, Mapping) else None
    cid = capsule.get("capsule_id")
    if status in ("planned", "dispatched") and not (isinstance(cid, str) and facts.ids.has(cid, HAS_CHILD)):
        return str(status)
    return None


# ---------------------------------------------------------------- the workers' side

#: set in this process before the workers are forked; they read it
_STATE: dict[str, Any] = {}


def _pack(rows: list[StoredEntry]) -> list[tuple[Any, ...]]:
    """A batch as plain tuples, the cheapest form to send to a worker (see :func:`_unpack`)."""
    return [(e.seq, e.record_id, e.record_type, e.epistemic_type, e.links, e.nonce, e.body, e.prev_hash, e.row_hash,
             e.action_id, e.stream, e.tag, e.damage) for e in rows]


def _unpack(rows: list[Any]) -> list[StoredEntry]:
    """The rows of a batch :func:`_pack` made (rows given as entries are taken as they are)."""
    return [e if isinstance(e, StoredEntry) else StoredEntry(*e) for e in rows]


def _scan(rows: list[Any]) -> list[tuple[bool | None, Any]]:
    """Pass 1 for a batch: whether each row hash matches, and each capsule's store facts."""
    parse: Callable[[StoredEntry], Any] = _STATE["facts_of"]
    out: list[tuple[bool | None, Any]] = []
    for e in _unpack(rows):
        ok: bool | None = None
        if e.damage is None and len(e.prev_hash) == 64 and len(e.row_hash) == 64:
            try:
                ok = row_hash(e.prev_hash, e.header(), e.body) == e.row_hash
            except Exception:  # a header the hash cannot be computed over: the check here says so
                ok = None
        out.append((ok, parse(e) if e.damage is None and e.record_type == "capsule" else None))
    return out


def _check(rows: list[Any]) -> list[Any]:
    """Pass 2 for a batch: each row's report (None: checked by the caller's process)."""
    check: Callable[[StoredEntry], Any] = _STATE["check"]
    return [check(e) if e.damage is None and e.record_type in ("capsule", RECEIVED_CAPSULE) else None
            for e in _unpack(rows)]


def run_batches(fn: Callable[[list[StoredEntry]], list[Any]], rows: Iterable[StoredEntry], pool: Any,
                ) -> Iterator[tuple[StoredEntry, Any]]:
    """Each row with ``fn``'s result for it, in order; batches go to ``pool``
    (a few ahead), or are run here when there is none."""
    window: deque[tuple[list[StoredEntry], Any]] = deque()
    ahead = 2 * (getattr(pool, "_processes", 1) or 1) + 1

    def done(item: tuple[list[StoredEntry], Any]) -> Iterator[tuple[StoredEntry, Any]]:
        batch, pending = item
        yield from zip(batch, pending.get() if pool is not None else pending)

    batch: list[StoredEntry] = []
    for e in rows:
        batch.append(e)
        if len(batch) >= BATCH:
            window.append((batch, pool.apply_async(fn, (_pack(batch),)) if pool is not None else fn(batch)))
            batch = []
            while len(window) > ahead or (pool is None and window):
                yield from done(window.popleft())
    if batch:
        window.append((batch, pool.apply_async(fn, (_pack(batch),)) if pool is not None else fn(batch)))
    while window:
        yield from done(window.popleft())


class Walk:
    """One verification walk: the two passes, their workers and their progress.

    Args:
        ledger: the ledger (an AuditLedger), inside its snapshot.
        facts_of: a row -> its capsule's store facts (:func:`capsule_facts`), run in the workers.
        check: a row -> its report, run in the workers after pass 1 (reads :attr:`facts`).
        jobs: worker processes (None: one per CPU, when the ledger is large enough; 0 or 1: none).
        progress: called with (pass name, rows done, rows in all) now and then.
    """

    def __init__(self, ledger: Any, *, facts_of: Callable[[StoredEntry], Any], check: Callable[[StoredEntry], Any],
                 jobs: int | None, progress: Progress | None) -> None:
        self.ledger = ledger
        self.total = ledger.count()
        # sized for the ledger up front: a table that grows holds its old and new arrays at once
        self.facts = StoreFacts(ids=IdIndex(self.total))
        self._facts_of, self._check = facts_of, check
        self._progress = progress
        if jobs is None:
            jobs = default_jobs() if self.total >= POOL_FROM else 1
        self.jobs = max(1, jobs)

    def _pool(self) -> Any:
        _STATE.update(facts_of=self._facts_of, check=self._check)  # before the fork: the workers read it
        if self.jobs <= 1:
            return None
        return multiprocessing.get_context("fork").Pool(self.jobs)

    def _tick(self, name: str, rows: Iterator[tuple[StoredEntry, Any]]) -> Iterator[tuple[StoredEntry, Any]]:
        done = 0
        step = max(1, min(5000, self.total // 200 or 1))
        for item in rows:
            yield item
            done += 1
            if self._progress is not None and done % step == 0:
                self._progress(name, done, self.total)
        if self._progress is not None:
            self._progress(name, done, self.total)

    def chains(self, on_record: Callable[[StoredEntry], object]) -> list[str]:
        """Pass 1: the problems of both chains (``check_chain``), the store facts noted.

        Args:
            on_record: called with every row, in order.

        Returns:
            The problems, one sentence each.
        """
        damaged: list[str] = []
        index = IdIndex(self.total)  # the chain check's: each record id's first seq
        pool = self._pool()
        try:
            scanned = self._tick("chains", run_batches(_scan, self.ledger.entries(batch=2000, damaged=damaged),
                                                       pool))

            def rows() -> Iterator[tuple[StoredEntry, bool | None]]:
                for e, (ok, facts) in scanned:
                    if facts is not None and e.record_type == "capsule":
                        self.facts.add(e.seq, facts)
                    yield e, ok

            problems: list[str] = self.ledger.check_chain(on_record=on_record, rows=rows(), damaged=damaged,
                                                          index=index)
            return problems
        finally:
            _close(pool)
            index.close()

    def records(self) -> Iterator[tuple[StoredEntry, Any]]:
        """Pass 2: every row with its report from the workers (None for a
        row the caller checks itself: damaged, not a capsule), in seq order."""
        pool = self._pool()
        try:
            yield from self._tick("records", run_batches(_check, self.ledger.entries(batch=2000, damaged=[]), pool))
        finally:
            _close(pool)


def _close(pool: Any) -> None:
    if pool is not None:
        pool.terminate()
        pool.join()

