"""Sealing speed: capseal beside the reference producer, the bare floor and the
fsync floor, in one run of rotating rounds.

Every arm seals the same typical capsule (effect + disposition + constraints +
chain) with a software Ed25519 key:

  * reference: agent-action-capsule 0.12.0 ``Capsule(...).seal()`` plus an
    Ed25519 AAC profile envelope (cbor2 + cryptography);
  * bare floor: JCS (json fast path), SHA-256, COSE_Sign1, Ed25519 sign;
  * capseal, no ledger: the ``Producer`` seal path on one thread (assemble,
    canonical bytes, strict model, Class-1 self-check, sign, the record);
  * raw WAL insert (the fsync floor): one row of a sealed record's size into
    an SQLite table in WAL mode with ``synchronous=FULL``, one commit per row;
  * capseal durable: ``seal()`` from one thread (one commit per record),
    ``submit()`` from one thread then ``flush()``, and ``seal()`` from 4
    threads at once (group commit).

Each round runs every arm once, the order rotating by one arm a round
(``_common.rotating_rounds``): this host's speed drifts by a third or more
over seconds, so each ratio is taken within a round and the median of the
rounds' ratios is printed with its range. For each durable arm the bench also
prints the records per fsynced commit and the producer's CPU per durable
record (``time.process_time()``: every thread of this process, the committer
included), summed over the rounds, and, from a short run of its own after
the rounds, the pages written to the WAL per commit and per record (read
from the ``-wal`` file's frames: the same on any host, unlike the rates).

Usage: python bench/seal.py [--n 3000] [--rounds 7] [--json]
"""

from __future__ import annotations

import sys as _sys
from pathlib import Path as _Path

_sys.path.insert(0, str(_Path(__file__).resolve().parent))
import argparse
import hashlib
import json
import os
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import cbor2
from _common import PARENT, median, next_id, rotating_rounds  # noqa: E402
from _common import typical_spec as _typical  # noqa: E402
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from capseal import Producer  # noqa: E402
from capseal.keys import UnsafeEphemeralSigner  # noqa: E402


def loop_rate(fn: Callable[[int], Any], n: int) -> float:
    """``fn(next_id())`` n times on this thread, per second."""
    ids = [next_id() for _ in range(n)]
    start = time.perf_counter()
    for i in ids:
        fn(i)
    return n / (time.perf_counter() - start)


def reference_sealer() -> Callable[[int], bytes]:
    from agent_action_capsule import AssuranceBlock, Capsule, Chain, ConstraintRecord, Disposition, EffectRecord

    key = Ed25519PrivateKey.generate()
    kid = key.public_key().public_bytes_raw()
    protected = cbor2.dumps({1: -8, 3: "application/agent-action-capsule-id", 4: kid})

    def seal(i: int) -> bytes:
        capsule = Capsule(
            spec_version="draft-mih-scitt-agent-action-capsule-05", format_version="4", canonicalization_id="jcs",
            action_id=f"act-{i}", action_type="decide", operator="acme", developer="buyer-agent@1.4",
            timestamp="2026-11-30T00:00:00Z",
            effect=EffectRecord(status="confirmed", type="write_order", request_digest="a" * 64, response_digest="b" * 64,
                                irreversibility_class="one_way_recoverable", effect_attestation="gate_executed"),
            disposition=Disposition(decision="accept", approver="policy", human_disposed=False, verdict_class="executed"),
            constraints=(ConstraintRecord(id="com.example.amount_ceiling", check_type="com.example.threshold", result="pass",
                                          severity="high", blocking=True, evidence_digest="c" * 64),),
            chain=Chain(parent_capsule_id=PARENT, relation="follows"),
            assurance=AssuranceBlock(attestation_mode="self_attested", effect_mode="confirmed", ledger_mode="chained"),
        )
        sealed = capsule.seal()
        cid = sealed["capsule_id"] if isinstance(sealed, dict) else sealed.capsule_id
        payload = bytes.fromhex(cid)
        sig = key.sign(cbor2.dumps(["Signature1", protected, b"", payload]))
        return cbor2.dumps(cbor2.CBORTag(18, [protected, {}, payload, sig]))

    return seal


