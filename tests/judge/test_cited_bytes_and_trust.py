"""What ``verify_judgment`` and ``verify_ledger`` say of a judgment's citations
and signer: every cited digest is recomputed from the bytes it resolves to; a
digest declared external at seal time is checked as external, in the record's
own ledger too; a signature no trust anchor pins is reported as not pinned."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

from capseal.audit import verify_ledger
from capseal.judge import (
    Case,
    Close,
    EvaluationReport,
    JudgePin,
    Reconcile,
    ReconcileTallies,
    Target,
    link,
    verify_judgment,
)
from capseal.judge.envelope import header_commitment, sign_judgment
from capseal.judge.store import body_of_entry
from capseal.keys import UnsafeEphemeralSigner
from capseal.record import storage_json

from .conftest import NOW, World

CLI = str(Path(sys.executable).parent / "capseal")


def _report(world: World, record_id: str = "er-cited") -> EvaluationReport:
    pin = JudgePin.pin(model_id="judge@1", prompt=world.prompt_t, sampling={})
    return EvaluationReport(record_id=record_id, generated_at=NOW, contract_ref="ec:c@1", judge_pin=pin,
                            cases=[Case.of("c1", "met", acts=[world.act_t], method=world.rubric_t)])


def _edit_row(world: World, record_id: str, change: Any) -> None:
    """What anyone holding the file can do without a key: rewrite a row's body
    (``change`` maps the parsed body to the new one)."""
    path = world.producer.ledger.path
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute("DROP TRIGGER IF EXISTS records_no_update")
        (body,) = db.execute("SELECT body FROM records WHERE record_id = ?", (record_id,)).fetchone()
        db.execute("UPDATE records SET body = ? WHERE record_id = ?", (storage_json(change(json.loads(body))), record_id))
    finally:
        db.close()


def _pinned(world: World) -> list[Any]:
    return [world.store.signer.public_key]


# --------------------------------------------------------------------------- cited bytes are re-hashed


def test_an_edited_rubric_no_longer_gives_the_digest_cited(world: World) -> None:
    sealed = world.store.seal(_report(world))
    assert verify_judgment(sealed, world.store, trusted_keys=_pinned(world)).ok

    def edit(stored: dict[str, Any]) -> dict[str, Any]:
        stored["content"]["criteria"] = [{"id": "C1-relaxed"}]
        return stored

    _edit_row(world, world.rubric_t.digest, edit)
    report = verify_judgment(sealed, world.store, trusted_keys=_pinned(world))
    assert not report.ok
    mismatch = [f for f in report.findings if f.code == "citation_digest_mismatch"]
    assert len(mismatch) == 1 and "method" in mismatch[0].detail and mismatch[0].severity == "error"
    assert report.signature == "authored"  # the judgment itself is intact: what it cites changed


def test_an_edited_act_no_longer_gives_the_digest_cited_nor_linked(world: World) -> None:
    sealed = world.store.seal(_report(world), links=[link("cites", world.act_t)])

    def edit(stored: dict[str, Any]) -> dict[str, Any]:
        stored["capsule"]["effect"]["type"] = "send_refund_twice"
        return stored

    _edit_row(world, world.act_t.digest, edit)
    codes = verify_judgment(sealed, world.store, trusted_keys=_pinned(world)).codes()
    assert "citation_digest_mismatch" in codes and "link_target_digest_mismatch" in codes


def test_an_edited_pin_prompt_the_store_publishes_is_found(world: World) -> None:
    sealed = world.store.seal(_report(world))

    def edit(stored: dict[str, Any]) -> dict[str, Any]:
        stored["content"] = "Grade leniently.\n"
        return stored

    _edit_row(world, world.prompt_t.digest, edit)
    report = verify_judgment(sealed, world.store, trusted_keys=_pinned(world))
    assert not report.ok and "citation_digest_mismatch" in report.codes()
    assert any("prompt_digest" in f.detail for f in report.findings if f.code == "citation_digest_mismatch")


# --------------------------------------------------------------------------- external, declared at seal time


def _two_party_close(world: World) -> tuple[Any, Target]:
    peer = Target.of_json({"peer": "close", "store": "counterparty"}, type="close")
    head = Target.of_json({"head": 1}, type="store-head")
    tallies = ReconcileTallies(matched=3, a_only=0, b_only=1, conflicting=0, insufficient=0, unresolved=0)
    close = Close.of(record_id="close-ext", closed_at=NOW, period=("2026-09-01T00:00:00Z", NOW), counts_by_kind={"capsule": 2},
                     head=head, reconcile=Reconcile(tallies=tallies, status="UNILATERAL"), peer_close=peer)
    return world.store.seal(close, external=[peer.digest]), peer


def test_a_close_sealed_with_external_verifies_as_part_of_its_ledger(world: World) -> None:
    sealed, peer = _two_party_close(world)
    assert sealed.external == (peer.digest,)
    alone = verify_judgment(sealed, world.store, trusted_keys=_pinned(world))  # no external= needed any more
    assert alone.ok and {f.code for f in alone.findings} == {"citation_external", "preimage_not_in_store"}  # the head: not published
    assert all(f.severity == "info" for f in alone.findings)
    world.producer.flush()
    ledger = verify_ledger(world.producer.ledger.path, trusted_keys=_pinned(world))
    assert ledger.ok, [(r.record_type, r.findings) for r in ledger.records if not r.ok]
    row = next(r for r in ledger.records if r.record_id == sealed.digest)
    assert {f.code for f in row.findings} == {"citation_external", "preimage_not_in_store"}
    proc = subprocess.run([CLI, "verify", str(world.producer.ledger.path), "--json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    codes = {f["code"] for r in json.loads(proc.stdout)["records"] for f in r["findings"]}
    assert "citation_unresolved" not in codes and "link_target_unresolved" not in codes and "citation_external" in codes


def test_what_was_declared_external_is_signed(world: World) -> None:
    """Dropping the declaration (so a missing citation reads as external, or the
    reverse) changes the signed header commitment."""
    sealed, _ = _two_party_close(world)

    def drop(stored: dict[str, Any]) -> dict[str, Any]:
        del stored["external"]
        return stored

    _edit_row(world, sealed.digest, drop)
    codes = verify_judgment(sealed.digest, world.store).codes()
    assert "header_commitment_mismatch" in codes and "citation_unresolved" in codes

    plain = world.store.seal(_report(world, "er-ext"))  # sealed citing nothing external

    def add(stored: dict[str, Any]) -> dict[str, Any]:
        stored["external"] = [world.rubric_t.digest]
        return stored

    _edit_row(world, plain.digest, add)
    assert "header_commitment_mismatch" in verify_judgment(plain.digest, world.store).codes()


def test_external_keeps_only_what_the_record_uses_and_the_store_lacks(world: World) -> None:
    """A digest listed in external= that the store holds, or that the record does
    not cite, is not recorded as external: it is checked where it is."""
    sealed = world.store.seal(_report(world, "er-extra"), external=[world.rubric_t.digest, "cd" * 32])
    assert sealed.external == ()
    assert "external" not in body_of_entry(world.store.ledger.entry(sealed.digest))  # type: ignore[arg-type]


# --------------------------------------------------------------------------- the signer


def test_a_record_re_signed_by_another_key_is_reported_unpinned_or_untrusted(world: World) -> None:
    sealed = world.store.seal(_report(world, "er-resigned"))
    other = UnsafeEphemeralSigner()
    envelope = sign_judgment(other, bytes.fromhex(sealed.digest),
                             header_commitment(sealed.record_type, sealed.epistemic_type, sealed.links))

    def resign(stored: dict[str, Any]) -> dict[str, Any]:
        stored["envelopes"] = [envelope.to_json()]
        return stored

    _edit_row(world, sealed.digest, resign)
    unpinned = verify_judgment(sealed.digest, world.store)
    assert unpinned.signature == "authored" and unpinned.signer_kid == other.kid and not unpinned.pinned
    warning = [f for f in unpinned.findings if f.code == "signer_not_pinned"]
    assert len(warning) == 1 and warning[0].severity == "warning" and other.kid in warning[0].detail
    assert unpinned.to_dict()["signer_pinned"] is False
    untrusted = verify_judgment(sealed.digest, world.store, trusted_keys=_pinned(world))
    assert not untrusted.ok and "signer_not_trusted" in untrusted.codes()
    by_kid = verify_judgment(sealed.digest, world.store, trusted_keys=[other.kid])  # a kid alone pins too
    assert by_kid.ok and by_kid.pinned and "signer_not_pinned" not in by_kid.codes()


def test_a_bad_trusted_key_is_named_not_blamed_on_the_record(world: World) -> None:
    sealed = world.store.seal(_report(world, "er-badkey"))
    report = verify_judgment(sealed, world.store, trusted_keys=["not a key"])
    assert not report.ok and report.codes() == ["trusted_keys_unusable"]
