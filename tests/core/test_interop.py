"""Interop: every capsule capseal seals is accepted by the reference package.

Over a generated matrix of 240 capsules (every verdict class, every effect
status, chains of each relation, references with each citation purpose,
cross_party at each rung, backfilled provenance, constraints, extensions):

* ``agent_action_capsule.verify`` (0.12.0) returns ok with no error finding and
  no ``assurance_overclaim``; the store-level run agrees;
* ``verify_producer_envelope`` accepts every Ed25519 envelope and
  ``verify_record_signature`` grades every record ``authored``;
* the reference's ``compute_capsule_id`` and JCS equal ours byte for byte;
* capseal's own ``verify_ledger`` says the ledger is ok.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import agent_action_capsule as ref
import pytest
from agent_action_capsule.canonical import jcs as ref_jcs
from agent_action_capsule.producer_envelope import verify_producer_envelope, verify_record_signature

import capseal
from capseal import Producer
from capseal.canonical import LOCAL_ONLY_FIELDS, canonical_bytes
from capseal.keys import UnsafeEphemeralSigner

from .. import matrix


@pytest.fixture(scope="module")
def sealed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[capseal.SealedRecord]]:
    path = tmp_path_factory.mktemp("interop") / "matrix.db"
    records: list[capseal.SealedRecord] = []
    with Producer("acme.example", "matrix-agent@1.0", UnsafeEphemeralSigner(), path) as producer:
        first_epoch = producer.epoch_record
        previous_contemporaneous: capseal.SealedRecord | None = None
        for spec, relation, hint in matrix.specs(240):
            if spec.get("disposition", {}).get("verdict_class") == "epoch_boundary":
                records.append(producer.rotate_epoch())  # only the producer writes a boundary (chained epoch_opens)
                continue
            if relation == "epoch_opens":  # refused from a caller: the boundaries above carry it
                relation = "follows"
            parent: capseal.SealedRecord | None = None
            if relation is not None and records:
                parent = previous_contemporaneous if hint == "backfilled-original" and previous_contemporaneous else records[-1]
            if parent is not None:
                # a reference must not name the chain parent
                spec["references"] = [r for r in spec.get("references", []) if r["digest"] != parent.capsule_id] or None
                if spec["references"] is None:
                    del spec["references"]
            record = producer.seal(spec, parent=parent, relation=relation or "follows") if parent else producer.seal(spec)
            records.append(record)
            pm = record.capsule.get("provenance_mode")
            if not (isinstance(pm, dict) and pm.get("mode") == "backfilled"):
                previous_contemporaneous = record
        records.insert(0, first_epoch)
    return path, records


def test_matrix_is_large_and_covers_every_value(sealed: tuple[Path, list[capseal.SealedRecord]]) -> None:
    _, records = sealed
    capsules = [r.capsule for r in records]
    assert len(capsules) >= 200
    verdicts = Counter(c.get("disposition", {}).get("verdict_class") for c in capsules)
    statuses = Counter(c.get("effect", {}).get("status") for c in capsules)
    relations = Counter(c.get("chain", {}).get("relation") for c in capsules)
    purposes = Counter(r.get("citation_purpose") for c in capsules for r in c.get("references", []))
    rungs = Counter(c["assurance"].get("cross_party_rung") for c in capsules)
    modes = Counter(c.get("provenance_mode", {}).get("mode") for c in capsules)
    time_rungs = Counter(c.get("provenance_mode", {}).get("time_rung") for c in capsules)
    assert set(matrix.VERDICTS) <= set(verdicts)
    assert set(matrix.STATUSES) <= set(statuses)
    assert set(matrix.RELATIONS) <= set(relations)
    assert set(matrix.PURPOSES) <= set(purposes)
    assert set(matrix.RUNGS) <= set(rungs)
    assert modes["backfilled"] >= 10 and time_rungs["witnessed"] >= 1
    assert sum(1 for c in capsules if "constraints" in c) >= 50


def test_reference_accepts_every_capsule(sealed: tuple[Path, list[capseal.SealedRecord]]) -> None:
    _, records = sealed
    for record in records:
        result = ref.verify(record.capsule)
        errors = [f for f in result.findings if f.severity == "error"]
        assert result.ok, (record.capsule["action_id"], errors)
        assert not errors
        assert "assurance_overclaim" not in [f.code for f in result.findings], record.capsule["action_id"]
        ours = capseal.verify(record.capsule)
        assert ours.ok
        assert ours.derived == result.assurance


def test_reference_store_level_accepts_the_ledger(sealed: tuple[Path, list[capseal.SealedRecord]]) -> None:
    _, records = sealed
    capsules = [r.capsule for r in records]
    theirs = ref.verify_store(capsules)
    ours = capseal.verify_store(capsules)
    assert all(r.ok for r in theirs)
    assert [[(f.check, f.code, f.severity) for f in r.findings] for r in ours] == \
           [[(f.check, f.code, f.severity) for f in r.findings] for r in theirs]


def test_every_envelope_verifies_with_the_reference(sealed: tuple[Path, list[capseal.SealedRecord]]) -> None:
    _, records = sealed
    for record in records:
        capsule = record.capsule
        result = verify_producer_envelope(capsule["capsule_id"], bytes.fromhex(capsule["signature"]))
        assert result.ok, [f.code for f in result.findings]
        assert result.public_key.hex() == capsule["key_id"]
        assert verify_record_signature(capsule) == ("authored", [])


def test_capsule_ids_and_jcs_equal_the_reference_byte_for_byte(sealed: tuple[Path, list[capseal.SealedRecord]]) -> None:
    _, records = sealed
    for record in records:
        capsule = record.capsule
        assert ref.compute_capsule_id(dict(capsule)) == capsule["capsule_id"] == capseal.capsule_id(capsule)
        preimage: dict[str, Any] = {k: v for k, v in capsule.items() if k not in LOCAL_ONLY_FIELDS}
        assert ref_jcs(preimage) == canonical_bytes(preimage)


def test_capseal_verifies_the_ledger(sealed: tuple[Path, list[capseal.SealedRecord]]) -> None:
    path, records = sealed
    report = capseal.verify_ledger(path)
    assert report.ok, [(r.seq, [f.code for f in r.findings]) for r in report.records if not r.ok]
    assert len(report.records) == len(records)
    assert all(r.signature == "authored" for r in report.records)
