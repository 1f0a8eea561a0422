# ruff: noqa: F811  (pytest fixtures imported from test_attest_support are redefined as parameters)
"""``capseal verify LEDGER --evidence --ak ak.pem`` on a ledger with real swtpm quotes."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from capseal import Producer
from capseal.attest import attach
from capseal.keys import UnsafeEphemeralSigner

from .test_attest_support import AttestTPM, spec, tpm_a  # noqa: F401

pytestmark = pytest.mark.swtpm

CLI = str(Path(sys.executable).parent / "capseal")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([CLI, *args], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


@pytest.fixture()
def ledger(tmp_path: Path, tpm_a: AttestTPM) -> tuple[Path, Path, list[str]]:
    """A ledger of 11 records: the boundary and 9 with evidence, 1 left null."""
    path = tmp_path / "l.db"
    with Producer("acme.example", "agent@1", UnsafeEphemeralSigner(), path) as producer:
        worker = attach(producer, tpm_a.quoter(), max_records=4, max_delay=0.01)
        ids = [producer.seal(spec(i)).capsule_id for i in range(9)]
        producer.flush()
        assert worker.flush(30)
        worker.close()
        ids.append(producer.seal(spec(99)).capsule_id)  # sealed after the worker closed: null slot
        ak = tmp_path / "ak.pem"
        ak.write_text(tpm_a.ak().public_pem)
    return path, ak, ids


def test_verify_evidence_with_the_pinned_ak(ledger: tuple[Path, Path, list[str]]) -> None:
    path, ak, ids = ledger
    proc = run("verify", str(path), "--evidence", "--ak", str(ak), "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    counts = report["counts"]
    assert counts["evidence:verified-software-tpm"] == 10 and counts["evidence:no-evidence"] == 1
    assert "evidence:verified" not in counts  # swtpm is never reported as hardware
    by_id = {r["record_id"]: r for r in report["records"]}
    assert by_id[ids[-1]]["evidence"] == "no-evidence" and by_id[ids[-1]]["ok"]
    human = run("verify", str(path), "--evidence", "--ak", str(ak))
    assert human.returncode == 0 and "verified-software-tpm=10" in human.stdout and "no-evidence=1" in human.stdout


def test_verify_evidence_under_another_ak_or_none(ledger: tuple[Path, Path, list[str]], tmp_path: Path) -> None:
    path, _, _ = ledger
    other = tmp_path / "other.pem"
    other.write_bytes(ec.generate_private_key(ec.SECP256R1()).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    proc = run("verify", str(path), "--evidence", "--ak", str(other), "--json")
    assert proc.returncode == 1
    counts = json.loads(proc.stdout)["counts"]
    assert counts["evidence:evidence_ak_untrusted"] == 10
    # no --ak: self-consistent quotes, but nothing pinned: a warning, never "verified"
    proc = run("verify", str(path), "--evidence", "--json")
    counts = json.loads(proc.stdout)["counts"]
    assert proc.returncode == 0 and counts["evidence:evidence_ak_not_pinned"] == 10
    assert not any(k.startswith("evidence:verified") for k in counts)


def test_verify_evidence_reports_a_tampered_slot(ledger: tuple[Path, Path, list[str]]) -> None:
    path, ak, ids = ledger
    from capseal import Ledger

    with Ledger(path) as led:  # append a slot whose PCR values were changed
        ev = copy.deepcopy(led.current_evidence(ids[0]))
        assert ev is not None
        ev["pcr_values"]["sha256"]["0"] = "ff" * 32
        led.add_evidence(ids[0], ev)
    proc = run("verify", str(path), "--evidence", "--ak", str(ak), "--json")
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    bad = [r for r in report["records"] if r["record_id"] == ids[0]][0]
    assert bad["evidence"] == "evidence_pcr_mismatch" and not bad["ok"]
    assert report["counts"]["evidence:verified-software-tpm"] == 9


def test_a_swtpm_ak_enrolled_as_hardware_is_still_reported_as_software(ledger: tuple[Path, Path, list[str]]) -> None:
    """An AK enrolled as hardware is the relying party's claim; the quote's own device
    strings can only lower it, so a swtpm's quotes never read as hardware. The CLI
    takes a hardware enrollment only from a provisioning result (a PEM says nothing
    about the TPM), so the enrollment is made here through the API."""
    from capseal.attest import PinnedAK, TrustPolicy
    from capseal.audit import verify_ledger

    path, ak, _ = ledger
    proc = run("verify", str(path), "--evidence", "--ak-hardware", str(ak), "--json")
    assert proc.returncode == 2 and "provisioning result" in proc.stderr, proc.stdout + proc.stderr
    policy = TrustPolicy((PinnedAK.from_pem(ak.read_bytes(), software=False),))
    counts = verify_ledger(path, evidence=True, evidence_trust=policy).counts()
    assert counts["evidence:verified-software-tpm"] == 10 and "evidence:verified" not in counts
    assert run("verify", str(path), "--evidence", "--ek-root", str(path.parent / "absent.pem")).returncode == 2


def test_verify_evidence_on_record_json_files(ledger: tuple[Path, Path, list[str]], tmp_path: Path) -> None:
    """``--evidence`` on a JSON file checks each record's slot as the ledger path
    does: a damaged or replayed slot fails (exit 1), a good one reads as swtpm."""
    path, ak, ids = ledger
    from capseal import Ledger

    with Ledger(path) as led:
        good, other = led.get(ids[0]), led.get(ids[1])
        assert good is not None and other is not None and good.hardware_evidence is not None
        records = {"good": copy.deepcopy(good.to_json())}
        damaged = copy.deepcopy(good.to_json())
        damaged["hardware_evidence"]["pcr_values"]["sha256"]["0"] = "ff" * 32
        records["damaged"] = damaged
        replayed = copy.deepcopy(good.to_json())
        replayed["hardware_evidence"] = copy.deepcopy(other.to_json()["hardware_evidence"])  # another record's slot
        records["replayed"] = replayed
    files = {}
    for name, record in records.items():
        files[name] = tmp_path / f"{name}.json"
        files[name].write_text(json.dumps(record))
    proc = run("verify", str(files["good"]), "--evidence", "--ak", str(ak), "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["evidence"] == "verified-software-tpm"
    for name, status in (("damaged", "evidence_pcr_mismatch"), ("replayed", "evidence_inclusion_invalid")):
        proc = run("verify", str(files[name]), "--evidence", "--ak", str(ak), "--json")
        assert proc.returncode == 1, (name, proc.stdout)
        assert json.loads(proc.stdout)["evidence"] == status
    human = run("verify", str(files["damaged"]), "--evidence", "--ak", str(ak))
    assert human.returncode == 1 and "evidence=evidence_pcr_mismatch" in human.stdout


def test_verify_evidence_prints_a_summary_unless_verbose(ledger: tuple[Path, Path, list[str]]) -> None:
    """One line per record with evidence was printed for every record; now the
    records that are ok are tallied, and ``-v`` lists each of them."""
    path, ak, ids = ledger
    summary = run("verify", str(path), "--evidence", "--ak", str(ak))
    assert summary.returncode == 0
    assert "  seq " not in summary.stdout, summary.stdout  # no record line: every record is ok
    assert "evidence: no-evidence=1, verified-software-tpm=10" in summary.stdout
    assert "on ok records: signer_not_pinned ×11 (-v lists them)" in summary.stdout
    assert len(summary.stdout.splitlines()) < 8
    verbose = run("verify", str(path), "--evidence", "--ak", str(ak), "-v")
    assert verbose.returncode == 0
    lines = [line for line in verbose.stdout.splitlines() if line.startswith("  seq ")]
    assert len(lines) == 11 and sum("evidence=verified-software-tpm" in line for line in lines) == 10
    assert "evidence_software_tpm" in verbose.stdout and "signer_not_pinned" in verbose.stdout
    from capseal import Ledger

    with Ledger(path) as led:  # a failing record is always listed, with its findings
        ev = copy.deepcopy(led.current_evidence(ids[0]))
        assert ev is not None
        ev["pcr_values"]["sha256"]["0"] = "ff" * 32
        led.add_evidence(ids[0], ev)
    failing = run("verify", str(path), "--evidence", "--ak", str(ak))
    assert failing.returncode == 1
    assert [line for line in failing.stdout.splitlines() if line.startswith("  seq ")] == [
        next(line for line in failing.stdout.splitlines() if ids[0][:16] in line)]
    assert "evidence_pcr_mismatch" in failing.stdout
