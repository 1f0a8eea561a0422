"""Defects found by a review of ``capseal.judge`` (each test failed on the code
before its fix): verifiers and checkers that lost their named findings behind a
``checker_internal_error`` / ``verifier_internal_error``, and a stored row that
reads two ways but verified."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

from capseal.audit import KeyDirectory
from capseal.errors import JudgmentRefusedError
from capseal.judge import (
    Case,
    EvaluationReport,
    JudgePin,
    check_body,
    check_judgment_capsule,
    link,
    refuse,
    verify_entry,
    verify_judgment,
)
from capseal.judge.extension import MEMBER

from .conftest import JUDGE, NOW, World, judgment_vectors, load

V, AI, RAW = judgment_vectors()


def rules(capsule: Any, preimages: Any = None, raw_files: Any = None) -> dict[str, str]:
    return {v.rule: v.path for v in check_judgment_capsule(capsule, preimages=preimages, raw_files=raw_files)}


# --------------------------------------------------------------------------- x-judgment-v1 checker


def test_a_float_in_a_judgment_capsule_is_named_not_an_internal_error() -> None:
    """A float in the capsule is float_in_record; before, capsule_id() raised
    inside the checker and every finding became checker_internal_error."""
    capsule = copy.deepcopy(AI["capsule"])
    capsule["model_attestation"]["compute_attestation"][MEMBER]["rubric_version"] = 1.5
    found = rules(capsule, AI["preimages"]["values"], RAW)
    assert "checker_internal_error" not in found
    assert "float_in_record" in found


@pytest.mark.parametrize("name", ["rubric", "judge_parameters", "instruction_template", "agent_output"])
def test_a_float_in_a_published_preimage_is_named_and_its_digest_not_compared(name: str) -> None:
    """A preimage that cannot be canonicalized has no digest: float_in_record at
    the preimage (under preimages.<name>), never checker_internal_error."""
    pre = copy.deepcopy(AI["preimages"]["values"])
    pre[name] = {**pre[name], "weight": 0.5}
    found = rules(AI["capsule"], pre, RAW)
    assert "checker_internal_error" not in found
    assert found.get("float_in_record", "").startswith(f"preimages.{name}"), found


@pytest.mark.parametrize("capsule", [None, [], "capsule", 5])
def test_a_judgment_capsule_that_is_no_object_is_named(capsule: Any) -> None:
    assert rules(capsule) == {"record_not_object": "$"}


def test_preimages_that_are_no_mapping_are_named() -> None:
    found = rules(AI["capsule"], [AI["preimages"]["values"]], RAW)
    assert "checker_internal_error" not in found and "preimages_malformed" in found


# --------------------------------------------------------------------------- check_body / refuse on non-JSON bodies


def _report() -> dict[str, Any]:
    return load(JUDGE / "evaluation-report" / "pos-example-org-evaluation-report.json")


def _nested(depth: int) -> list[Any]:
    root: list[Any] = []
    node = root
    for _ in range(depth):
        node.append([])
        node = node[0]
    return root


@pytest.mark.parametrize(("where", "key"), [(("cases", 0), 1), (("judge_pin", "sampling"), 7), (("cases", 0), ("a", "b"))])
def test_a_non_string_key_is_named_non_json_value(where: tuple[Any, ...], key: Any) -> None:
    """A non-string key (Python input; JSON has none) is non_json_value; before,
    the schema walk raised on it and check_body said checker_internal_error,
    which ``refuse`` and ``seal`` raised as the rule, naming nothing."""
    body = _report()
    node = body
    for part in where:
        node = node[part]
    node[key] = "x"
    found = check_body(body)
    assert "checker_internal_error" not in {v.rule for v in found}
    assert found[0].rule == "non_json_value"
    with pytest.raises(JudgmentRefusedError) as caught:
        refuse(body)
    assert caught.value.rule == "non_json_value" and "not a string" in str(caught.value)


def test_nesting_deeper_than_capseal_writes_is_named_non_json_value(world: World) -> None:
    """A body nested deeper than MAX_DEPTH (the most the store writes) is
    non_json_value at the path; before, the checker hit RecursionError and said
    checker_internal_error. Nothing is written."""
    body = _report()
    body["cases"][0]["deep"] = _nested(5000)
    found = check_body(body)
    assert [v.rule for v in found][:1] == ["non_json_value"] and "nest deeper" in found[0].message
    world.assert_seal_refused(body, "non_json_value")


def test_a_non_string_key_behind_a_float_is_still_named() -> None:
    """check_json stops at the first bad value: a float ahead of a non-string key
    hid the key and the schema walk raised on it (checker_internal_error)."""
    body = load(JUDGE / "calibration-summary" / "neg-clause-with-rate-field.json")  # holds rate: 0.85
    body["judge_pin"][1] = "x"
    found = {v.rule for v in check_body(body)}
    assert "checker_internal_error" not in found and "non_json_value" in found


def test_a_non_string_key_in_judge_parameters_is_named() -> None:
    pre = copy.deepcopy(AI["preimages"]["values"])
    pre["judge_parameters"] = {**pre["judge_parameters"], 1: "x"}
    found = rules(AI["capsule"], pre, RAW)
    assert "checker_internal_error" not in found
    assert found.get("non_json_value", "").startswith("preimages.judge_parameters"), found


# --------------------------------------------------------------------------- the verifier on damaged rows and copies


def _sealed(world: World) -> Any:
    pin = JudgePin.pin(model_id="judge@1", prompt=world.prompt_t, sampling={"temperature_micros": 0})
    report = EvaluationReport(record_id="er-1", generated_at=NOW, contract_ref="ec:c@1", judge_pin=pin,
                              cases=[Case.of("c1", "met", acts=[world.act_t], method=world.rubric_t)])
    return world.store.seal(report, links=[link("cites", world.act_t)])


def _codes(world: World, entry: Any) -> tuple[bool, set[str]]:
    r = verify_entry(entry, ledger=world.store.ledger, keys=KeyDirectory())
    return r.ok, {f.code for f in r.findings}


def test_a_stored_row_with_a_duplicate_member_does_not_verify(world: World) -> None:
    """A row whose body holds a member twice reads as one record to a parser that
    keeps the last (Python's) and as another to one that keeps the first; before,
    the verifier read it Python's way and said ok."""
    sealed = _sealed(world)
    entry = world.store.ledger.entry(sealed.digest)
    assert entry is not None
    body = entry.body.decode()
    assert '"verdict":"met"' in body
    twice = body.replace('"verdict":"met"', '"verdict":"not_met","verdict":"met"').encode()
    ok, codes = _codes(world, dataclasses.replace(entry, body=twice))
    assert not ok and "record_malformed" in codes


def test_a_stored_row_nested_too_deep_is_record_malformed(world: World) -> None:
    sealed = _sealed(world)
    entry = world.store.ledger.entry(sealed.digest)
    assert entry is not None
    ok, codes = _codes(world, dataclasses.replace(entry, body=b"[" * 100_000 + b"]" * 100_000))
    assert not ok and codes == {"record_malformed"}


@pytest.mark.parametrize("target", [1.5, 2**80])
def test_header_links_that_cannot_be_canonicalized_are_named(world: World, target: Any) -> None:
    """A links column holding a float or an unsafe integer (a damaged row) is
    link_target_malformed and an unverifiable header, not verifier_internal_error
    (which dropped every other finding)."""
    sealed = _sealed(world)
    entry = world.store.ledger.entry(sealed.digest)
    assert entry is not None
    ok, codes = _codes(world, dataclasses.replace(entry, links=({"type": "cites", "target": target},)))
    assert not ok and "verifier_internal_error" not in codes
    assert {"link_target_malformed", "header_commitment_mismatch"} <= codes


def test_a_copy_changed_to_hold_a_float_is_a_changed_copy(world: World) -> None:
    """verify_judgment(copy) with a float put in the copy's body: before, digesting
    the copy raised and the whole report became verifier_internal_error."""
    sealed = _sealed(world)
    body = copy.deepcopy(sealed.body)
    body["cases"][0]["verdict"] = 0.5
    report = verify_judgment(dataclasses.replace(sealed, body=body), world.store, trusted_keys=[world.store.signer.public_key])
    assert not report.ok
    assert set(report.codes()) == {"record_copy_differs"}
    assert report.signature == "authored"  # the stored record itself is intact


# --------------------------------------------------------------------------- adjudication quantities are decimal strings


@pytest.mark.parametrize("member", ["margin", "margin_tau", "divergence_index"])
@pytest.mark.parametrize("value", ["high", "1e5", "0.4.2", " 0.42", "0x10", "NaN", "Infinity", "０.４", ".5", "5."])
def test_adjudication_quantities_are_decimal_strings(member: str, value: str) -> None:
    """Digest §3.2: margin, margin_tau and divergence_index are decimal strings;
    the schema says only "a non-empty string", so "high" was sealed."""
    body = load(JUDGE / "adjudication" / "pos-example-org-twin-adjudication.json")
    body[member] = value
    found = check_body(body)
    assert [v.rule for v in found] == ["decimal_string_malformed"] and found[0].path == f"$.{member}"


@pytest.mark.parametrize("value", ["0", "0.42", "-0.05", "3", "12.500"])
def test_adjudication_decimal_strings_pass(value: str) -> None:
    body = load(JUDGE / "adjudication" / "pos-example-org-twin-adjudication.json")
    body["margin"] = value
    assert check_body(body) == []


# --------------------------------------------------------------------------- prose that says nothing


BLANKS = [" ", "\t\n  ", "\u00a0\u2003\u3000", "\u200b", "\ufeff \u200d", "\x1c\x1f"]


@pytest.mark.parametrize("blank", BLANKS)
def test_a_rebuttal_basis_of_blanks_is_refused_and_reported(world: World, blank: str) -> None:
    """Digest §3.3: a rebuttal requires a non-empty prose basis; the schema's
    minLength 1 took a basis of one space (or a zero-width space), so a
    rebuttal that says nothing was sealed and verified. It is
    rebuttal_basis_empty, as an empty basis is: refused by the builder and by
    seal (nothing written), and reported by the verifier on a row an older
    capseal wrote."""
    from capseal.audit import verify_ledger
    from capseal.canonical import json_digest
    from capseal.judge import Adjudication, AdjudicationResponse
    from capseal.judge.store import record_type_for
    from capseal.judge.vocab import JUDGMENT_STORE_VERSION

    pin = JudgePin.pin(model_id="referee@1", prompt=b"Decide.\n", sampling={"seed": 1})
    ruling = Adjudication.ruling(record_id="adj-1", adjudicated_at=NOW, verdict="corroborated", basis=pin, parties=[world.act_t])
    world.store.seal(ruling, external=[pin.prompt_digest.digest])
    fields: dict[str, Any] = dict(record_id="reb-1", responded_at=NOW, adjudication=ruling.target(), verdict="contradicted")
    with pytest.raises(JudgmentRefusedError) as caught:
        AdjudicationResponse.rebuttal(**fields, basis=blank)
    assert caught.value.rule == "rebuttal_basis_empty" and caught.value.path == "$.basis"
    body = AdjudicationResponse.rebuttal(**fields, basis="the referee misread token 3").body()
    body["basis"] = blank
    assert [(v.rule, v.path) for v in check_body(body)] == [("rebuttal_basis_empty", "$.basis")]
    world.assert_seal_refused(body, "rebuttal_basis_empty")
    # prose with blanks around it still says something
    padded = AdjudicationResponse.rebuttal(**fields, basis=f"{blank}the referee misread token 3{blank}")
    assert check_body(padded.body()) == []
    # a row written before this rule (signed, hash-chained) is reported, never verified as good
    stored = {"record_version": JUDGMENT_STORE_VERSION, "record": body}
    world.store._append(stored, json_digest(body), record_type_for("adjudication-response/v1"), "producer_claim", ())
    report = verify_ledger(world.store.ledger.path)
    row = next(r for r in report.records if r.record_id == json_digest(body))
    assert not row.ok and row.signature == "authored"
    assert [f.code for f in row.findings if f.severity == "error"] == ["rebuttal_basis_empty"]


@pytest.mark.parametrize("blank", BLANKS)
def test_a_judge_model_id_of_blanks_is_unpinned(blank: str) -> None:
    """A judge pin's model_id of blanks met the schema's minLength 1: a judge
    named by nothing. It is judge_unpinned, as an empty model_id is, in an
    adjudication's basis and an evaluation report's judge_pin."""
    for shape, member in (("adjudication/pos-example-org-twin-adjudication", "basis"),
                          ("evaluation-report/pos-example-org-evaluation-report", "judge_pin")):
        body = load(JUDGE / f"{shape}.json")
        assert check_body(body) == []
        body[member]["model_id"] = blank
        assert [(v.rule, v.path) for v in check_body(body)] == [("judge_unpinned", f"$.{member}.model_id")], shape
