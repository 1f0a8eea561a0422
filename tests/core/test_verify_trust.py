"""``capseal verify`` names who signed and whether anyone pinned them; ``--trust``
(PEM keys or a trust file) pins; ``seal`` asks for a throwaway key by its
unsafe name; several targets; a summary unless ``-v``. Real subprocesses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization

import capseal
from capseal.envelope import sign_envelope
from capseal.keys import UnsafeEphemeralSigner, open_signer

CLI = str(Path(sys.executable).parent / "capseal")
SPECS = [
    {"action_id": "po-1", "action_type": "decide", "effect": {"status": "planned", "type": "write_order"}},
    {"action_id": "po-1/confirmed", "action_type": "decide",
     "effect": {"status": "confirmed", "type": "write_order", "response_digest": "b" * 64, "effect_attestation": "gate_executed"}},
]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([CLI, *args], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


class Sealed:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.key = tmp / "k.pem"
        made = run("keys", "create", f"file:{self.key}", "--alg", "ed25519", "--json")
        assert made.returncode == 0, made.stderr
        self.kid = json.loads(made.stdout)["kid"]
        self.public = tmp / "pub.pem"
        self.public.write_text(json.loads(made.stdout)["public_key_pem"])
        spec = tmp / "spec.json"
        spec.write_text(json.dumps(SPECS))
        self.ledger = tmp / "l.db"
        proc = run("seal", str(spec), "--key", f"file:{self.key}", "--ledger", str(self.ledger),
                   "--operator", "acme", "--developer", "a@1", "--record", "--json")
        assert proc.returncode == 0, proc.stderr
        self.record = tmp / "record.json"
        self.record.write_text(json.dumps(json.loads(proc.stdout)[1]))


@pytest.fixture()
def sealed(tmp_path: Path) -> Sealed:
    return Sealed(tmp_path)


def _pem(key: Any) -> str:
    return str(key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode())


# --------------------------------------------------------------------------- no trust anchor


def test_a_ledger_nobody_pinned_does_not_read_as_plain_ok(sealed: Sealed) -> None:
    text = run("verify", str(sealed.ledger))
    assert text.returncode == 0  # intact and signed: the exit code keeps the reference's meaning
    headline = text.stdout.splitlines()[0]
    assert headline.startswith("ok (signers not pinned)  "), headline
    assert f"signer {sealed.kid[:16]}…: 3 records, NOT PINNED" in text.stdout
    assert "--trust" in text.stdout
    report = json.loads(run("verify", str(sealed.ledger), "--json").stdout)
    assert report["ok"] and report["trust"]["pinned"] is False and report["trust"]["anchors"] == 0
    assert [(s["kid"], s["records"], s["pinned"]) for s in report["trust"]["signers"]] == [(sealed.kid, 3, False)]
    assert report["trust"]["signers"][0]["custody"] == {"backend": "software", "key_store": "file", "software_device": True}
    for record in report["records"]:
        assert record["signer_pinned"] is False and record["signer_kid"] == sealed.kid
        assert ("signer_not_pinned", "warning") in {(f["code"], f["severity"]) for f in record["findings"]}


def test_trust_pins_the_signer_and_any_other_signer_is_an_error(sealed: Sealed, tmp_path: Path) -> None:
    pinned = run("verify", str(sealed.ledger), "--trust", str(sealed.public))
    assert pinned.returncode == 0 and pinned.stdout.startswith("ok  ") and "not pinned" not in pinned.stdout
    assert f"signer {sealed.kid[:16]}…: 3 records, pinned" in pinned.stdout
    report = json.loads(run("verify", str(sealed.ledger), "--trust", str(sealed.public), "--json").stdout)
    assert report["trust"]["pinned"] and all(r["signer_pinned"] for r in report["records"])
    assert not any(f["code"] == "signer_not_pinned" for r in report["records"] for f in r["findings"])
    other = tmp_path / "other.pem"
    other.write_text(_pem(UnsafeEphemeralSigner().public_key))
    proc = run("verify", str(sealed.ledger), "--trust", str(other), "--json")
    assert proc.returncode == 1
    assert all("signer_not_trusted" in {f["code"] for f in r["findings"]} for r in json.loads(proc.stdout)["records"])


def test_a_trust_file_pins_by_kid_or_pem_and_is_checked(sealed: Sealed, tmp_path: Path) -> None:
    trust = tmp_path / "trust.json"
    trust.write_text(json.dumps({"trust_version": "capseal-trust/1",
                                 "keys": [{"kid": sealed.kid, "label": "sealer-1"},
                                          {"public_key_pem": _pem(UnsafeEphemeralSigner().public_key)}]}))
    proc = run("verify", str(sealed.ledger), "--trust", str(trust))
    assert proc.returncode == 0 and f"signer {sealed.kid[:16]}… (sealer-1): 3 records, pinned" in proc.stdout
    assert run("verify", str(sealed.record), "--trust", str(trust)).returncode == 0
    bad_entries = {
        "mismatch": {"kid": "ab" * 32, "public_key_pem": sealed.public.read_text()},
        "unknown member": {"kid": sealed.kid, "public_key": "…"},
        "no key": {"label": "x"},
        "short kid": {"kid": "abcd"},
    }
    for what, entry in bad_entries.items():
        trust.write_text(json.dumps({"trust_version": "capseal-trust/1", "keys": [entry]}))
        proc = run("verify", str(sealed.ledger), "--trust", str(trust))
        assert proc.returncode == 2 and f"--trust {trust}: keys[0]" in proc.stderr, (what, proc.stderr)
        assert proc.stdout == ""  # refused before anything is verified
    trust.write_text(json.dumps({"keys": [{"kid": sealed.kid}]}))
    proc = run("verify", str(sealed.ledger), "--trust", str(trust))
    assert proc.returncode == 2 and "trust_version" in proc.stderr
    trust.write_text(sealed.key.read_text())  # a private key by mistake: refused, not echoed
    proc = run("verify", str(sealed.ledger), "--trust", str(trust))
    assert proc.returncode == 2 and "private key" in proc.stderr and "PRIVATE KEY-----\n" not in proc.stderr


def test_a_record_re_signed_by_another_key_reads_as_unpinned_then_untrusted(sealed: Sealed, tmp_path: Path) -> None:
    """The attack: edit a record, recompute its id and sign it with a key of
    one's own. Without an anchor the signature is valid, so it must be said
    that nobody pinned that key; with ``--trust`` it is an error."""
    data = json.loads(sealed.record.read_text())
    capsule = data["capsule"]
    capsule["effect"]["response_digest"] = "c" * 64
    for member in ("signature", "key_id", "capsule_id"):
        capsule.pop(member)
    capsule["capsule_id"] = capseal.capsule_id(capsule)
    forger = UnsafeEphemeralSigner()
    envelope = sign_envelope(forger, bytes.fromhex(capsule["capsule_id"]))
    capsule["signature"], capsule["key_id"] = envelope.cose.hex(), envelope.kid
    data["envelopes"] = [envelope.to_json()]
    forged = tmp_path / "forged.json"
    forged.write_text(json.dumps(data))
    text = run("verify", str(forged))
    assert text.returncode == 0 and "signature=authored (signer not pinned)" in text.stdout
    assert "signer_not_pinned" in text.stdout and forger.kid in text.stdout
    result = json.loads(run("verify", str(forged), "--json").stdout)
    assert result["signer_kid"] == forger.kid and result["signer_pinned"] is False
    proc = run("verify", str(forged), "--trust", str(sealed.public), "--json")
    assert proc.returncode == 1 and "signer_not_trusted" in {f["code"] for f in json.loads(proc.stdout)["findings"]}


# --------------------------------------------------------------------------- a throwaway key asks for its unsafe name


def test_seal_refuses_an_ephemeral_key_unless_asked_by_its_unsafe_name(tmp_path: Path) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPECS[0]))
    ledger = tmp_path / "e.db"
    common = ("--ledger", str(ledger), "--operator", "acme", "--developer", "a@1")
    proc = run("seal", str(spec), "--key", "ephemeral:EdDSA", *common)
    assert proc.returncode == 2 and "unsafe-ephemeral:EdDSA" in proc.stderr and not ledger.exists()
    proc = run("seal", str(spec), "--key", "unsafe-ephemeral:ES256", *common)
    assert proc.returncode == 0, proc.stderr
    assert "warning: unsafe-ephemeral" in proc.stderr and "unpinned" in proc.stderr
    assert run("verify", str(ledger)).stdout.startswith("ok (signers not pinned)")
    with open_signer("unsafe-ephemeral:") as signer:  # the Python API keeps working, by either name
        assert isinstance(signer, UnsafeEphemeralSigner) and signer.alg == "EdDSA" and signer.uri == "unsafe-ephemeral:"
    assert UnsafeEphemeralSigner("ES256").describe()["key_store"] == "memory"


# --------------------------------------------------------------------------- several targets


def test_verify_takes_several_targets_and_exits_with_the_worst(sealed: Sealed, tmp_path: Path) -> None:
    both = run("verify", str(sealed.ledger), str(sealed.record), "--trust", str(sealed.public))
    assert both.returncode == 0
    assert f"== {sealed.ledger}\nok  " in both.stdout and f"== {sealed.record}\nok  capsule_id=" in both.stdout
    tampered = tmp_path / "tampered.json"
    data = json.loads(sealed.record.read_text())
    data["capsule"]["effect"]["type"] = "send_payment"
    tampered.write_text(json.dumps(data))
    missing = tmp_path / "missing.json"
    proc = run("verify", str(sealed.ledger), str(tampered), "--json")
    assert proc.returncode == 1
    out = json.loads(proc.stdout)
    assert out["ok"] is False and [t["exit"] for t in out["targets"]] == [0, 1]
    assert out["targets"][0]["report"]["counts"]["records"] == 3 and out["targets"][1]["report"]["ok"] is False
    proc = run("verify", str(missing), str(sealed.ledger), "--json")
    assert proc.returncode == 2 and f"no such file: {missing}" in proc.stderr
    out = json.loads(proc.stdout)
    assert [t["exit"] for t in out["targets"]] == [2, 0] and "error" in out["targets"][0]  # the others still verified


def test_the_python_api_reads_trust_files_and_never_raises_on_bad_anchors(sealed: Sealed, tmp_path: Path) -> None:
    from capseal.audit import verify_ledger
    from capseal.trust import read_trust_file

    bundle = tmp_path / "bundle.pem"  # several PEM blocks, one after the other
    bundle.write_text(_pem(UnsafeEphemeralSigner("ES256").public_key) + "\n" + sealed.public.read_text())
    keys = read_trust_file(bundle)
    assert [k.kid for k in keys][1] == sealed.kid and len(keys) == 2
    report = verify_ledger(sealed.ledger, trusted_keys=keys)
    assert report.ok and report.pinned and report.anchors == 2 and all(r.pinned for r in report.records)
    unpinned = verify_ledger(sealed.ledger)
    assert unpinned.ok and not unpinned.pinned and not any(r.pinned for r in unpinned.records)
    assert [(s.kid, s.records, s.pinned) for s in unpinned.signers] == [(sealed.kid, 3, False)]
    for bad in (["not a key"], [sealed.key.read_bytes()], [3]):
        report = verify_ledger(sealed.ledger, trusted_keys=bad)
        assert not report.ok and [f.code for f in report.findings] == ["trusted_keys_unusable"]
        assert "PRIVATE KEY" not in report.findings[0].detail
