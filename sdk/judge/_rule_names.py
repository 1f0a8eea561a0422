"""Which named rule a failed schema keyword is (for :mod:`capseal.judge.rules`).

The shipped schemas are interpreted, not re-typed; a keyword that fails is
turned into a rule name here: ``_NAMED`` (schema path, optionally the member,
→ rule; the first match wins), then a few member-based names, then a generic
``schema_<keyword>`` name for anything unnamed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .schema import SchemaError

__all__ = ["SCORE_MEMBER", "rule_name"]

#: A member name that would store a score, rate or confidence (family §8, §9).
SCORE_MEMBER = re.compile(r"(^|_)(rate|rates|confidence|score|scores|scoring|percent|percentage|probability|ratio)(_|$)", re.I)

# (schema-path regex, member or None, rule). First match wins.
_NAMED: tuple[tuple[re.Pattern[str], str | None, str], ...] = tuple(
    (re.compile(p), m, r)
    for p, m, r in (
        # family-wide
        (r"/properties/epistemic_type/const$", None, "epistemic_type_fixed_by_shape"),
        (r"/properties/record_version/const$", None, "record_version_mismatch"),
        (r"Citation/allOf/1/properties/judge_purpose/const$", None, "judge_purpose_mismatch"),
        (r"^#/\$defs/Citation/additionalProperties$", "citation_purpose", "legacy_citation_purpose"),
        (r"^#/\$defs/HexDigest/pattern$", None, "digest_malformed"),
        (r"^#/\$defs/DigestRef/properties/digest_alg/const$", None, "digest_alg_not_sha256"),
        (r"^#/\$defs/Citation/properties/digest_alg/const$", None, "digest_alg_not_sha256"),
        (r"/format$", None, "timestamp_not_rfc3339"),
        (r"^#/\$defs/ContractRef/pattern$", None, "contract_ref_unversioned"),
        (r"^#/\$defs/SamplingParams/additionalProperties/type$", None, "sampling_value_type"),
        (r"^#/\$defs/Basis/required$", None, "judge_unpinned"),
        (r"^#/\$defs/Basis/properties/model_id/minLength$", None, "judge_unpinned"),
        # evaluation-report/v1
        (r"^#/\$defs/Case/required$", "method", "case_method_required"),
        (r"^#/\$defs/Case/required$", "acts", "case_acts_required"),
        (r"^#/\$defs/Case/properties/acts/minItems$", None, "case_acts_required"),
        (r"^#/\$defs/Case/properties/verdict/enum$", None, "case_verdict_unknown"),
        (r"^#/\$defs/EvaluationReport/properties/cases/minItems$", None, "cases_empty"),
        # adjudication/v1
        (r"^#/\$defs/Adjudication/allOf/0/then/required$", None, "contradicted_party_required"),
        (r"^#/\$defs/Adjudication/allOf/0/else/not$", None, "contradicted_party_forbidden"),
        (r"^#/\$defs/Adjudication/properties/parties/(min|max)Items$", None, "parties_count"),
        # adjudication-response/v1
        (r"^#/\$defs/AdjudicationResponse/allOf/0/then/allOf/\d/not$", "verdict", "delivery_receipt_forbids_verdict"),
        (r"^#/\$defs/AdjudicationResponse/allOf/0/then/allOf/\d/not$", "basis", "delivery_receipt_forbids_basis"),
        (r"^#/\$defs/AdjudicationResponse/allOf/1/then/required$", None, "ack_requires_verdict"),
        (r"^#/\$defs/AdjudicationResponse/allOf/1/then/not$", None, "ack_forbids_basis"),
        (r"^#/\$defs/AdjudicationResponse/allOf/2/then/required$", "verdict", "rebuttal_requires_verdict"),
        (r"^#/\$defs/AdjudicationResponse/allOf/2/then/required$", "basis", "rebuttal_requires_basis"),
        (r"^#/\$defs/AdjudicationResponse/properties/basis/minLength$", None, "rebuttal_basis_empty"),
        # human-rating/v1
        (r"^#/\$defs/HumanRating/properties/blind/const$", None, "rating_not_blind"),
        (r"^#/\$defs/HumanRating/required$", "blind", "rating_not_blind"),
        (r"^#/\$defs/PrincipalRef/minLength$", None, "rater_ref_identifying"),
        # calibration-summary/v1
        (r"^#/\$defs/KOfN/additionalProperties$", None, "stored_rate_forbidden"),
        (r"^#/\$defs/KOfN/", None, "k_of_n_not_counts"),
        (r"^#/\$defs/CalibrationSummary/properties/clauses/minItems$", None, "clauses_empty"),
        # sample-manifest/v1
        (r"^#/\$defs/SampleManifest/properties/cases/minItems$", None, "sample_cases_empty"),
        # contract-compile/v1
        (r"^#/\$defs/ContractCompile/required$", "human_approval", "human_approval_required"),
        (r"^#/\$defs/ContractCompile/properties/compiled_skill/minItems$", None, "compiled_skill_empty"),
        # close/v1
        (r"^#/\$defs/Close/allOf/0/then/required$", None, "reconcile_peer_close_link_required"),
        (r"^#/\$defs/Close/allOf/0/then/properties/x-evidence-links/contains$", None, "reconcile_peer_close_link_required"),
        (r"^#/\$defs/Reconcile/additionalProperties$", "peer_close", "peer_close_retired"),
        (r"^#/\$defs/EvidenceLinkType/enum$", None, "link_type_unknown"),
        (r"^#/\$defs/ReconcileTallies/required$", None, "reconcile_tallies_incomplete"),
        # evidence-result-v0
        (r"^#/\$defs/Claim/required$", "tier", "claim_tier_required"),
        (r"^#/\$defs/Claim/required$", "contract_ref", "contract_ref_required"),
        (r"^#/\$defs/Claim/required$", "sufficiency", "claim_sufficiency_required"),
        (r"^#/\$defs/Claim/required$", "verdict", "claim_verdict_required"),
        (r"^#/\$defs/Claim/required$", "evidence", "claim_evidence_required"),
        (r"^#/\$defs/Verdict/enum$", None, "claim_verdict_unknown"),
        (r"^#/\$defs/Claim/allOf/0/else/properties/verdict/const$", None, "verdict_requires_sufficiency"),
        (r"^#/\$defs/Claim/allOf/0/then/properties/verdict/enum$", None, "satisfied_verdict_not_evaluable"),
        (r"^#/\$defs/Claim/allOf/1/", None, "claim_type_body_mismatch"),
        (r"^#/\$defs/Claim/allOf/2/", None, "contested_close_met"),
        (r"^#/\$defs/Claim/allOf/3/then/required$", None, "recomputed_code_identity_required"),
        (r"^#/\$defs/Claim/allOf/3/then/properties/implementation/", None, "recomputed_code_identity_unknown"),
        (r"^#/\$defs/CodeDigest/", None, "code_digest_not_git_object"),
        (r"^#/\$defs/Implementation/required$", "grade", "implementation_grade_required"),
        (r"^#/\$defs/Implementation/allOf/0/then/properties/grade/const$", None, "unknown_code_identity_overgraded"),
        (r"^#/\$defs/DisclosedStatus/enum$", None, "disclosure_under_withheld"),
        (r"^#/\$defs/ClaimType/enum$", None, "claim_type_unrecognized"),
        (r"^#/\$defs/Tier/enum$", None, "claim_tier_unknown"),
        (r"^#/\$defs/Aggregate/required$", "coverage", "coverage_required"),
        (r"^#/\$defs/Aggregate/required$", "buckets", "buckets_required"),
        (r"^#/\$defs/Buckets/required$", None, "buckets_incomplete"),
        (r"^#/\$defs/Coverage/required$", None, "coverage_incomplete"),
        (r"^#/\$defs/CloseClaim/allOf/0/then/required$", None, "close_peer_required"),
        (r"^#/\$defs/EvidenceResult/properties/claims/minItems$", None, "claims_empty"),
        # judgment-extension-v1 (x-judgment-v1)
        (r"^#/\$defs/JudgmentCapsule/properties/references/contains$", None, "judged_from_count"),
        (r"^#/\$defs/JudgmentMember/additionalProperties$", None, "judgment_member_closed"),
    )
)

_GENERIC = {
    "required": "schema_required_member_missing",
    "additionalProperties": "schema_unknown_member",
    "type": "schema_type_mismatch",
    "const": "schema_const_mismatch",
    "enum": "schema_enum_mismatch",
    "pattern": "schema_pattern_mismatch",
    "minLength": "schema_too_short",
    "minItems": "schema_too_short",
    "minProperties": "schema_too_short",
    "maxLength": "schema_too_long",
    "maxItems": "schema_too_long",
    "minimum": "schema_below_minimum",
    "maximum": "schema_above_maximum",
    "not": "schema_forbidden_member",
    "contains": "schema_contains",
    "oneOf": "schema_one_of",
    "anyOf": "schema_any_of",
    "format": "timestamp_not_rfc3339",
    "false": "schema_false",
}


def rule_name(err: SchemaError, instance_at: Any) -> str:
    """The rule a failed schema keyword breaks.

    Args:
        err: the schema error.
        instance_at: the value the error is about (a float under a sampling
            member is ``sampling_float``, not a type mismatch).

    Returns:
        The rule's name.
    """
    for pattern, member, rule in _NAMED:
        if (member is None or member == err.member) and pattern.search(err.schema_path):
            if rule == "sampling_value_type" and isinstance(instance_at, float):
                return "sampling_float"
            return rule
    if err.keyword == "additionalProperties" and err.member is not None:
        if SCORE_MEMBER.search(err.member):
            return "stored_rate_forbidden"
        if err.member == "x-evidence-links":
            return "evidence_links_close_only"
        if err.member == "citation_purpose":
            return "legacy_citation_purpose"
    if err.keyword == "required" and err.member == "judge_purpose" and isinstance(instance_at, Mapping) and "citation_purpose" in instance_at:
        return "legacy_citation_purpose"
    return _GENERIC.get(err.keyword, f"schema_{err.keyword}")
