"""The -05 vocabularies: registries (open, unknown values are informational) and
closed sets (anything else is non-conforming).

Seeded values are those of REGISTRY.md as shipped with the reference package
``agent-action-capsule`` 0.12.0; tests/test_vocab.py checks they stay equal to the
reference's own registry loader.
"""

from __future__ import annotations

SPEC_VERSION = "draft-mih-scitt-agent-action-capsule-05"
ACCEPTED_SPEC_VERSIONS = frozenset(
    {"draft-mih-scitt-agent-action-capsule-04", SPEC_VERSION}
)
FORMAT_VERSION = "4"
CANONICALIZATION_ID = "jcs"

#: Registries (§12): unknown values are reported, never rejected, by a verifier.
REGISTRIES: dict[str, frozenset[str]] = {
    "verdict_class": frozenset(
        {
            "executed", "blocked", "hitl_dispatched", "denied", "timeout", "errored",
            "engine_failure", "deferred", "needs_decision", "expired", "escalated",
            "resolved", "epoch_boundary",
        }
    ),
    "disposition.decision": frozenset({"accept", "reject", "needs_input", "deferred"}),
    "effect.type": frozenset({"write_order", "send_payment", "inference_completion"}),
    "irreversibility_class": frozenset(
        {"two_way", "one_way_recoverable", "one_way_consequential", "one_way_terminal"}
    ),
    "effect_attestation": frozenset({"gate_executed", "runtime_claimed", "host_served_observed"}),
    "chain.relation": frozenset({"follows", "confirms", "supersedes", "epoch_opens", "duplicates"}),
    "citation_purpose": frozenset(
        {
            "acted_on", "responds_to", "ran_under", "corroborates_source_time",
            "counterparty_half", "counterparty_inclusion",
        }
    ),
}

#: Values pending registration that a spec capseal implements already needs:
#: ``x-judgment-v1`` cites what it judged with ``judged_from`` and, optionally, its
#: calibration with ``calibrated_against`` (REGISTRY §11, pending). A producer may
#: emit them; verifiers report them as unregistered (informational), as they should.
PENDING: dict[str, frozenset[str]] = {"citation_purpose": frozenset({"judged_from", "calibrated_against"})}

VERDICT_CLASSES = REGISTRIES["verdict_class"]
CHAIN_RELATIONS = REGISTRIES["chain.relation"]
CITATION_PURPOSES = REGISTRIES["citation_purpose"]
EFFECT_ATTESTATIONS = REGISTRIES["effect_attestation"]

#: Legacy chain.relation spellings: read-only, a producer MUST emit the registered value.
LEGACY_RELATIONS = {
    "sequence": "follows",
    "resolves": "supersedes",
    "escalates": "supersedes",
    "adjudicates": "confirms",
    "assesses": "confirms",
}

#: Closed sets.
EFFECT_STATUSES = frozenset({"planned", "dispatched", "confirmed", "failed", "reverted"})
APPROVERS = frozenset({"human", "policy", "counterparty"})
ACTION_TYPES = frozenset({"fyi", "decide"})
CONSTRAINT_RESULTS = frozenset({"pass", "fail", "n/a"})
DOMAINS = frozenset({"action", "memory", "reasoning"})
PROVENANCE_VALUES = frozenset({"gate", "runtime", "collector"})
PROVENANCE_MODES = frozenset({"contemporaneous", "backfilled"})
TIME_RUNGS = frozenset({"self_attested", "witnessed"})
ON_EXPIRY = frozenset({"expired", "escalated"})

#: Verdict classes that by their kind never dispatch (§5.5.2): effect_mode MUST be
#: not_applicable. ``epoch_boundary`` also requires it (§12.1); the reference's
#: check 4 leaves it out, so the *verifier* follows the reference and the
#: *producer* enforces the stricter set.
NEVER_DISPATCH = frozenset(
    {
        "blocked", "hitl_dispatched", "denied", "engine_failure", "deferred",
        "needs_decision", "expired", "escalated", "resolved",
    }
)
PRODUCER_NEVER_DISPATCH = NEVER_DISPATCH | {"epoch_boundary"}

#: Verdict classes that leave an item open (§5.5.4): closed later by ``supersedes``.
OPEN_ITEM_VERDICTS = frozenset(
    {"deferred", "needs_decision", "hitl_dispatched", "escalated", "blocked"}
)

#: Assurance ranks (-05 §5.4).
EFFECT_MODE_RANK = {"not_applicable": 0, "dispatched_unconfirmed": 0, "confirmed": 1}
ATTESTATION_RANK = {"self_attested": 0, "anchored": 1}
LEDGER_MODE_RANK = {"standalone": 0, "chained": 1, "anchored": 2}
CROSS_PARTY_RANK = {"unilateral_fallback": 0, "acknowledged_receipt": 1, "full_bilateral": 2}
