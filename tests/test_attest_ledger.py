# ruff: noqa: F811  (pytest fixtures imported from test_attest_support are redefined as parameters)
"""The ledger side of batch evidence: ``Ledger.add_evidence_many`` (all or
none, serialized bodies byte-identical to the slot, hash chain and export
intact) and evidence writers never starved by a busy committer."""

from __future__ import annotations

import io
import json
import os
import threading
from pathlib import Path

import pytest

from capseal import Ledger, Producer
from capseal.attest import merkle
from capseal.attest.evidence import BatchBodies, evidence_for_batch
from capseal.errors import LedgerError
from capseal.keys import UnsafeEphemeralSigner
from capseal.record import dumps_canonical

from .test_attest_support import producer, spec  # noqa: F401

SHARED = {
    "kind": "tpm2-quote", "attest": "AAAA", "signature": "BBBB", "pcr_selection": "sha256:0",
    "pcr_values": {"sha256": {"0": "00" * 32}}, "ak_public": "-----BEGIN PUBLIC KEY-----\nX\n-----END PUBLIC KEY-----\n",
    "ak_name": "000b" + "11" * 32, "ak_tpm_public": "CCCC", "ak_qualified_name": "000b" + "22" * 32,
    "device": {"manufacturer": "IBM", "vendor": "SW   TPM", "firmware": "1.2.3.4", "software": True},
    "taken_at": "2026-01-01T00:00:00.000Z",
    "tpm_clock": {"clock": 1, "reset_count": 2, "restart_count": 3, "safe": True, "firmware_version": "00" * 8,
                  "obfuscated": ["firmware_version", "reset_count", "restart_count"]},
}


def test_serialized_bodies_are_the_canonical_slot() -> None:
    for n in (1, 2, 3, 17, 64):
        leaves = [os.urandom(32) for _ in range(n)]
        tree = merkle.build(leaves)
        bodies = BatchBodies(SHARED, tree.root, n)
        for i in range(n):
            slot = evidence_for_batch(SHARED, tree.root, i, n, tree.proofs[i])
            assert bodies.body(i, tree.proofs[i]) == dumps_canonical(slot)
            assert json.loads(bodies.body(i, tree.proofs[i])) == slot
    with pytest.raises(ValueError):
        BatchBodies({**SHARED, "binding": {}}, bytes(32), 1)


def test_add_evidence_many_is_all_or_nothing_and_chained(producer: Producer, tmp_path: Path) -> None:
    ids = [producer.seal(spec(i)).capsule_id for i in range(6)]
    led = producer.ledger
    tree = merkle.build([bytes.fromhex(c) for c in ids])
    bodies = BatchBodies(SHARED, tree.root, len(ids))
    items: list[tuple[str, dict | bytes]] = [(c, bodies.body(i, tree.proofs[i])) for i, c in enumerate(ids)]
    # an unknown record refuses the whole batch: nothing is written
    with pytest.raises(LedgerError):
        led.add_evidence_many([*items[:3], ("ff" * 32, items[3][1]), *items[4:]])
    assert list(led.evidence_entries()) == []
    for bad in (b"{}", b"[1]", {}):
        with pytest.raises(ValueError):
            led.add_evidence_many([(ids[0], bad)])  # type: ignore[list-item]
    written = led.add_evidence_many(items[:4] + [(ids[4], evidence_for_batch(SHARED, tree.root, 4, 6, tree.proofs[4]))])
    assert written == 5 and [e.record_id for e in led.evidence_entries()] == ids[:5]
    led.add_evidence(ids[5], json.loads(items[5][1]))  # the single-row path chains on
    assert led.check_chain() == []
    for i, cid in enumerate(ids):
        assert led.evidence_history(cid) == [None, evidence_for_batch(SHARED, tree.root, i, 6, tree.proofs[i])]
    # export → import is byte-identical, evidence rows included
    out = io.BytesIO()
    led.export_jsonl(out)
    with Ledger.import_jsonl(io.BytesIO(out.getvalue()), tmp_path / "copy.db") as copy:
        again = io.BytesIO()
        copy.export_jsonl(again)
        assert again.getvalue() == out.getvalue()


def test_evidence_writes_are_not_starved_by_a_busy_committer(tmp_path: Path) -> None:
    """Liveness: while one thread keeps appending, a batch of evidence gets its
    turn at the write lock (the sealer stops once the evidence is in, or at a
    hard cap). Starvation itself is probabilistic and not forced here; the
    committer steps aside for a waiting evidence writer (Ledger._side_write)."""
    with Producer("acme.example", "agent@1", UnsafeEphemeralSigner(), tmp_path / "l.db") as p:
        ids = [p.submit(spec(i)).capsule_id for i in range(200)]
        p.flush()
        written = threading.Event()
        sealed = [0]

        def sealer() -> None:
            i = 1000
            while not written.is_set() and sealed[0] < 200_000:
                p.submit(spec(i))
                i += 1
                sealed[0] += 1
            p.flush()

        t = threading.Thread(target=sealer)
        t.start()
        tree = merkle.build([bytes.fromhex(c) for c in ids])
        bodies = BatchBodies(SHARED, tree.root, len(ids))
        p.ledger.add_evidence_many([(c, bodies.body(i, tree.proofs[i])) for i, c in enumerate(ids)])
        written.set()
        t.join()
        assert sealed[0] < 200_000  # the evidence landed while sealing was still going on
        assert all(p.ledger.current_evidence(c) is not None for c in ids)
        assert p.ledger.check_chain() == []
