"""What every benchmark seals: one typical capsule (effect + disposition +
constraints, and a chain when asked), so figures from different scripts compare."""

from __future__ import annotations

from typing import Any

PARENT = "1" * 64


def typical_spec(i: int, *, chained: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "action_id": f"act-{i}",
        "action_type": "decide",
        "effect": {
            "status": "confirmed", "type": "write_order",
            "request_digest": "a" * 64, "response_digest": "b" * 64,
            "irreversibility_class": "one_way_recoverable", "effect_attestation": "gate_executed",
        },
        "disposition": {"decision": "accept", "approver": "policy", "human_disposed": False, "verdict_class": "executed"},
        "constraints": [
            {"id": "com.example.amount_ceiling", "check_type": "com.example.threshold", "result": "pass",
             "severity": "high", "blocking": True, "evidence_digest": "c" * 64},
        ],
    }
    if chained:
        spec["chain"] = {"parent_capsule_id": PARENT, "relation": "follows"}
    return spec
