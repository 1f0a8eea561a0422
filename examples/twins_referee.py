"""Twins and a referee: one pair under the three regimes of the rules, end to end.

    python examples/twins_referee.py                      # a temporary directory, file keys
    python examples/twins_referee.py --workdir DIR        # keep the ledgers and case files in DIR
    python examples/twins_referee.py --referee-key 'pkcs11:token=…;object=…?module-path=…&pin-source=…'

Two serving nodes answered the same request at temperature 0, on the same model
and weights. node-a answered "1, 2, 3, 4, 5"; node-b "1, 2, 3, 999 5" (they split
at the fourth word). Each sealed its own half with its own key, in its own
ledger, with the answer's digest in it; the host marked the two as one pair
(bracket-1). The comparing node holds both halves and asks:

1. with the operator switch off: nothing is called, the row says ``off``;
2. with it on and node-c eligible (it corroborated on this model before, so
   tier 1): node-c re-answers "1, 2, 3, 4, 5", seals its answer as a capsule of
   its own, and signs an adjudication/v1 — node-b is contradicted;
3. with nobody eligible: nothing is called, the row says ``no_eligible_referee``.

Each regime's answer is printed next to the rules' answer for it. The ruling
is checked as a judgment record (signature, shape, citations — not whether it
is right) and under node-c's announced key; every book verifies; the halves are
unchanged. The three case files are written beside the ledgers, so
``capseal referee rule DIR/<regime>.json`` replays each.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization

from capseal import Producer
from capseal.audit import verify_ledger
from capseal.canonical import json_digest
from capseal.judge import verify_judgment
from capseal.judge.referee import (
    Book,
    Candidate,
    Recorded,
    Referee,
    RefereeSeat,
    ReplayTransport,
    Settings,
    load_half,
    make_pair,
    seal_half,
    verify_ruling,
)
from capseal.judge.referee.bar import parse_time
from capseal.keys import generate_private_key, open_signer, write_pkcs8

NOW = "2026-10-01T12:00:00Z"
# the model hash and weights digest of the rule corpus's pair (Mesh-LLM/capsules, v0.1.4)
MODEL = "b2767326b03d5e629546363ebe41714b78065e028709580996d60d2d119192da"
WEIGHTS = "ac28b90e169cc75956ee6283ac8dc787a945696122692a3b2f266d8453ff56cc"
REQUEST = {"model": "seed-model", "messages": [{"role": "user", "content": "Count from 1 to 5."}], "temperature": 0, "seed": 7}
ANSWERS = {"node-a": "1, 2, 3, 4, 5", "node-b": "1, 2, 3, 999 5"}
REANSWER = "1, 2, 3, 4, 5"
EARLIER = {"node_id": "node-c", "model_hash": MODEL, "bucket": "corroborated", "recorded_at": "2026-09-01T00:00:00Z"}

#: the rules' answer for this pair under each regime
EXPECTED = {
    "operator_off_calls_nothing_and_says_so":
        {"counts_against": None, "referee_calls": 0, "row": {"reason": "off", "state": "not_adjudicated"}},
    "differing_pair_triggers_one_call":
        {"counts_against": "node-b", "referee_calls": 1,
         "row": {"referee": "node-c", "state": "adjudicated", "tier": 1, "verdict": "contradicted:node-b"}},
    "no_eligible_referee":
        {"counts_against": None, "referee_calls": 0, "row": {"reason": "no_eligible_referee", "state": "not_adjudicated"}},
}


def line(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def key_uri(workdir: Path, node: str, given: str | None) -> str:
    if given:
        return given
    path = workdir / "keys" / f"{node}.pem"
    path.parent.mkdir(exist_ok=True)
    write_pkcs8(generate_private_key("ed25519"), path)
    return f"file:{path}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, help="a new directory for the ledgers and case files (default: temporary)")
    for node in ("node-a", "node-b", "referee"):
        parser.add_argument(f"--{node}-key", metavar="URI", help=f"{node}'s signing key URI (default: a new file key)")
    args = parser.parse_args(argv)
    if args.workdir is not None:
        if args.workdir.exists() and any(args.workdir.iterdir()):
            parser.error(f"{args.workdir} is not empty; give a new directory (the halves are sealed afresh each run)")
        args.workdir.mkdir(parents=True, exist_ok=True)
        return run(args.workdir, args)
    with tempfile.TemporaryDirectory() as tmp:
        return run(Path(tmp), args)


def run(workdir: Path, args: argparse.Namespace) -> int:
    uris = {"node-a": key_uri(workdir, "node-a", args.node_a_key), "node-b": key_uri(workdir, "node-b", args.node_b_key),
            "node-c": key_uri(workdir, "node-c", args.referee_key), "keeper": key_uri(workdir, "keeper", None)}
    signers = {node: open_signer(uri) for node, uri in uris.items()}
    try:
        return _run(workdir, uris, signers)
    finally:
        for signer in signers.values():
            signer.close()


def _run(workdir: Path, uris: dict[str, str], signers: dict[str, Any]) -> int:
    records = {}
    for node, text in ANSWERS.items():  # each twin seals its own half, in its own ledger
        with Producer("mesh.example", f"{node}@1", signers[node], workdir / f"{node}.db", clock=lambda: NOW) as producer:
            records[node] = seal_half(producer, action_id="answer-1", node_id=node, request=REQUEST, body=text,
                                      model_hash=MODEL, weights_digest=WEIGHTS, temperature=0, seed=7)
        print(f"{node}   sealed its half {records[node].capsule_id} ({signers[node].describe_short()})")
    print(f"node-c   the referee signs with {signers['node-c'].describe_short()}")
    before = {n: json.dumps(r.capsule, sort_keys=True) for n, r in records.items()}
    everyone = [Candidate(n, MODEL, WEIGHTS, signers[n].public_key) for n in ("node-a", "node-b", "node-c")]
    regimes = {
        "operator_off_calls_nothing_and_says_so": (Settings(adjudicate_differing_twins=False), everyone),
        "differing_pair_triggers_one_call": (Settings(adjudicate_differing_twins=True), everyone),
        "no_eligible_referee": (Settings(adjudicate_differing_twins=True), everyone[:2]),
    }
    ok = True
    for name, (settings, roster) in regimes.items():
        write_case(workdir / f"{name}.json", settings, roster, records, uris["node-c"])
        halves = [load_half(records[n], node_id=n, announced=signers[n].public_key, text=t, request=REQUEST)
                  for n, t in ANSWERS.items()]
        pair = make_pair("bracket-1", json_digest(REQUEST), halves, request=REQUEST)
        book = Book(workdir / f"book-{name}.db", signers["keeper"])
        seat = RefereeSeat("node-c", signers["node-c"], book.ledger, roster=roster, clock=lambda: NOW)
        try:
            referee = Referee(book, roster=roster, settings=settings, transport=ReplayTransport({"node-c": REANSWER}),
                              seats={"node-c": seat}, clock=lambda: NOW,
                              history=[Recorded("node-c", MODEL, "corroborated", parse_time(EARLIER["recorded_at"]))])
            answer = referee.consider(pair)
            same = answer.to_json() == EXPECTED[name]
            ok &= same
            print(f"{name}: {line(answer.to_json())} (the rules' answer: {'yes' if same else 'NO'})")
            row = answer.book_row
            if row is not None and row.ruling_id is not None and row.statement_id is not None:
                judged = verify_judgment(row.ruling_id, book.ledger)
                taken = verify_ruling(book.ledger, statement_id=row.statement_id, ruling_id=row.ruling_id,
                                      referee_key=signers["node-c"].public_key, expect={"referee": "node-c", "tier": 1})
                print(f"  ruling {row.ruling_id} adjudication/v1: verify_judgment ok={judged.ok} "
                      f"signature={judged.signature} epistemic_type={judged.epistemic_type}; under node-c's announced key "
                      f"ok={taken.ok} (checked: signatures, citations, tier — not whether it is right)")
                ok &= judged.ok and taken.ok
        finally:
            seat.close()
            book.close()
        report = verify_ledger(workdir / f"book-{name}.db")
        print(f"  verify_ledger book-{name}.db: ok={report.ok} {report.counts()}")
        ok &= report.ok
    unchanged = all(json.dumps(load_capsule(workdir / f"{n}.db", r.capsule_id), sort_keys=True) == before[n]
                    for n, r in records.items())
    print(f"halves unchanged: {unchanged}")
    print(f"case files: {', '.join(sorted(p.name for p in workdir.glob('*.json')))}")
    return 0 if ok and unchanged else 1


def load_capsule(ledger: Path, capsule_id: str) -> dict[str, Any]:
    from capseal.ledger import Ledger

    with Ledger(ledger, readonly=True) as kept:
        record = kept.get(capsule_id)
        assert record is not None
        return dict(record.capsule)


def write_case(path: Path, settings: Settings, roster: list[Candidate], records: dict[str, Any], referee_key: str) -> None:
    """The regime as a case file, for ``capseal referee rule``."""
    case = {
        "now": NOW,
        "settings": {"adjudicate_differing_twins": settings.adjudicate_differing_twins, "referee_bar_days": None},
        "pair": {"twin_bracket_id": "bracket-1", "request_digest": json_digest(REQUEST), "request": REQUEST,
                 "halves": [{"node_id": n, "model_hash": MODEL, "weights_digest": WEIGHTS, "temperature": 0, "text": t,
                             "capsule_id": records[n].capsule_id, "record": records[n].to_json()}
                            for n, t in ANSWERS.items()]},
        "roster": [{"node_id": c.node_id, "model_hash": c.model_hash, "weights_digest": c.weights_digest,
                    "announced_key": pem_of(c.announced_key), "blocked": c.blocked} for c in roster],
        "history": [EARLIER],
        "referee": {"node-c": {"reanswer": REANSWER, "signs": True, "key": referee_key}},
    }
    path.write_text(json.dumps(case, indent=1))


def pem_of(public_key: Any) -> str:
    return str(public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode())


if __name__ == "__main__":
    sys.exit(main())
