"""A generated matrix of capsule specs a conforming producer may seal.

Covers every verdict class, every effect status, chains of each relation,
references with each citation purpose, cross_party at each rung, backfilled
provenance (self-attested and witnessed time) and constraints. Used by the
interop test and by examples; each spec is valid by construction.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

VERDICTS = [
    "executed", "blocked", "hitl_dispatched", "denied", "timeout", "errored", "engine_failure",
    "deferred", "needs_decision", "expired", "escalated", "resolved", "epoch_boundary",
]
NEVER_DISPATCH = {"blocked", "hitl_dispatched", "denied", "engine_failure", "deferred", "needs_decision",
                  "expired", "escalated", "resolved", "epoch_boundary"}
STATUSES = ["planned", "dispatched", "confirmed", "failed", "reverted"]
RELATIONS = ["follows", "confirms", "supersedes", "epoch_opens", "duplicates"]
PURPOSES = ["acted_on", "responds_to", "ran_under", "corroborates_source_time", "counterparty_half", "counterparty_inclusion"]
RUNGS = ["unilateral_fallback", "acknowledged_receipt", "full_bilateral"]
ATTESTATIONS = ["gate_executed", "runtime_claimed", "host_served_observed"]
TYPES = ["write_order", "send_payment", "inference_completion", "com.example.custom_effect"]
IRREV = ["two_way", "one_way_recoverable", "one_way_consequential", "one_way_terminal"]


def h(*parts: Any) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def _effect(i: int, status: str) -> dict[str, Any]:
    effect: dict[str, Any] = {"status": status, "type": TYPES[i % len(TYPES)], "irreversibility_class": IRREV[i % len(IRREV)]}
    if status == "planned":
        return effect
    effect["request_digest"] = h("req", i)
    if status in ("confirmed",) or (status in ("failed", "reverted") and i % 2):
        effect["response_digest"] = h("resp", i)
    if i % 3 == 0:
        effect["external_ref"] = f"EXT-{i}"
    effect["effect_attestation"] = ATTESTATIONS[i % len(ATTESTATIONS)]
    return effect


def _status_for(verdict: str, i: int) -> str | None:
    if verdict in NEVER_DISPATCH:
        return [None, "planned"][i % 2]
    if verdict == "executed":
        return ["confirmed", "confirmed", "reverted"][i % 3]
    if verdict == "errored":
        return ["dispatched", "failed"][i % 2]
    if verdict == "timeout":
        return [None, "planned", "dispatched", "failed"][i % 4]
    return STATUSES[i % len(STATUSES)]


def specs(n: int = 240) -> Iterator[tuple[dict[str, Any], str | None, str | None]]:
    """Yield ``(spec, relation, parent_hint)``: ``relation`` is the chain
    relation to use with the previous capsule (None: standalone); the caller
    supplies the parent id. ``parent_hint`` is "backfilled-original" for
    ``duplicates`` (which should cite a contemporaneous record)."""
    for i in range(n):
        verdict = VERDICTS[i % len(VERDICTS)]
        status = _status_for(verdict, i // len(VERDICTS))
        spec: dict[str, Any] = {"action_id": f"matrix-{i}", "action_type": "fyi" if verdict == "epoch_boundary" else ["decide", "fyi"][i % 5 == 0]}
        if status is not None:
            spec["effect"] = _effect(i, status)
        disposition: dict[str, Any] = {"decision": ["accept", "reject", "needs_input", "deferred"][i % 4], "verdict_class": verdict}
        approver = ["policy", "human", "counterparty"][i % 3]
        disposition["approver"] = approver
        disposition["human_disposed"] = approver == "human" and i % 2 == 0
        if i % 7 == 0:
            disposition["reason_digest"] = h("reason", i)
        if i % 11 == 0:
            disposition["authority"] = f"urn:example:policy:{i}"
        if "deferred" in (disposition["decision"], verdict) and i % 2 == 0:
            disposition["expiry_policy"] = {"ttl_seconds": 3600 + i, "on_expiry": ["expired", "escalated"][i % 2]}
        spec["disposition"] = disposition
        if i % 3 == 1:
            spec["constraints"] = [
                {"id": f"com.example.rule_{j}", "check_type": "com.example.threshold", "method": "deterministic",
                 "result": ["pass", "fail", "n/a"][(i + j) % 3], "severity": ["low", "high"][j % 2],
                 "blocking": bool((i + j) % 2), "evidence_digest": h("ev", i, j)}
                for j in range(1 + i % 3)
            ]
        purpose = PURPOSES[i % len(PURPOSES)]
        refs: list[dict[str, Any]] = [{"type": ["agent-action-capsule", "runtime-attestation-record", "com.example.doc"][i % 3],
                 "digest_alg": "SHA-256", "digest": h("ref", i), "citation_purpose": purpose}]
        if i % 4 == 0:
            refs[0]["retention"] = {"declarant": "acme-records", "retained_until": "2030-01-01T00:00:00Z"}
        if i % 6 == 0:
            refs.append({"type": "com.example.log-entry", "digest_alg": "SHA-256", "digest": h("log", i),
                         "log_coordinates": {"log_id": "log.example", "leaf_index": i, "inclusion_proof": [h("p", i)]}})
        spec["references"] = refs
        rung = [None, *RUNGS][i % 4]
        if rung is not None:
            cp: dict[str, Any] = {"initiator_ref": h("init", i)}
            if rung in ("acknowledged_receipt", "full_bilateral"):
                cp["counterparty_ref"] = h("cp", i)
                cp["correlator"] = f"corr-{i}"
                cp["substantive"] = rung == "full_bilateral"
            spec["cross_party"] = cp
        relation = [None, *RELATIONS][i % 6]
        hint = None
        if i % 5 == 2 or relation == "duplicates":
            witnessed = purpose == "corroborates_source_time"
            pm: dict[str, Any] = {"mode": "backfilled", "source_ref": {"type": "com.example.source", "digest_alg": "SHA-256", "digest": h("src", i)},
                                  "source_asserted_at": "2026-01-01T00:00:00Z", "import_batch": f"batch-{i // 10}",
                                  "imported_at": "2026-11-30T00:00:00Z"}
            if witnessed:
                pm["time_rung"] = "witnessed"
            elif i % 3 == 0:
                pm["time_rung"] = "self_attested"
            spec["provenance_mode"] = pm
            hint = "backfilled-original" if relation == "duplicates" else None
        elif i % 5 == 3:
            spec["provenance_mode"] = {"mode": "contemporaneous"}
        if i % 8 == 0:
            spec["model_attestation"] = {"model_id": "example-model", "provider": "example-provider",
                                         "compute_attestation": {"agent_input_digest": h("in", i), "agent_output_digest": h("out", i)}}
        if i % 9 == 0:
            spec["self_reported_reasoning"] = {"digest": h("why", i)}
        if i % 10 == 0:
            spec["domain"] = ["action", "memory", "reasoning"][i % 3]
            spec["provenance"] = ["gate", "runtime", "collector"][i % 3]
        if i % 12 == 0:
            spec["x-example-extension"] = {"note": f"namespaced extension member {i}", "count": i}
        yield spec, relation, hint
