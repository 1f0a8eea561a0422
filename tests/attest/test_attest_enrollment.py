"""Hardware is raised only by the relying party's enrollment, never by a slot's
unsigned device strings: an AK provisioned in a swtpm carries
``software_device: true`` into its pin. Real swtpm, real ``capseal``."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from capseal import Ledger, Producer
from capseal.attest import PinnedAK, TPMQuoter, TrustPolicy, attach, evidence_status
from capseal.audit import verify_ledger
from capseal.errors import InputError
from capseal.keys import UnsafeEphemeralSigner

pytestmark = pytest.mark.swtpm

CLI = str(Path(sys.executable).parent / "capseal")
HARDWARE_STRINGS = {"manufacturer": "IFX", "vendor": "SLB9672", "firmware": "16.13", "software": False}


def run(*args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([CLI, *args], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


class Quoted:
    """A swtpm provisioned by ``capseal tpm provision``, and a ledger whose
    records carry its quotes; the first record's slot then re-written to
    claim a hardware TPM (what anyone who can append a slot can do)."""

    def __init__(self, tmp: Path, tcti: str) -> None:
        proc = run("tpm", "provision", "--tcti", tcti, "--json")
        assert proc.returncode == 0, proc.stderr
        self.result: dict[str, Any] = json.loads(proc.stdout)
        assert self.result["software_device"] is True  # provisioning read it from the TPM itself
        self.provisioned = tmp / "tpm.json"
        self.provisioned.write_text(proc.stdout)
        self.ak_pem = tmp / "ak.pem"
        self.ak_pem.write_text(self.result["attestation_key"]["public_key_pem"])
        self.path = tmp / "l.db"
        with Producer("acme.example", "agent@1", UnsafeEphemeralSigner(), self.path) as producer:
            worker = attach(producer, TPMQuoter(self.result["attestation_key"]["uri"]), max_records=8, max_delay=0.01)
            self.ids = [producer.seal({"action_id": f"a-{i}", "action_type": "decide",
                                       "effect": {"status": "planned", "type": "write_order"}}).capsule_id for i in range(2)]
            producer.flush()
            assert worker.flush(30)
            worker.close()
        with Ledger(self.path) as ledger:
            ev = copy.deepcopy(ledger.current_evidence(self.ids[0]))
            assert ev is not None and ev["device"]["software"] is True
            ev["device"] = dict(HARDWARE_STRINGS)
            ledger.add_evidence(self.ids[0], ev)
            self.edited = ledger.get(self.ids[0])
        assert self.edited is not None and self.edited.hardware_evidence is not None
        assert self.edited.hardware_evidence["device"] == HARDWARE_STRINGS


@pytest.fixture()
def quoted(tmp_path: Path, fresh_swtpm: Any) -> Quoted:
    return Quoted(tmp_path, fresh_swtpm.tcti)


def _counts(proc: subprocess.CompletedProcess[str]) -> dict[str, int]:
    return dict(json.loads(proc.stdout)["counts"])


def test_edited_device_strings_never_make_a_swtpm_verified(quoted: Quoted, tmp_path: Path) -> None:
    path = str(quoted.path)
    # enrolled as hardware from a bare PEM: gave `verified` for the edited slot; a PEM
    # says nothing about the TPM, so hardware enrollment takes the provisioning result
    proc = run("verify", path, "--evidence", "--ak-hardware", str(quoted.ak_pem), "--json")
    assert proc.returncode == 2 and "provisioning result" in proc.stderr and proc.stdout == ""
    # the provisioning result says software: it cannot be enrolled as hardware
    proc = run("verify", path, "--evidence", "--ak-hardware", str(quoted.provisioned))
    assert proc.returncode == 2 and "software_device: true" in proc.stderr
    # pinned from it, as software: the edited strings cannot raise the claim
    proc = run("verify", path, "--evidence", "--ak", str(quoted.provisioned), "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    counts = _counts(proc)
    assert counts["evidence:verified-software-tpm"] == counts["records"] and "evidence:verified" not in counts
    edited = next(r for r in json.loads(proc.stdout)["records"] if r["record_id"] == quoted.ids[0])
    assert edited["evidence"] == "verified-software-tpm"
    assert any(f["code"] == "evidence_software_tpm" and "pinned as a software TPM's" in f["detail"] for f in edited["findings"])
    # the Python API: the provisioning result itself is a trust policy
    report = verify_ledger(quoted.path, evidence=True, evidence_trust=quoted.result)
    assert report.ok and {r.evidence for r in report.records} == {"verified-software-tpm"}
    assert evidence_status(quoted.edited, PinnedAK.from_provisioning(quoted.result))[0] == "verified-software-tpm"
    with pytest.raises(InputError, match="software_device: true"):
        PinnedAK.from_provisioning(quoted.result, hardware=True)


def test_only_the_operators_enrollment_raises_the_claim(quoted: Quoted, tmp_path: Path) -> None:
    """An enrollment that says hardware (written by the operator, as after a
    credential activation) is what gives ``verified``; the slot's own strings,
    still saying swtpm on the other records, keep lowering it there."""
    enrollment = tmp_path / "enrolled.json"
    enrollment.write_text(json.dumps({"attestation_key": quoted.result["attestation_key"], "software_device": False}))
    proc = run("verify", str(quoted.path), "--evidence", "--ak-hardware", str(enrollment), "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    by_id = {r["record_id"]: r for r in json.loads(proc.stdout)["records"]}
    assert by_id[quoted.ids[0]]["evidence"] == "verified"
    assert "evidence_hardware_by_enrollment" in {f["code"] for f in by_id[quoted.ids[0]]["findings"]}
    assert by_id[quoted.ids[1]]["evidence"] == "verified-software-tpm"
    unknown = {"attestation_key": quoted.result["attestation_key"]}  # provisioning could not tell
    with pytest.raises(InputError, match="could not tell"):
        PinnedAK.from_provisioning(unknown, hardware=True)
    assert PinnedAK.from_provisioning(unknown).software is None
    assert TrustPolicy.coerce(quoted.result).aks[0].software is True  # type: ignore[union-attr]
