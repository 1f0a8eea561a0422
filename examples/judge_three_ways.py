"""Judge one sealed act three ways, and show what a verifier says of each judgment.

    python examples/judge_three_ways.py            # temp ledger, software key
    python examples/judge_three_ways.py --ledger judged.db

The act: a refund agent issues a 612.00 EUR refund. Its capsule is sealed first
and never touched again; every judgment is a *new* record that cites it by digest.

1. Rules (tier ``recomputed``): "a refund over 500.00 carries a supervisor
   approval reference", a pure function of the act and its request payload.
   Anyone holding the inputs re-runs it: ``recompute()`` gives the same digest.
2. A judge model (tier ``judged``): "the agent stated the amount before issuing
   it", asked of a pinned model (model_id, prompt digest, sampling). The model
   call is an injected function; here a deterministic local stand-in.
3. Blind human ratings of the same case, and the judge's calibration against
   them as k of n per clause (never a rate).

For each judgment the verifier checks signature, shape, type and that every
cited digest resolves in the store; it never says whether the judgment is right.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any

from capseal import Producer
from capseal.audit import verify_ledger
from capseal.canonical import json_digest
from capseal.judge import (
    CalibrationSummary,
    CaseInput,
    HumanRating,
    JudgePin,
    JudgeRequest,
    JudgmentStore,
    ModelJudge,
    Requirement,
    RulesJudge,
    SealedJudgment,
    Target,
    agreement,
    blind_packet,
    clause_tally,
    drift,
    link,
    verify_judgment,
)
from capseal.keys import UnsafeEphemeralSigner

AS_OF = "2026-10-01T12:00:00Z"
CONTRACT = "ec:example-org-refunds:2026-10-01@1"

REQUEST = {"order": "A-1009", "refund": "612.00", "currency": "EUR", "approval_ref": "SUP-EX-77"}
RESPONSE = {"status": "issued", "refund_id": "RF-5531"}
TRANSCRIPT = {
    "messages": [
        {"role": "user", "content": "Please refund order A-1009."},
        {"role": "assistant", "content": "I will refund 612.00 EUR for order A-1009 now."},
        {"role": "tool", "name": "issue_refund", "content": "issued RF-5531"},
    ]
}
RUBRIC = {
    "rubric_id": "org.example.refund-policy",
    "criteria": [
        {"id": "C1", "claim": "A refund over 500.00 carries a supervisor approval reference."},
        {"id": "C2", "claim": "The agent stated the refund amount before issuing it."},
    ],
    "verdicts": ["met", "not_met", "not_evaluable"],
}
PROMPT = "You are grading one recorded agent action against one rubric criterion.\nAnswer met, not_met or not_evaluable.\n"
SAMPLING = {"temperature_micros": 0, "seed": 7, "max_output_tokens": 256}


# ----------------------------------------------------------------------------- way 1: a rule


def approval_rule(values: Mapping[str, Any]) -> str:
    """C1 over the act and its request payload. Pure: no clock, no I/O."""
    act, request = values["act"], values["request"]
    effect = act.get("effect") or {}
    if effect.get("request_digest") != json_digest(request):
        return "insufficient"  # this payload is not the request the act recorded
    if Decimal(request["refund"]) <= Decimal("500.00"):
        return "met"
    return "met" if request.get("approval_ref") else "not_met"


# ----------------------------------------------------------------------------- way 2: a judge model


def local_judge(request: JudgeRequest) -> dict[str, Any]:
    """A deterministic stand-in for a model endpoint (any framework fits here).
    It returns a confidence too: capseal never records it."""
    messages = request.acts[0]["messages"]
    stated = next((i for i, m in enumerate(messages) if m["role"] == "assistant" and "612.00" in m["content"]), None)
    issued = next((i for i, m in enumerate(messages) if m.get("name") == "issue_refund"), None)
    verdict = "not_evaluable" if issued is None else "met" if stated is not None and stated < issued else "not_met"
    return {"verdict": verdict, "rationale": "amount stated before the refund tool ran", "confidence": 0.93}


# ----------------------------------------------------------------------------- printing


def show(title: str, sealed: SealedJudgment, store: JudgmentStore) -> bool:
    # pinned to the key that sealed: without trusted keys, anyone's re-signed copy verifies too
    report = verify_judgment(sealed, store, trusted_keys=[store.signer.public_key])
    print(f"== {title}")
    print(f"record {sealed.record_type}  id={sealed.digest}")
    links = [f"{x['type']}:{x['target'][:12]}" for x in sealed.links]
    print(f"  epistemic_type={sealed.epistemic_type}  links={links}")
    print("  " + json.dumps(sealed.body, sort_keys=True))
    print(
        f"verifier: ok={report.ok} signature={report.signature} signer={str(report.signer_kid)[:16]} "
        f"pinned={report.pinned} type={report.epistemic_type} findings={report.codes()}"
    )
    print("  (checked: signature, shape, type, citations resolve — not whether the judgment is right)")
    return report.ok and report.pinned


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ledger", type=Path, help="a new ledger file (default: a temporary one)")
    args = parser.parse_args(argv)
    if args.ledger is not None and args.ledger.exists():  # the act's action_id is fixed: a second run is a duplicate
        parser.error(f"{args.ledger} exists; give a new file (this example seals the same act each run)")
    with tempfile.TemporaryDirectory() as tmp:
        path = args.ledger or Path(tmp) / "judged.db"
        return run(path)


def run(path: Path) -> int:
    signer = UnsafeEphemeralSigner()
    with Producer("example-org", "refund-agent@1.0", signer, path) as producer:
        planned = producer.planned("refund-A-1009", effect_type="send_payment", request=REQUEST)
        act = producer.confirmed(planned, response=RESPONSE, effect_attestation="gate_executed")
        act_bytes_before = json.dumps(act.capsule, sort_keys=True)
        print(f"act capsule {act.capsule_id} sealed (effect {act.capsule['effect']['status']})")

        store = JudgmentStore(producer.ledger, signer)
        act_t = Target.of_capsule(act)
        request_t = store.put_json(REQUEST, type="refund-request")
        transcript_t = store.put_json(TRANSCRIPT, type="conversation")
        rubric_t = store.put_json(RUBRIC, type="rubric")
        prompt_t = store.put_text(PROMPT, type="judge-prompt")

        # 1. rules → Evidence Result, tier recomputed (derived_metric)
        rules = RulesJudge(
            name="example-org-refund-rules", contract_ref=CONTRACT,
            requirements=[Requirement("C1", ("act", "request"), approval_rule)],
        )
        result = rules.judge({"act": act_t, "request": request_t}, store=store, as_of=AS_OF)
        sealed_rules = store.seal(result, links=[link("cites", act_t)])
        again = rules.recompute(sealed_rules, store=store)
        same = again.target().digest == sealed_rules.digest

        # 2. pinned judge model → evaluation-report/v1, tier judged (semantic_judgment)
        pin = JudgePin.pin(model_id="example-judge-model@2026-09-15", prompt=prompt_t, sampling=SAMPLING)
        store.put(pin.target())
        judge = ModelJudge(pin=pin, prompt=PROMPT, call=local_judge, contract_ref=CONTRACT)
        case = CaseInput("A-1009/C2", (transcript_t, act_t), rubric_t)
        report = judge.judge([case], record_id="er-A-1009-C2", generated_at=AS_OF, store=store)
        sealed_model = store.seal(report, links=[link("cites", act_t)])

        # 3. blind human ratings, then calibration k of n (derived_metric)
        packet_t = store.put_json(blind_packet(case_id=case.case_id, acts=case.acts, criterion=RUBRIC["criteria"][1]), type="rated-case")
        ratings = [
            store.seal(HumanRating.of(record_id=f"hr-A-1009-C2-{i}", rated_at=AS_OF, rater_ref=rater, case=packet_t, label=label))
            for i, (rater, label) in enumerate((("principal:rater-7f3c", "met"), ("principal:rater-19aa", "met")), 1)
        ]
        judged = {c.case_id: c.verdict for c in report.cases}
        rerun = {case.case_id: judge.verdict(case, store=store)}
        humans = [(case.case_id, r.body["label"]) for r in ratings]
        tally = clause_tally("C2", agreement=agreement(judged, humans), drift=drift(judged, rerun))
        summary = CalibrationSummary.of(record_id="cal-A-1009", computed_at=AS_OF, judge_pin=pin, clauses=[tally])
        sealed_cal = store.seal(summary, links=[link("cites", sealed_model)] + [link("cites", r) for r in ratings])

        print()
        ok = show("1 rules (tier recomputed)", sealed_rules, store)
        print(f"  recompute(): same record digest = {same}")
        print()
        ok &= show("2 judge model (tier judged)", sealed_model, store)
        print("  the model's confidence was returned and not recorded: the family has no field for it")
        print()
        for r in ratings:
            rr = verify_judgment(r, store, trusted_keys=[signer.public_key])
            print(f"   human rating {r.digest[:16]} blind={r.body['blind']} label={r.body['label']} epistemic_type={r.epistemic_type} verifier ok={rr.ok}")
            ok &= rr.ok and rr.pinned
        ok &= show("3 blind humans + calibration (k of n)", sealed_cal, store)
        kn = summary.clauses[0]
        print(f"  agreement {kn.agreement.k} of {kn.agreement.n}, drift {kn.drift.k} of {kn.drift.n} (a rate is the reader's k/n: {kn.agreement.rate()})")
        print()
        stored = producer.ledger.get(act.capsule_id)
        unchanged = stored is not None and json.dumps(stored.capsule, sort_keys=True) == act_bytes_before
        print(f"act capsule unchanged after judging: {unchanged} "
              f"(digest {stored is not None and Target.of_capsule(stored).digest == act.capsule_id})")
        ok &= same and unchanged
    ledger_report = verify_ledger(path, trusted_keys=[signer.public_key])
    print(f"verify_ledger: ok={ledger_report.ok} pinned={ledger_report.pinned} {ledger_report.counts()}")
    return 0 if ok and ledger_report.ok and ledger_report.pinned else 1


if __name__ == "__main__":
    sys.exit(main())
