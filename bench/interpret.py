"""Reading verdicts: ``interpret`` over judgment records read from a ledger.

Seals a mix of judgment records into a temporary ledger (software key):
evaluation reports of two cases, Evidence Results of two claims, blind human
ratings, stored jury verdicts kept as ``jury-verdict`` artifacts and referee
book rows, in equal shares; then prints, best of ``--rounds``:

  * records/s of ``read_source`` over the whole ledger (open it read-only,
    read every row, parse, interpret, summarise every record and item), the
    path ``capseal interpret LEDGER`` takes;
  * records/s of ``read`` alone over the parsed stored rows.

Target: under a second per 1,000 records (at least 1,000 records/s).

Usage: python bench/interpret.py [--n 10000] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from capseal import Producer
from capseal.canonical import json_digest
from capseal.judge import (
    Case,
    Claim,
    EvaluationReport,
    HumanRating,
    JudgePin,
    JudgmentStore,
    ResultBuilder,
    Target,
    blind_packet,
)
from capseal.judge.interpret import JURY_VERDICT_ARTIFACT, read, read_source
from capseal.keys import UnsafeEphemeralSigner
from capseal.ledger import Ledger, LedgerEntry
from capseal.record import storage_json, strict_json

NOW = "2026-10-01T12:00:00Z"
CONTRACT = "ec:example-org-bench:2026-10-01@1"


def jury_verdict(i: int) -> str:
    """A 0.17 cascade verdict (one tier adopted), as the JSON text a pipeline keeps."""
    judge = {"status": "pass", "reasoning": f"case {i} passed", "checks": [{"name": "c", "passed": True, "message": "ok"}]}
    block = {"strategy": "consensus", "errorPolicy": "propagate", "notApplicablePolicy": "refuse", "inputCount": 1,
             "eligibleCount": 1, "passCount": 1, "failCount": 0, "errorCount": 0, "notApplicableCount": 0}
    aggregated = {"status": "pass", "reasoning": "Unanimous consensus", "checks": [], "metadata": {"aggregation": block}}
    node = {"aggregated": aggregated, "individual": [judge], "individualByName": {"j": judge}, "weights": {"0": 1.0},
            "seats": [{"position": 0, "verdictKey": "j", "keySource": "DECLARED"}]}
    tier = {**node, "decision": {"kind": "own"}, "compositeAttempts": []}
    return json.dumps({**node, "decision": {"kind": "tier", "tier": "t", "basis": "tier_outcome"},
                       "compositeAttempts": [{"name": "t", "relation": "cascade_tier", "policy": "FINAL_TIER",
                                              "disposition": "used", "verdict": tier}]})


def build(path: Path, n: int) -> None:
    signer = UnsafeEphemeralSigner()
    with Producer("example-org", "bench-agent@1", signer, path) as producer:
        act = producer.seal({"action_id": "act", "action_type": "fyi"})
        act_t = Target.of_capsule(act)
        with Ledger(path, synchronous="NORMAL") as ledger:  # setup only: the bench reads, it does not time this
            store = JudgmentStore(ledger, signer)
            rubric = store.put_json({"rubric_id": "r"}, type="rubric")
            prompt = store.put_text("Grade it.\n", type="judge-prompt")
            pin = JudgePin.pin(model_id="bench-judge@1", prompt=prompt, sampling={"temperature_micros": 0})
            store.put(pin.target())
            packet = store.put_json(blind_packet(case_id="c", acts=[act_t], criterion={"id": "C1"}), type="rated-case")
            for i in range(-(-n // 5)):  # five judgment records a round
                store.seal(EvaluationReport(record_id=f"er-{i}", generated_at=NOW, contract_ref=CONTRACT, judge_pin=pin,
                                            cases=[Case.of(f"c{i}-1", "met", acts=[act_t], method=rubric),
                                                   Case.of(f"c{i}-2", "not_met", acts=[act_t], method=rubric)]))
                builder = ResultBuilder(generated_at=NOW)
                builder.add(Claim.of(id=f"claim-{i}-1", contract_ref=CONTRACT, requirement_ref="C1", tier="judged",
                                     grade="self-attested", sufficiency="SATISFIED", verdict="met", evidence=[act_t]))
                builder.add(Claim.of(id=f"claim-{i}-2", contract_ref=CONTRACT, requirement_ref="C2", tier="judged",
                                     grade="self-attested", sufficiency="GAP", verdict="not_evaluable", evidence=[act_t]))
                store.seal(builder.build())
                store.seal(HumanRating.of(record_id=f"hr-{i}", rated_at=NOW, rater_ref=f"principal:r{i}", case=packet, label="met"))
                store.put_text(jury_verdict(i), type=JURY_VERDICT_ARTIFACT)
                entry = {"book_version": "capseal-referee-book/1", "pair": {"node_ids": ["node-a", "node-b"]}, "called": True,
                         "capsule_ids": [act.capsule_id], "at": NOW,
                         "row": {"state": "adjudicated", "referee": "node-c", "tier": 1, "verdict": f"contradicted:node-{'ab'[i % 2]}"},
                         "n": i}
                ledger.append(LedgerEntry(record_id=json_digest(entry), record_type="referee:book-row",
                                          epistemic_type="producer_claim", body=storage_json(entry)))


def best_rate(fn: Any, count: int, rounds: int) -> float:
    best = 0.0
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        best = max(best, count / (time.perf_counter() - start))
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10_000, help="judgment records to read (default %(default)s)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "judged.db"
        build(path, args.n)
        source = read_source(path)
        records = len(source.records)
        items = sum(len(r.reading.items) for r in source.records)
        whole = best_rate(lambda: read_source(path), records, args.rounds)
        with Ledger(path, readonly=True) as ledger:
            rows = [strict_json(e.body, "row") for e in ledger.entries() if e.record_type.startswith(("judge:", "referee:"))]
        rows = [r for r in rows if not (r.get("record_version") == "capseal-artifact/1" and r.get("artifact_type") != JURY_VERDICT_ARTIFACT)]
        alone = best_rate(lambda: [read(r) for r in rows], len(rows), args.rounds)
    result = {"records": records, "items": items, "read_source_records_per_s": round(whole), "read_records_per_s": round(alone),
              "seconds_per_1000_records": round(1000 / whole, 3)}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"interpret: {records} judgment records ({items} items) from a ledger")
        print(f"  read_source (open, read, parse, interpret, summarise): {whole:,.0f} records/s "
              f"({1000 / whole:.3f} s per 1,000 records)")
        print(f"  read alone over parsed rows:                          {alone:,.0f} records/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
