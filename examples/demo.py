"""capseal end to end (what `make demo` runs).

Seals an agent's actions into a durable ledger with a software key, shows two
refusals (an overclaim and a float), then verifies the ledger with capseal and
each capsule with the published reference verifier. Prints what it did.

Usage: python examples/demo.py [WORKDIR]   (default: a fresh temporary directory;
a WORKDIR is one without an earlier run's seal-key.pem and capsules.db). With a
WORKDIR (``make demo`` gives one under .work/) the ledger, the key and its
public key stay there, and the commands that inspect them are printed.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import capseal
from capseal import Producer
from capseal.errors import AssuranceOverclaimError, FloatInDigestError
from capseal.keys import generate_private_key, open_signer, write_pkcs8


def main(workdir: Path, keep: bool = False) -> int:
    key_path = workdir / "seal-key.pem"
    ledger_path = workdir / "capsules.db"
    write_pkcs8(generate_private_key("EdDSA"), key_path)
    signer = open_signer(f"file:{key_path}")
    print(f"key      {signer.alg} kid={signer.kid[:16]}… ({signer.describe()['key_store']}, software)")

    with Producer("acme.example", "buyer-agent@1.4", signer, ledger_path) as producer:
        order = {"sku": "A-100", "qty": 3, "unit_price": "19.90"}
        planned = producer.planned("po-7", effect_type="write_order", request=order)
        dispatched = producer.dispatched(planned, effect_attestation="runtime_claimed")
        confirmed = producer.confirmed(dispatched, response={"order_id": "O-5531", "status": "accepted"},
                                       effect_attestation="gate_executed")
        denied = producer.refused(action_id="pay-9", verdict_class="denied", reason={"rule": "amount above ceiling"})
        deferred = producer.seal({"action_id": "pay-10", "action_type": "decide",
                                  "disposition": {"decision": "deferred", "approver": "policy", "human_disposed": False,
                                                  "verdict_class": "deferred",
                                                  "expiry_policy": {"ttl_seconds": 86400, "on_expiry": "escalated"}}})
        resolved = producer.resolved(deferred, decision="accept", approver="human")
        for r in (producer.epoch_record, planned, dispatched, confirmed, denied, deferred, resolved):
            c = r.capsule
            what = c.get("effect", {}).get("status") or c.get("disposition", {}).get("verdict_class")
            print(f"sealed   {c['action_id']:<32} {what:<15} effect_mode={c['assurance']['effect_mode']:<22} "
                  f"ledger_mode={c['assurance']['ledger_mode']}")
        try:
            producer.seal({"action_id": "boast", "action_type": "decide", "effect": {"status": "planned"},
                           "assurance": {"attestation_mode": "anchored", "effect_mode": "confirmed", "ledger_mode": "anchored"}})
        except AssuranceOverclaimError as exc:
            print(f"refused  overclaim: {exc}")
        try:
            producer.seal({"action_id": "float", "action_type": "decide", "x-invoice": {"amount": 59.7}})
        except FloatInDigestError as exc:
            print(f"refused  float: {exc}")
        count = producer.ledger.count()
    print(f"ledger   {ledger_path.name}: {count} records (nothing written for the refusals)")
    print(f"evidence hardware_evidence={confirmed.hardware_evidence} (no TPM quote taken)")

    report = capseal.verify_ledger(ledger_path)
    print(f"capseal  verify_ledger: ok={report.ok}, {report.counts()['records']} records, "
          f"signatures {report.counts().get('signature:authored', 0)} authored")
    try:
        import agent_action_capsule as reference
        from agent_action_capsule.producer_envelope import verify_record_signature
    except ImportError:
        print("reference verifier not installed (pip install 'capseal[test]')")
        return 0 if report.ok else 1
    with capseal.Ledger(ledger_path, readonly=True) as ledger:
        capsules = [r.capsule for r in ledger.records()]
    ref_ok = all(res.ok for res in reference.verify_store(capsules))
    authored = sum(verify_record_signature(c)[0] == "authored" for c in capsules)
    print(f"reference agent-action-capsule {reference.__version__}: ok={ref_ok}, {authored}/{len(capsules)} signatures authored")
    if keep:
        public = workdir / "seal-key.pub.pem"
        public.write_text(signer.public_key_pem())
        print(f"kept     {workdir}: inspect it with (after `. .venv/bin/activate`)")
        print(f"           capseal ledger show {ledger_path}")
        print(f"           capseal verify {ledger_path} --trust {public}")
    return 0 if report.ok and ref_ok else 1


if __name__ == "__main__":
    if len(sys.argv) > 1:
        target = Path(sys.argv[1])
        # a key file is never overwritten, and the demo's action ids are fixed: a
        # second run in one WORKDIR would stop half-way with a traceback
        earlier = [name for name in ("seal-key.pem", "capsules.db") if (target / name).exists()]
        if earlier:
            print(f"demo.py: {target} holds {' and '.join(earlier)} from an earlier run; give a new WORKDIR",
                  file=sys.stderr)
            sys.exit(2)
        target.mkdir(parents=True, exist_ok=True)
        sys.exit(main(target, keep=True))
    with tempfile.TemporaryDirectory(prefix="capseal-demo-") as tmp:
        sys.exit(main(Path(tmp)))