def floor_sealer() -> Callable[[int], bytes]:
    key = Ed25519PrivateKey.generate()
    kid = key.public_key().public_bytes_raw()
    protected = cbor2.dumps({1: -8, 3: "application/agent-action-capsule-id", 4: kid})
    base = {"spec_version": "draft-mih-scitt-agent-action-capsule-05", "format_version": "4", "canonicalization_id": "jcs",
            "operator": "acme", "developer": "buyer-agent@1.4", "timestamp": "2026-11-30T00:00:00Z",
            "assurance": {"attestation_mode": "self_attested", "effect_mode": "confirmed", "ledger_mode": "chained"}}

    def seal(i: int) -> bytes:
        capsule = {**base, **_typical(i, chained=True)}
        raw = json.dumps(capsule, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
        payload = hashlib.sha256(raw).digest()
        sig = key.sign(cbor2.dumps(["Signature1", protected, b"", payload]))
        return cbor2.dumps(cbor2.CBORTag(18, [protected, {}, payload, sig]))

    return seal


class RawInsert:
    """The fsync floor: one row per transaction into a WAL-mode SQLite file
    with ``synchronous=FULL`` (what a capseal ledger uses), the row a blob of
    a sealed record's size under an integer key; nothing else."""

    def __init__(self, path: str, body: bytes, n: int) -> None:
        self.path = path
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute("CREATE TABLE rows (seq INTEGER PRIMARY KEY, body BLOB NOT NULL)")
        self.body, self.n = body, n
        self.cpu = Counted()

    def pages(self, n: int) -> tuple[float, float]:
        """WAL pages per commit (and per row: the same) over ``n`` commits."""
        kept, self.n = self.n, n
        try:
            per_commit, _, _ = wal_pages(self.path, self.rate)
        finally:
            self.n = kept
        return per_commit, per_commit

    def rate(self) -> float:
        db, body = self.db, self.body
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(self.n):
            db.execute("BEGIN IMMEDIATE")
            db.execute("INSERT INTO rows(body) VALUES (?)", (body,))
            db.execute("COMMIT")
        wall = time.perf_counter() - start
        self.cpu.add(time.process_time() - cpu, self.n, self.n)
        return self.n / wall

    def close(self) -> None:
        self.db.close()


def wal_frames(path: str) -> tuple[int, int]:
    """Pages and commits in the ``-wal`` of the file at ``path`` since it was
    last reset: the frames after its header that carry its salt (a commit
    frame records the database size; the others hold 0 there)."""
    try:
        with open(path + "-wal", "rb") as fh:
            data = fh.read()
    except OSError:
        return 0, 0
    if len(data) < 32:
        return 0, 0
    page = int.from_bytes(data[8:12], "big")
    salt = data[16:24]
    frames = commits = 0
    at = 32
    while at + 24 + page <= len(data) and data[at + 8 : at + 16] == salt:
        frames += 1
        commits += int.from_bytes(data[at + 4 : at + 8], "big") != 0
        at += 24 + page
    return frames, commits


def wal_pages(path: str, run: Callable[[], Any]) -> tuple[float, int, int]:
    """WAL pages per commit while ``run()`` writes to the file at ``path``
    (the WAL emptied first; keep the run under the autocheckpoint's 1000
    pages). Returns pages per commit, pages and commits."""
    db = sqlite3.connect(path)
    try:
        busy = db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
    finally:
        db.close()
    if busy:
        return float("nan"), 0, 0
    run()
    frames, commits = wal_frames(path)
    return frames / max(commits, 1), frames, commits


class Counted:
    """CPU seconds, records and commits summed over the rounds of one arm."""

    def __init__(self) -> None:
        self.seconds, self.records, self.commits = 0.0, 0, 0

    def add(self, seconds: float, records: int, commits: int) -> None:
        self.seconds += seconds
        self.records += records
        self.commits += commits

    def us_per_record(self) -> float:
        return 1e6 * self.seconds / max(self.records, 1)

    def per_commit(self) -> float:
        return self.records / max(self.commits, 1)


class Durable:
    """One producer on a ledger of its own, kept open across rounds (its
    epoch boundary and first commit are not measured); its records chain to
    a record of that ledger, as a producer refuses an unknown parent."""

    def __init__(self, tmp: str, n: int, run: Callable[[Durable], None]) -> None:
        self.path = os.path.join(tmp, f"durable-{next_id()}.db")
        self.producer = Producer("acme", "buyer-agent@1.4", UnsafeEphemeralSigner(), self.path)
        self.parent = self.producer.seal(_typical(-next_id() - 1)).capsule_id
        self.n, self._run = n, run
        self.cpu = Counted()

    def spec(self, i: int) -> dict[str, Any]:
        return _typical(i, chained=True, parent=self.parent)

    def pages(self, n: int) -> tuple[float, float]:
        """WAL pages per commit and per record while ``n`` records are sealed as the rounds seal them."""
        records = self.producer.ledger.stats.records
        kept, self.n = self.n, n
        try:
            per_commit, frames, _ = wal_pages(self.path, lambda: self._run(self))
        finally:
            self.n = kept
        return per_commit, frames / max(self.producer.ledger.stats.records - records, 1)

    def rate(self) -> float:
        stats = self.producer.ledger.stats
        commits, records = stats.commits, stats.records
        start, cpu = time.perf_counter(), time.process_time()
        self._run(self)
        wall = time.perf_counter() - start
        self.cpu.add(time.process_time() - cpu, stats.records - records, stats.commits - commits)
        return (stats.records - records) / wall

    def close(self) -> None:
        self.producer.close()


def seal_one_thread(arm: Durable) -> None:
    producer = arm.producer
    for i in [next_id() for _ in range(arm.n)]:
        producer.seal(arm.spec(i))


def submit_then_flush(arm: Durable) -> None:
    producer = arm.producer
    for i in [next_id() for _ in range(arm.n)]:
        producer.submit(arm.spec(i))
    producer.flush()


def seal_threads(threads: int) -> Callable[[Durable], None]:
    def run(arm: Durable) -> None:
        producer = arm.producer
        ids = [next_id() for _ in range(arm.n - arm.n % threads)]

        def work(mine: list[int]) -> None:
            for i in mine:
                producer.seal(arm.spec(i))

        pool = [threading.Thread(target=work, args=(ids[t::threads],)) for t in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()

    return run


def ratios(figures: dict[str, list[float]], top: str, bottom: str) -> tuple[float, float, float]:
    """Median, lowest and highest of the per-round ratios ``top / bottom``."""
    per_round = [a / b for a, b in zip(figures[top], figures[bottom])]
    return median(per_round), min(per_round), max(per_round)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=3000, help="records per arm and round")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    n = args.n

    with tempfile.TemporaryDirectory(prefix="capseal-bench-seal-") as tmp:
        bare = Producer("acme", "buyer-agent@1.4", UnsafeEphemeralSigner(), os.path.join(tmp, "bare.db"))
        bare_parent = bare.seal(_typical(-next_id() - 1)).capsule_id

        if hasattr(bare, "_sign_here"):
            def capseal_no_ledger(i: int) -> Any:
                # private on purpose: capseal's whole sealing path on this thread, without the ledger
                return bare._sign_here(bare._prepare(_typical(i, chained=True, parent=bare_parent)))
        else:  # the same path before the producer's split (compare.py --scripts head)
            def capseal_no_ledger(i: int) -> Any:
                old: Any = bare
                return old._sign(old._assemble(_typical(i, chained=True, parent=bare_parent)))

        durable = {
            "seal() 1 thread": Durable(tmp, n, seal_one_thread),
            "submit()+flush()": Durable(tmp, n, submit_then_flush),
            "seal() 4 threads": Durable(tmp, n, seal_threads(4)),
        }
        record = durable["seal() 1 thread"].producer.seal(durable["seal() 1 thread"].spec(next_id()))
        raw = RawInsert(os.path.join(tmp, "raw.db"), record.body_bytes(), n)
        reference, floor = reference_sealer(), floor_sealer()
        arms: dict[str, Callable[[], float]] = {
            "reference": lambda: loop_rate(reference, n),
            "bare floor": lambda: loop_rate(floor, n),
            "capseal, no ledger": lambda: loop_rate(capseal_no_ledger, n),
            "raw WAL insert": raw.rate,
        }
        arms.update({name: arm.rate for name, arm in durable.items()})
        try:
            figures = rotating_rounds(arms, args.rounds)
            # short enough to stay under the autocheckpoint (1000 pages) in every arm
            pages = {"raw WAL insert": raw.pages(100), "seal() 1 thread": durable["seal() 1 thread"].pages(100),
                     "submit()+flush()": durable["submit()+flush()"].pages(300),
                     "seal() 4 threads": durable["seal() 4 threads"].pages(120)}
        finally:
            bare.close()
            raw.close()
            for arm in durable.values():
                arm.close()

    compared = {
        "capseal, no ledger / reference": ratios(figures, "capseal, no ledger", "reference"),
        "capseal, no ledger / bare floor": ratios(figures, "capseal, no ledger", "bare floor"),
        "bare floor / reference": ratios(figures, "bare floor", "reference"),
        "seal() 1 thread / raw WAL insert": ratios(figures, "seal() 1 thread", "raw WAL insert"),
        "submit()+flush() / capseal, no ledger": ratios(figures, "submit()+flush()", "capseal, no ledger"),
        "seal() 4 threads / seal() 1 thread": ratios(figures, "seal() 4 threads", "seal() 1 thread"),
    }
    counted = {name: arm.cpu for name, arm in durable.items()}
    counted["raw WAL insert"] = raw.cpu
    out = {
        "n": n, "rounds": args.rounds,
        "median_per_s": {name: median(values) for name, values in figures.items()},
        "per_round_per_s": figures,
        "ratios": {name: {"median": mid, "min": lo, "max": hi} for name, (mid, lo, hi) in compared.items()},
        "cpu_us_per_durable_record": {name: c.us_per_record() for name, c in counted.items()},
        "records_per_commit": {name: c.per_commit() for name, c in counted.items()},
        "wal_pages_per_commit": {name: p[0] for name, p in pages.items()},
        "wal_pages_per_record": {name: p[1] for name, p in pages.items()},
    }
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"sealing a typical capsule (effect + disposition + constraints + chain), software Ed25519, n={n} per arm "
          f"and round; medians of {args.rounds} rotating rounds")
    for name, value in out["median_per_s"].items():
        line = f"  {name:<22}{value:>9.0f} /s"
        if name in counted:
            c = counted[name]
            line += f"   {c.per_commit():6.1f} records per fsynced commit, CPU {c.us_per_record():5.0f} µs per record"
        print(line)
    print("  WAL pages written (a short run of each after the rounds):")
    for name, (per_commit, per_record) in pages.items():
        print(f"    {name:<22}{per_commit:6.2f} per commit  {per_record:6.2f} per record")
    print("  per-round ratios (median, range):")
    for name, (mid, lo, hi) in compared.items():
        print(f"    {name:<40}{mid:6.2f}x  ({lo:.2f}–{hi:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
