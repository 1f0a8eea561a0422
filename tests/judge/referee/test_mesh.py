"""The mesh plugin's own verdict record: read it, map it onto adjudication/v1,
report legacy and unregistered tokens, never change the original.

The record below follows the plugin's fixture
(Mesh-LLM/capsules crates/evidence-plugin/tests/fixtures/referee-verdict.json at
b4e24453f572b2d9fe8f2cefbd0f35a5eb54b0ad, tag v0.1.4, as quoted in the judging
digest): its half ids, answer digest, key id, bracket, verdict and divergence are
the fixture's; node ids are its placeholders; the members the quote trims
(node ids of the halves, status, tier, model, weights, request digest, the
referee's capsule) are filled in from the block's documented member list.
"""

from __future__ import annotations

import json
from typing import Any

from capseal.judge import parse_record
from capseal.judge.referee import read_mesh_verdict, to_adjudication

A = "7dc9427b6df5ff222617fb721f25d3c54aebe32682329bb7075902336437fb06"
B = "b80db10999779aa17c8fcf7006a57aeaecbc81f5e9de3ecea33e9365c2bfd4d9"
NODE_A, NODE_B = "a" * 64, "b" * 64


def mesh_record(**block: Any) -> dict[str, Any]:
    adjudication = {
        "schema": "capsule-emit-mesh/adjudication/v1", "source": "twin_comparison",
        "capture_method": "deterministic_replay", "verdict": f"contradicted:{NODE_B}", "status": "CONTRADICTED",
        "divergence_index": 3, "prefix_digest": "1" * 64, "twin_owner_distinct": True,
        "half_a_capsule_id": A, "half_b_capsule_id": B, "half_a_node_id": NODE_A, "half_b_node_id": NODE_B,
        "referee_capsule_id": "2" * 64, "referee_id": "c" * 64, "referee_node_id": "c" * 64, "selection_tier": 1,
        "model_hash": "3" * 64, "weights_digest": "4" * 64, "twins_request_digest": "5" * 64,
        "referee_prompt": "requester_attested",
        "referee_answer_digest": "0242bc9526adbb014565b8175ff134e2ba8731f4a13cab2d1b4d8aff8727586e",
        "twin_bracket_id": "bracket-1",
    }
    adjudication.update(block)
    return {
        "spec_version": "draft-mih-scitt-agent-action-capsule-04", "format_version": "4", "canonicalization_id": "jcs",
        "action_id": "adjudication-1", "action_type": "fyi", "operator": "mesh", "developer": "capsule-emit-mesh@0.1.4",
        "timestamp": "2026-09-30T12:00:00Z", "provenance": "referee",
        "model_attestation": {"compute_attestation": {"epistemic_type": "adjudication", "adjudication": adjudication}},
        "assurance": {"attestation_mode": "self_attested", "effect_mode": "not_applicable", "ledger_mode": "chained"},
        "disposition": {"decision": "accept", "approver": "policy", "human_disposed": False, "verdict_class": "assessed"},
        "chain": {"parent_capsule_id": A, "relation": "adjudicates"},
        "key_id": "6a9a93a3af20ca17d85764e3206fd1d0417ea943f53f07157792299ba9b6f033",
    }


def test_the_mesh_verdict_maps_onto_adjudication_v1_and_the_original_is_unchanged() -> None:
    record = mesh_record()
    before = json.dumps(record, sort_keys=True)
    mesh = read_mesh_verdict(record)
    body, row, findings = to_adjudication(mesh)
    assert json.dumps(record, sort_keys=True) == before  # read only
    assert row is None and body is not None
    parsed = parse_record(body)  # the refusal engine accepts it
    assert parsed.RECORD_VERSION == "adjudication/v1" and body["verdict"] == "contradicted"
    assert body["contradicted_party"] == B and body["divergence_index"] == "3"
    assert [p["digest"] for p in body["parties"]] == [A, B]
    assert body["basis"]["weights_digest"]["digest"] == "4" * 64 and body["basis"]["model_id"] == "3" * 64
    assert body["referee"]["digest"] == "2" * 64 and body["referee"]["judge_purpose"] == "referee"
    assert not any(k in json.dumps(body) for k in ("capture_method", "twin_comparison", "prefix_digest", "CONTRADICTED"))
    codes = {f.code: f.severity for f in findings}
    assert codes["legacy_chain_relation"] == "info" and codes["unregistered_verdict_class"] == "info"
    assert codes["mesh_schema"] == "info" and codes["no_counterpart"] == "info"
    assert not [c for c, s in codes.items() if s == "error" and c != "capsule_id_mismatch"]


def test_not_comparable_has_no_token_and_maps_to_a_not_adjudicated_row() -> None:
    mesh = read_mesh_verdict(mesh_record(verdict="not_comparable", status="UNKNOWN", not_comparable_because="weights_differ"))
    body, row, findings = to_adjudication(mesh)
    assert body is None and row == {"state": "not_adjudicated", "reason": "not_comparable", "because": "weights_differ"}
    assert "not_comparable_no_token" in [f.code for f in findings]


def test_inconsistent_and_unknown_tokens_are_reported_and_kept() -> None:
    wrong_status = read_mesh_verdict(mesh_record(status="SATISFIED"))
    assert "status_inconsistent" in wrong_status.codes()
    stranger = read_mesh_verdict(mesh_record(verdict=f"contradicted:{'e' * 64}"))
    assert "contradicted_party_not_a_party" in stranger.codes()
    body, _, findings = to_adjudication(stranger)
    assert body is None and "contradicted_party_not_a_party" in [f.code for f in findings]
    unknown = read_mesh_verdict(mesh_record(verdict="upheld", status=None))
    assert "unknown_verdict" in unknown.codes() and unknown.verdict == "upheld"  # kept as it is
    bads: list[Any] = [None, [], {"capsule": 5}, {"model_attestation": {}}]
    for bad in bads:
        assert "not_a_mesh_verdict" in read_mesh_verdict(bad).codes()


def test_a_deeply_nested_or_hostile_record_does_not_raise() -> None:
    deep: Any = {}
    node = deep
    for _ in range(5000):
        node["x"] = {}
        node = node["x"]
    record = mesh_record()
    record["model_attestation"]["compute_attestation"]["extra"] = deep
    mesh = read_mesh_verdict(record)
    assert mesh.codes() == ["not_a_mesh_verdict"] and mesh.block == {}  # said so, nothing raised
