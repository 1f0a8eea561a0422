"""What every benchmark seals: one typical capsule (effect + disposition +
constraints, and a chain when asked), so figures from different scripts compare."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
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


def threaded_rate(call: Callable[[int], Any], n: int, threads: int, next_id: Callable[[], int],
                  repeats: int = 2, after: Callable[[], Any] | None = None) -> float:
    """Records per second when ``threads`` threads make ``n`` calls in all of
    ``call(next_id())`` (then ``after()``, e.g. a flush); best of ``repeats``."""
    per = n // threads
    best = 0.0
    for _ in range(repeats):
        def work() -> None:
            for _ in range(per):
                call(next_id())

        pool = [threading.Thread(target=work) for _ in range(threads)]
        start = time.perf_counter()
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        if after is not None:
            after()
        best = max(best, per * threads / (time.perf_counter() - start))
    return best


def submit_rate(producer: Any, n: int, threads: int, next_id: Callable[[], int], repeats: int = 2) -> float:
    """Durable records per second: ``submit()`` typical capsules, then ``flush()``."""
    return threaded_rate(lambda i: producer.submit(typical_spec(i)), n, threads, next_id, repeats, after=producer.flush)
