"""Issue 5 item 1 and 6: the store header, sealing with any signer, verification
(signature, shape, type, citations — never correctness), and an epistemic type
that cannot be changed after commit."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from capseal import Producer
from capseal.audit import verify_ledger
from capseal.canonical import json_digest
from capseal.errors import JudgmentRefusedError
from capseal.judge import (
    CONTENT_TYPE,
    EPISTEMIC_TYPES,
    Case,
    EvaluationReport,
    HumanRating,
    JudgePin,
    JudgmentStore,
    SealedJudgment,
    Target,
    link,
    verify_entry,
    verify_judgment,
)
from capseal.judge.envelope import HEADER_LABEL
from capseal.keys import UnsafeEphemeralSigner
from capseal.record import storage_json

from .conftest import NOW, World


def report(world: World, verdict: str = "met", record_id: str = "er-1") -> EvaluationReport:
    pin = JudgePin.pin(model_id="judge@1", prompt=world.prompt_t, sampling={"temperature_micros": 0})
    return EvaluationReport(record_id=record_id, generated_at=NOW, contract_ref="ec:c@1", judge_pin=pin,
                            cases=[Case.of("c1", verdict, acts=[world.act_t], method=world.rubric_t)])


def rating(world: World, label: str = "met") -> HumanRating:
    packet = world.store.put_json({"case_id": "c1", "acts": [world.act_t.digest], "model_verdict_shown": False}, type="rated-case")
    return HumanRating.of(record_id="hr-1", rated_at=NOW, rater_ref="principal:r-1", case=packet, label=label)


# --------------------------------------------------------------------------- the store header


def test_store_header_of_a_judgment_record(world: World) -> None:
    sealed = world.store.seal(report(world), links=[link("cites", world.act_t)])
    entry = world.store.ledger.entry(sealed.digest)
    assert entry is not None
    header = entry.header()
    assert set(header) == {"seq", "record_id", "record_type", "epistemic_type", "links", "nonce"}
    assert header["record_id"] == sealed.digest == json_digest(sealed.body)
    assert header["record_type"] == "judge:evaluation-report/v1"
    assert header["epistemic_type"] == "semantic_judgment" and header["epistemic_type"] in EPISTEMIC_TYPES
    assert header["links"] == [{"type": "cites", "target": world.act.capsule_id}]
    assert len(bytes.fromhex(header["nonce"])) == 16  # 128 fresh random bits per record
    other = world.store.seal(report(world, record_id="er-2"))
    assert other.nonce != sealed.nonce and other.seq == sealed.seq + 1


@pytest.mark.parametrize(
    "make, etype",
    [(report, "semantic_judgment"), (rating, "human_report")],
)
def test_epistemic_type_comes_from_the_shape(world: World, make: Any, etype: str) -> None:
    record = make(world)
    assert record.epistemic_type == etype
    assert world.store.seal(record).epistemic_type == etype


def test_seal_has_no_type_parameter_and_records_have_no_setter(world: World) -> None:
    sealed = world.store.seal(report(world))
    with pytest.raises(TypeError):
        world.store.seal(report(world, record_id="er-x"), epistemic_type="observed_event")  # type: ignore[call-arg]
    with pytest.raises(dataclasses.FrozenInstanceError):
        sealed.epistemic_type = "observed_event"  # type: ignore[misc]
    model = report(world)
    with pytest.raises((AttributeError, ValueError)):  # frozen: pydantic refuses any assignment
        model.epistemic_type = "observed_event"  # type: ignore[misc]
    with pytest.raises((AttributeError, ValueError)):  # frozen: pydantic refuses any assignment
        model.cases = []  # type: ignore[misc]


# --------------------------------------------------------------------------- a type fixed at commit


def test_a_sealed_type_cannot_be_changed_only_superseded(world: World) -> None:
    """The rating was the wrong kind of record: a re-seal is refused, a forged
    header fails verification, and the correction is a new record (new id) that
    supersedes it — while the old one still verifies."""
    store = world.store
    old = store.seal(rating(world))
    with pytest.raises(JudgmentRefusedError) as caught:
        store.seal(rating(world))
    assert caught.value.rule == "record_already_sealed"

    entry = store.ledger.entry(old.digest)
    assert entry is not None
    forged = dataclasses.replace(entry, epistemic_type="observed_event")
    report_forged = verify_entry(forged, ledger=store.ledger, keys=_keys())
    assert not report_forged.ok
    assert {"epistemic_type_mismatch", "header_commitment_mismatch"} <= {f.code for f in report_forged.findings}
    assert report_forged.signature == "invalid"

    new = store.supersede(old, report(world))
    assert new.digest != old.digest and new.epistemic_type == "semantic_judgment"
    assert {"type": "supersedes", "target": old.digest} in new.links
    for record in (old, new):
        result = verify_judgment(record, store)
        assert result.ok, result.findings
    assert store.get(old.digest) == old  # untouched
    assert store.get(old.digest).epistemic_type == "human_report"  # type: ignore[union-attr]


def test_supersede_needs_a_judgment_in_this_store(world: World) -> None:
    with pytest.raises(JudgmentRefusedError) as caught:
        world.store.supersede("ab" * 32, report(world))
    assert caught.value.rule == "link_target_unresolved"


# --------------------------------------------------------------------------- sealing with any signer


@pytest.mark.parametrize("alg", ["EdDSA", "ES256", "ES384", "PS256"])
def test_seal_and_verify_with_any_software_key(alg: str, tmp_path: Path) -> None:
    signer = UnsafeEphemeralSigner(alg)
    with Producer("example-org", "agent@1", signer, tmp_path / "l.db") as producer:
        store = JudgmentStore(producer.ledger, signer)
        act = producer.seal({"action_id": "a1", "action_type": "fyi"})
        packet = store.put_json({"case": "a1"}, type="rated-case")
        sealed = store.seal(HumanRating.of(record_id="hr", rated_at=NOW, rater_ref="principal:r", case=packet, label="met"), links=[link("cites", Target.of_capsule(act))])
        result = verify_judgment(sealed, store, trusted_keys=[signer.public_key])
        assert result.ok and result.signature == "authored" and result.signer_kid == signer.kid
        env = sealed.envelopes[0]
        assert env.alg == alg and env.kid == signer.kid
    report = verify_ledger(tmp_path / "l.db")
    assert report.ok, report.to_dict()
    kinds = {r.record_type for r in report.records}
    assert {"capsule", "judge:artifact/v1", "judge:human-rating/v1"} <= kinds


def test_envelope_is_cose_sign1_over_the_raw_digest_with_its_own_content_type(world: World) -> None:
    from capseal.cose import decode_sign1
    from capseal.envelope import verify_profile_envelope

    sealed = world.store.seal(report(world))
    cose = sealed.envelopes[0].cose
    sign1 = decode_sign1(cose)  # tag 18 and an empty unprotected header, or it refuses
    header = sign1.header
    assert cose[0] == 0xD2 and sign1.payload == bytes.fromhex(sealed.digest)
    assert header[3] == CONTENT_TYPE != "application/agent-action-capsule-id"
    assert set(header) == {1, 3, 4, HEADER_LABEL}
    # it can never pass as a capsule's AAC profile envelope
    assert not verify_profile_envelope(sealed.digest, cose).ok


def test_untrusted_signer_is_an_error_when_trust_is_given(world: World) -> None:
    sealed = world.store.seal(report(world))
    result = verify_judgment(sealed, world.store, trusted_keys=[UnsafeEphemeralSigner().public_key])
    assert not result.ok and "signer_not_trusted" in result.codes()


def test_store_without_signer_reads_only(world: World) -> None:
    reader = JudgmentStore(world.store.ledger)
    with pytest.raises(JudgmentRefusedError) as caught:
        reader.seal(report(world))
    assert caught.value.rule == "signer_missing"


# --------------------------------------------------------------------------- what the verifier checks


def test_every_cited_digest_must_resolve(world: World) -> None:
    stranger = Target.of_json({"not": "stored"}, type="rubric")
    pin = JudgePin.pin(model_id="judge@1", prompt=world.prompt_t, sampling={})
    er = EvaluationReport(record_id="er-9", generated_at=NOW, contract_ref="ec:c@1", judge_pin=pin,
                          cases=[Case.of("c1", "met", acts=[world.act_t], method=stranger)])
    with pytest.raises(JudgmentRefusedError) as caught:
        world.store.seal(er)
    assert caught.value.rule == "citation_unresolved" and "method" in caught.value.path
    sealed = world.store.seal(er, external=[stranger.digest])
    result = verify_judgment(sealed, world.store, trusted_keys=[world.store.signer.public_key])
    # declared external when it was sealed: named as living in another store, never as missing
    assert result.ok and [(f.code, f.severity) for f in result.findings] == [("citation_external", "info")]
    assert result.signature == "authored"


def test_unpublished_pin_preimage_is_information_not_failure(world: World) -> None:
    pin = JudgePin.pin(model_id="judge@1", prompt=b"an unpublished prompt", sampling={})
    er = EvaluationReport(record_id="er-8", generated_at=NOW, contract_ref="ec:c@1", judge_pin=pin,
                          cases=[Case.of("c1", "met", acts=[world.act_t], method=world.rubric_t)])
    result = verify_judgment(world.store.seal(er), world.store, trusted_keys=[world.store.signer.public_key])
    assert result.ok
    assert [(f.code, f.severity) for f in result.findings] == [("preimage_not_in_store", "info")]


def test_verifier_says_nothing_about_correctness(world: World) -> None:
    """Two contradictory verdicts on the same act both verify: a verifier checks
    integrity, not whether a judgment is right."""
    met = world.store.seal(report(world, "met", "er-a"))
    not_met = world.store.seal(report(world, "not_met", "er-b"))
    assert verify_judgment(met, world.store).ok and verify_judgment(not_met, world.store).ok


def test_a_changed_copy_is_noticed(world: World) -> None:
    sealed = world.store.seal(report(world))
    body = json.loads(json.dumps(sealed.body))
    body["cases"][0]["verdict"] = "not_met"
    changed = dataclasses.replace(sealed, body=body)
    assert "record_copy_differs" in verify_judgment(changed, world.store).codes()


def test_tampered_rows_are_found(world: World) -> None:
    sealed = world.store.seal(report(world), links=[link("cites", world.act_t)])
    entry = world.store.ledger.entry(sealed.digest)
    assert entry is not None
    stored = json.loads(entry.body)

    body_changed = json.loads(entry.body)
    body_changed["record"]["cases"][0]["verdict"] = "not_met"
    r = verify_entry(dataclasses.replace(entry, body=storage_json(body_changed)), ledger=world.store.ledger, keys=_keys())
    assert not r.ok and "record_digest_mismatch" in {f.code for f in r.findings}

    r = verify_entry(dataclasses.replace(entry, links=({"type": "cites", "target": world.rubric_t.digest},)), ledger=world.store.ledger, keys=_keys())
    assert not r.ok and "header_commitment_mismatch" in {f.code for f in r.findings}

    r = verify_entry(dataclasses.replace(entry, links=({"type": "adjudicates", "target": world.act.capsule_id},)), ledger=world.store.ledger, keys=_keys())
    assert {"adjudicates_requires_adjudication", "header_commitment_mismatch"} <= {f.code for f in r.findings}

    unsigned = {k: v for k, v in stored.items() if k != "envelopes"}
    r = verify_entry(dataclasses.replace(entry, body=storage_json(unsigned)), ledger=world.store.ledger, keys=_keys())
    assert not r.ok and r.signature == "unclaimed" and "record_unsigned" in {f.code for f in r.findings}

    flipped = json.loads(entry.body)
    cose = bytearray(bytes.fromhex(flipped["envelopes"][0]["cose"]))
    cose[-1] ^= 1
    flipped["envelopes"][0]["cose"] = cose.hex()
    r = verify_entry(dataclasses.replace(entry, body=storage_json(flipped)), ledger=world.store.ledger, keys=_keys())
    assert r.signature == "invalid" and "envelope_signature_invalid" in {f.code for f in r.findings}

    r = verify_entry(dataclasses.replace(entry, record_type="judge:human-rating/v1"), ledger=world.store.ledger, keys=_keys())
    assert "record_type_mismatch" in {f.code for f in r.findings}


@pytest.mark.parametrize("record", ["zz", "ab" * 32, object(), None, 42])
def test_verifier_never_raises(world: World, record: Any) -> None:
    result = verify_judgment(record, world.store)
    assert result.ok is False and result.findings
    assert verify_judgment(world.act.capsule_id, object()).ok is False


def test_verify_ledger_dispatches_judge_rows(world: World) -> None:
    sealed = world.store.seal(report(world), links=[link("cites", world.act_t)])
    path = world.store.ledger.path
    world.producer.flush()
    report_ = verify_ledger(path)
    assert report_.ok, report_.to_dict()
    row = next(r for r in report_.records if r.record_id == sealed.digest)
    assert (row.signature, row.signer_kid, row.record_type) == ("authored", sealed.signer_kid, "judge:evaluation-report/v1")


def test_sealed_judgment_round_trips_from_the_store(world: World) -> None:
    sealed = world.store.seal(report(world))
    again = world.store.get(sealed.digest)
    assert isinstance(again, SealedJudgment) and again == sealed
    assert [j.digest for j in world.store.judgments()] == [sealed.digest]
    assert world.store.get(world.act.capsule_id) is None and world.store.get(world.rubric_t.digest) is None
    assert world.store.value(world.rubric_t.digest) == world.rubric_t.content
    assert world.store.value(world.prompt_t.digest) == world.prompt
    assert world.store.target(world.act.capsule_id).digest == world.act.capsule_id


def _keys() -> Any:
    from capseal.audit import KeyDirectory

    return KeyDirectory()
