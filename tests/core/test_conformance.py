"""Conformance: upstream vectors give the same answers from capseal's verifier.

* format-4 capsule vectors: same ``ok``, same (check, code, severity) sequence,
  same derived modes and recomputed capsule id as their frozen expected.json;
* the older corpus (format 2, -00) ported to format 4 (same content, declared
  format 4/jcs, id recomputed): capseal agrees with the reference verifier
  ``agent-action-capsule`` 0.12.0 finding for finding, single and store-level;
* producer-envelope cases: same ok flag, finding codes and authenticated key;
* the cross-language seal input gives the published capsule id.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import agent_action_capsule as ref
import pytest
from agent_action_capsule.producer_envelope import verify_producer_envelope as ref_verify_envelope

import capseal
from capseal.envelope import verify_profile_envelope

VEC = Path(__file__).parent.parent / "vectors"
CAPSULE_DIR = VEC / "capsule-vectors" / "vectors" / "capsule"
OLD_DIR = VEC / "capsule-vectors" / "test-vectors"
ENVELOPE_DIR = VEC / "producer-envelope"


def _cases(base: Path) -> list[Path]:
    return sorted(d for d in base.iterdir() if (d / "input.json").is_file() and (d / "expected.json").is_file())


def _triples(findings: list[Any]) -> list[tuple[Any, str, str]]:
    out = []
    for f in findings:
        if isinstance(f, dict):
            out.append((f["check"], f["code"], f["severity"]))
        else:
            out.append((f.check, f.code, f.severity))
    return out


FORMAT4 = [d for d in _cases(CAPSULE_DIR) if json.loads((d / "input.json").read_text()).get("format_version") == "4"]
FORMAT2 = [d for d in _cases(CAPSULE_DIR) if json.loads((d / "input.json").read_text()).get("format_version") == "2"]


def test_there_are_format4_vectors() -> None:
    assert len(FORMAT4) >= 8


@pytest.mark.parametrize("case", FORMAT4, ids=lambda d: d.name)
def test_format4_vector(case: Path) -> None:
    capsule = json.loads((case / "input.json").read_text())
    expected = json.loads((case / "expected.json").read_text())
    result = capseal.verify(capsule)
    assert result.ok is expected["ok"]
    assert _triples(result.findings) == _triples(expected["findings"])
    assert result.derived == expected["derived"]
    assert result.capsule_id == expected["capsule_id_recomputed"]


@pytest.mark.parametrize("case", FORMAT2, ids=lambda d: d.name)
def test_format2_copies_are_refused_as_unsupported(case: Path) -> None:
    """-05 §2: format 2 fails closed; the reference 0.12.0 says the same."""
    capsule = json.loads((case / "input.json").read_text())
    ours, theirs = capseal.verify(capsule), ref.verify(capsule)
    assert not ours.ok and not theirs.ok
    assert "unsupported_format_version" in ours.codes()
    assert _triples(ours.findings) == _triples(theirs.findings)


def _port(capsule: dict[str, Any], *, keep_id: bool) -> dict[str, Any]:
    out = copy.deepcopy(capsule)
    out.update(spec_version="draft-mih-scitt-agent-action-capsule-05", format_version="4", canonicalization_id="jcs")
    if not keep_id and isinstance(out.get("capsule_id"), str):
        try:
            out["capsule_id"] = capseal.capsule_id(out)
        except capseal.errors.CanonicalizationError:
            pass  # floats / unsafe integers: no id can be computed; check 1 reports them
    return out


OLD_CASES = _cases(OLD_DIR)


def test_old_corpus_present() -> None:
    assert len(OLD_CASES) >= 30


@pytest.mark.parametrize("case", OLD_CASES, ids=lambda d: d.name)
def test_old_corpus_ported_agrees_with_reference(case: Path) -> None:
    data = json.loads((case / "input.json").read_text())
    keep_id = case.name == "neg-capsule-id-mismatch"  # the id must stay wrong
    if isinstance(data, dict) and "ledger" in data:
        ledger = [_port(c, keep_id=False) for c in data["ledger"]]
        # re-link chains to the ported ids so store-level semantics survive the port
        old_to_new = {o["capsule_id"]: n["capsule_id"] for o, n in zip(data["ledger"], ledger, strict=True)}
        for c in ledger:
            chain = c.get("chain")
            if isinstance(chain, dict) and chain.get("parent_capsule_id") in old_to_new:
                chain["parent_capsule_id"] = old_to_new[chain["parent_capsule_id"]]
                c["capsule_id"] = capseal.capsule_id(c)
        ours_all = capseal.verify_store(ledger)
        theirs_all = ref.verify_store(ledger)
        assert [r.ok for r in ours_all] == [r.ok for r in theirs_all]
        assert [_triples(r.findings) for r in ours_all] == [_triples(r.findings) for r in theirs_all]
        return
    # the format-version case is about the declaration itself: run it as published
    capsule = data if case.name == "neg-format-version-unknown" else _port(data, keep_id=keep_id)
    ours, theirs = capseal.verify(capsule), ref.verify(capsule)
    assert ours.ok is theirs.ok
    assert _triples(ours.findings) == _triples(theirs.findings)
    assert ours.derived == theirs.assurance
    assert ours.capsule_id == theirs.capsule_id
    # the frozen expectation's gating verdict carries over (format findings aside)
    expected = json.loads((case / "expected.json").read_text())
    if "ok" in expected:
        assert ours.ok is expected["ok"], "port changed the verdict the upstream vector pins"


def test_cross_language_seal_input_id() -> None:
    seal_input = json.loads((CAPSULE_DIR.parent / "cross-language" / "seal-input-v05.json").read_text())
    assert capseal.capsule_id(seal_input) == "6f7af9955a246cefdc3447b7a245127eb190b72768e715a0558f365861046951"


def test_example_capsule_from_spec_digest() -> None:
    example = {
        "spec_version": "draft-mih-scitt-agent-action-capsule-05", "format_version": "4", "canonicalization_id": "jcs",
        "action_id": "act-0001", "action_type": "decide", "operator": "tenant.example",
        "developer": "procurement-agent@1.4.2", "timestamp": "2026-10-01T12:00:00Z", "epoch_id": "epoch-2026-10-a",
        "effect": {"status": "confirmed", "type": "send_payment", "request_digest": "a" * 64, "response_digest": "b" * 64,
                   "external_ref": "INV-2026-0418", "irreversibility_class": "one_way_consequential",
                   "effect_attestation": "gate_executed"},
        "disposition": {"decision": "accept", "approver": "policy", "human_disposed": False, "verdict_class": "executed"},
        "constraints": [{"id": "com.example.amount_ceiling", "check_type": "com.example.threshold", "result": "pass",
                         "severity": "high", "blocking": True, "evidence_digest": "c" * 64}],
        "assurance": {"attestation_mode": "self_attested", "effect_mode": "confirmed", "ledger_mode": "chained"},
        "chain": {"parent_capsule_id": "1" * 64, "relation": "follows"},
        "references": [{"type": "runtime-attestation-record", "digest_alg": "SHA-256", "digest": "d" * 64,
                        "citation_purpose": "ran_under"}],
        "model_attestation": {"model_id": "example-model-2026-09", "provider": "example-provider",
                              "compute_attestation": {"agent_input_digest": "e" * 64, "agent_output_digest": "f" * 64}},
    }
    assert capseal.capsule_id(example) == "90621b12d47566d8212fe27b883a05dbe2f2a19d3342b57e22af901e1583d04d"
    example["capsule_id"] = capseal.capsule_id(example)
    result = capseal.verify(example)
    assert result.ok and result.derived == {"effect_mode": "confirmed", "attestation_mode": "self_attested", "ledger_mode": "chained"}


ENVELOPE_CASES = sorted(d for d in ENVELOPE_DIR.iterdir() if d.is_dir())


def test_envelope_cases_present() -> None:
    assert {d.name for d in ENVELOPE_CASES} >= {"valid-sorted", "protected-alg-float", "protected-label-boolean",
                                                 "protected-label-duplicate", "wrong-algorithm-extra-header"}


@pytest.mark.parametrize("case", ENVELOPE_CASES, ids=lambda d: d.name)
def test_producer_envelope_case(case: Path) -> None:
    cid = (case / "capsule_id.txt").read_text().strip()
    data = (case / "envelope.cose").read_bytes()
    expected = json.loads((case / "expected.json").read_text())
    ours = verify_profile_envelope(cid, data)
    assert ours.ok is expected["ok"]
    assert [f.code for f in ours.findings] == expected["finding_codes"]
    assert (ours.public_key.hex() if ours.public_key else None) == expected["public_key_hex"]
    theirs = ref_verify_envelope(cid, data)
    assert [f.code for f in theirs.findings] == [f.code for f in ours.findings]
