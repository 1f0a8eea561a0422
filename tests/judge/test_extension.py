"""The x-judgment-v1 capsule extension: typed builders and the digest checker."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from capseal import Producer
from capseal.canonical import json_digest
from capseal.errors import JudgmentRefusedError
from capseal.judge import (
    ExpertProtocolParameters,
    JudgeAnswer,
    ModelJudgeParameters,
    Target,
    check_judgment_capsule,
    judgment_capsule_spec,
    judgment_member,
)
from capseal.judge.extension import MEMBER
from capseal.keys import UnsafeEphemeralSigner

from .conftest import judgment_vectors

V, AI, RAW = judgment_vectors()
HUMAN = next(c for c in V["cases"] if c["id"] == "pos-human-expert")


def model_params(**kw: Any) -> ModelJudgeParameters:
    values = AI["preimages"]["values"]
    fields: dict[str, Any] = dict(
        instruction_template=values["instruction_template"], prompt=RAW["prompt"], axes=RAW["axes"],
        sampling_params={"temperature": "0", "max_output_tokens": 512, "seed": 7}, min_confidence_micros=700000, judge_batch=1,
    )
    fields.update(kw)
    return ModelJudgeParameters.of(**fields)


def test_builders_reproduce_the_vector_digests() -> None:
    values = AI["preimages"]["values"]
    params = model_params()
    assert params.to_json() == values["judge_parameters"]
    member = judgment_member(rubric=values["rubric"], rubric_version="1.2", parameters=params, model_hosting="hosted")
    expected = AI["capsule"]["model_attestation"]["compute_attestation"][MEMBER]
    assert {k: v for k, v in member.to_json().items() if k != "model_hosting"} == expected
    expert = ExpertProtocolParameters.of(protocol="org.example.blind-review/1", packet=HUMAN["preimages"]["values"]["packet"])
    assert json_digest(expert.to_json()) == HUMAN["expect"]["digests"]["judge_parameters_digest"]
    human = judgment_member(rubric=values["rubric"], rubric_version="1.2", parameters=expert)
    assert human.to_json() == HUMAN["capsule"]["model_attestation"]["compute_attestation"][MEMBER]
    answer = JudgeAnswer(**values["agent_output"])
    assert json_digest(answer.to_json()) == AI["expect"]["digests"]["agent_output_digest"]


def test_model_hosting_required_for_a_model_and_forbidden_for_a_human() -> None:
    rubric = AI["preimages"]["values"]["rubric"]
    with pytest.raises(JudgmentRefusedError) as caught:
        judgment_member(rubric=rubric, rubric_version="1.2", parameters=model_params())
    assert caught.value.rule == "model_hosting_required"
    expert = ExpertProtocolParameters.of(protocol="p/1", packet={"case": 1})
    with pytest.raises(JudgmentRefusedError) as caught:
        judgment_member(rubric=rubric, rubric_version="1.2", parameters=expert, model_hosting="hosted")
    assert caught.value.rule == "model_hosting_forbidden"
    capsule = dict(HUMAN["capsule"])
    bad = {**capsule, "model_attestation": {"compute_attestation": {
        **capsule["model_attestation"]["compute_attestation"],
        MEMBER: {**capsule["model_attestation"]["compute_attestation"][MEMBER], "model_hosting": "hosted"},
    }}}
    rules = {v.rule for v in check_judgment_capsule(bad, preimages=HUMAN["preimages"]["values"], raw_files=RAW)}
    assert "model_hosting_forbidden" in rules and "capsule_id_mismatch" in rules


def test_float_sampling_refused_in_judge_parameters() -> None:
    with pytest.raises(JudgmentRefusedError) as caught:
        model_params(sampling_params={"temperature": 0.7})
    assert caught.value.rule == "sampling_float"


def test_changed_preimages_are_found() -> None:
    values = {**AI["preimages"]["values"], "rubric": {**AI["preimages"]["values"]["rubric"], "rubric_id": "other"}}
    assert "rubric_digest_mismatch" in {v.rule for v in check_judgment_capsule(AI["capsule"], preimages=values, raw_files=RAW)}
    raw = {**RAW, "prompt": RAW["prompt"] + " "}
    assert "prompt_digest_mismatch" in {v.rule for v in check_judgment_capsule(AI["capsule"], preimages=AI["preimages"]["values"], raw_files=raw)}
    answer = {**AI["preimages"]["values"], "agent_output": {"verdict": "not_met"}}
    assert "agent_output_digest_mismatch" in {v.rule for v in check_judgment_capsule(AI["capsule"], preimages=answer, raw_files=RAW)}


def test_exactly_one_judged_from() -> None:
    capsule = {**AI["capsule"], "references": [r for r in AI["capsule"]["references"] if r["citation_purpose"] != "judged_from"]}
    assert "judged_from_count" in {v.rule for v in check_judgment_capsule(capsule)}
    twice = {**AI["capsule"], "references": AI["capsule"]["references"] + AI["capsule"]["references"][:1]}
    assert "judged_from_count" in {v.rule for v in check_judgment_capsule(twice)}


def test_spec_carries_member_answer_and_references() -> None:
    values = AI["preimages"]["values"]
    member = judgment_member(rubric=values["rubric"], rubric_version="1.2", parameters=model_params(), model_hosting="self_hosted")
    evidence = Target.of_capsule(V["evidence"])
    developer, spec = judgment_capsule_spec(action_id="j-1", judge="example-judge-model@2026-09-15", member=member,
                                            answer=JudgeAnswer(**values["agent_output"]), judged_from=evidence)
    assert developer == "example-judge-model@2026-09-15"
    compute = spec["model_attestation"]["compute_attestation"]
    assert compute[MEMBER]["model_hosting"] == "self_hosted" and compute["agent_output_digest"] == AI["expect"]["digests"]["agent_output_digest"]
    assert [r["citation_purpose"] for r in spec["references"]] == ["judged_from"]
    assert spec["references"][0]["digest"] == V["evidence"]["capsule_id"]
    capsule = {"developer": developer, **spec}
    assert [v.rule for v in check_judgment_capsule(capsule, preimages=values, raw_files=RAW) if v.severity == "error"] == []


def test_producer_can_seal_a_judgment_capsule(tmp_path: Path) -> None:
    values = AI["preimages"]["values"]
    member = judgment_member(rubric=values["rubric"], rubric_version="1.2", parameters=model_params(), model_hosting="hosted")
    developer, spec = judgment_capsule_spec(action_id="j-1", judge="example-judge-model@2026-09-15", member=member,
                                            answer=JudgeAnswer(**values["agent_output"]), judged_from=Target.of_capsule(V["evidence"]))
    with Producer("example-org", developer, UnsafeEphemeralSigner(), tmp_path / "l.db") as producer:
        record = producer.seal(spec)
    assert check_judgment_capsule(record.capsule, preimages=values, raw_files=RAW) == []
    import agent_action_capsule as ref

    result = ref.verify(record.capsule)  # the pending purpose is informational to the reference, never an error
    assert result.ok and [f.code for f in result.findings if f.severity != "info"] == []
    assert "unknown_registry_value" in [f.code for f in result.findings]
