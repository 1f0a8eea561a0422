"""The ``capseal`` CLI: exit codes 0 ok / 1 not ok / 2 could not run, never a traceback."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

CLI = str(Path(sys.executable).parent / "capseal")


def run(*args: str, ok: bool | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([CLI, *args], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


@pytest.fixture()
def sealed(tmp_path: Path) -> tuple[Path, Path, Path]:
    key = tmp_path / "k.pem"
    assert run("keys", "create", f"file:{key}", "--alg", "ed25519").returncode == 0
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps([
        {"action_id": "po-1", "action_type": "decide", "effect": {"status": "planned", "type": "write_order"}},
        {"action_id": "po-1/confirmed", "action_type": "decide",
         "effect": {"status": "confirmed", "type": "write_order", "response_digest": "b" * 64, "effect_attestation": "gate_executed"}},
    ]))
    ledger = tmp_path / "l.db"
    proc = run("seal", str(spec), "--key", f"file:{key}", "--ledger", str(ledger), "--operator", "acme", "--developer", "a@1", "--record",
               "--json")
    assert proc.returncode == 0, proc.stderr
    records = json.loads(proc.stdout)
    assert [r["capsule"]["action_id"] for r in records] == ["po-1", "po-1/confirmed"]
    assert all(r["hardware_evidence"] is None for r in records)
    out = tmp_path / "record.json"
    out.write_text(json.dumps(records[1]))
    return key, ledger, out


def test_verify_ledger_and_record(sealed: tuple[Path, Path, Path]) -> None:
    _, ledger, record = sealed
    proc = run("verify", str(ledger), "--json")
    assert proc.returncode == 0
    report = json.loads(proc.stdout)
    assert report["ok"] and report["counts"]["records"] == 3 and report["counts"]["signature:authored"] == 3
    proc = run("verify", str(record), "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["signature"] == "authored"
    human = run("verify", str(ledger))
    assert human.returncode == 0 and human.stdout.startswith("ok ")


def test_verify_reports_tampering_with_exit_1(sealed: tuple[Path, Path, Path]) -> None:
    _, ledger, record = sealed
    data = json.loads(record.read_text())
    data["capsule"]["effect"]["type"] = "send_payment"  # content changed after sealing
    record.write_text(json.dumps(data))
    proc = run("verify", str(record), "--json")
    assert proc.returncode == 1
    result = json.loads(proc.stdout)
    codes = {f["code"] for f in result["findings"]}
    assert not result["ok"] and "capsule_id_mismatch" in codes and result["signature"] == "invalid"
    with sqlite3.connect(ledger) as db:
        db.execute("DROP TRIGGER records_no_update")
        db.execute("UPDATE records SET nonce = 'ff' WHERE seq = 2")
    proc = run("verify", str(ledger))
    assert proc.returncode == 1 and "ledger_chain_broken" in proc.stdout


def test_could_not_run_is_exit_2(tmp_path: Path) -> None:
    assert run("verify", str(tmp_path / "absent.json")).returncode == 2
    (tmp_path / "bad.json").write_text("{")
    proc = run("verify", str(tmp_path / "bad.json"))
    assert proc.returncode == 2 and proc.stderr.startswith("capseal: error:")
    proc = run("seal", str(tmp_path / "bad.json"), "--key", "nope:x", "--ledger", str(tmp_path / "l.db"), "--operator", "o", "--developer", "d")
    assert proc.returncode == 2


def test_ledger_show_export_import(sealed: tuple[Path, Path, Path], tmp_path: Path) -> None:
    _, ledger, _ = sealed
    shown = json.loads(run("ledger", "show", str(ledger), "--json").stdout)
    assert [row["header"]["seq"] for row in shown] == [1, 2, 3]
    assert all(row["hardware_evidence"] is None for row in shown)
    export = tmp_path / "e.jsonl"
    assert run("ledger", "export", str(ledger), "-o", str(export)).returncode == 0
    assert run("ledger", "import", str(export), str(tmp_path / "copy.db")).returncode == 0
    export2 = tmp_path / "e2.jsonl"
    assert run("ledger", "export", str(tmp_path / "copy.db"), "-o", str(export2)).returncode == 0
    assert export.read_bytes() == export2.read_bytes()
    assert run("ledger", "import", str(export), str(tmp_path / "copy.db")).returncode == 2  # never overwrites


def test_doctor_for_a_file_key(sealed: tuple[Path, Path, Path]) -> None:
    key, _, _ = sealed
    proc = run("doctor", f"file:{key}", "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)[0]["ok"] is True


def test_verify_with_trusted_keys_refuses_what_no_trusted_key_signed(sealed: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """With ``--trust``, a capsule with no signature, or one by a key nobody can
    look up, is an error: a forger strips the signature after editing."""
    key, _, record = sealed
    public = tmp_path / "pub.pem"
    from cryptography.hazmat.primitives import serialization

    private = serialization.load_pem_private_key(key.read_bytes(), password=None)
    public.write_bytes(private.public_key().public_bytes(serialization.Encoding.PEM,
                                                         serialization.PublicFormat.SubjectPublicKeyInfo))
    assert run("verify", str(record), "--trust", str(public)).returncode == 0
    import capseal

    data = json.loads(record.read_text())
    capsule = data["capsule"]
    capsule["effect"]["response_digest"] = "c" * 64  # edited, id recomputed, signature stripped
    for member in ("signature", "key_id", "capsule_id"):
        capsule.pop(member)
    capsule["capsule_id"] = capseal.capsule_id(capsule)
    data["envelopes"] = []
    forged = tmp_path / "forged.json"
    forged.write_text(json.dumps(data))
    assert run("verify", str(forged)).returncode == 0  # without trusted keys: a valid unsigned capsule
    proc = run("verify", str(forged), "--trust", str(public), "--json")
    assert proc.returncode == 1, proc.stdout
    result = json.loads(proc.stdout)
    assert result["signature"] == "unclaimed" and "signer_not_trusted" in {f["code"] for f in result["findings"]}


def test_verify_ledger_reads_the_header_type_against_the_capsule(sealed: tuple[Path, Path, Path]) -> None:
    """EL -00 §4.1: a record's epistemic type is fixed at commit; a header
    upgraded behind SQLite's back (row hashes recomputed) is found."""
    from capseal.ledger import row_hash as rehash

    _, ledger, _ = sealed
    with sqlite3.connect(ledger) as db:
        db.execute("DROP TRIGGER records_no_update")
        rows = db.execute("SELECT seq, record_id, record_type, epistemic_type, links, nonce, body FROM records "
                          "ORDER BY seq").fetchall()
        prev = db.execute("SELECT prev_hash FROM records WHERE seq = 1").fetchone()[0]
        for seq, rid, rtype, etype, links, nonce, body in rows:
            etype = "observed_event"  # every row claims to be an observed event
            header = {"seq": seq, "record_id": rid, "record_type": rtype, "epistemic_type": etype,
                      "links": json.loads(links), "nonce": nonce}
            row_hash = rehash(prev, header, body)
            db.execute("UPDATE records SET epistemic_type = ?, prev_hash = ?, row_hash = ? WHERE seq = ?",
                       (etype, prev, row_hash, seq))
            prev = row_hash
    proc = run("verify", str(ledger), "--json")
    assert proc.returncode == 1, proc.stdout
    report = json.loads(proc.stdout)
    assert not any(f["code"] == "ledger_chain_broken" for f in report["findings"])  # the chain was redone
    bad = {r["seq"] for r in report["records"] if any(f["code"] == "header_mismatch" for f in r["findings"])}
    assert bad == {1, 2}  # the boundary and the planned capsule are producer claims; the confirmed one is observed


def test_verify_an_empty_array_or_a_deep_file_is_exit_2(tmp_path: Path) -> None:
    empty = tmp_path / "empty.json"
    empty.write_text("[]")
    proc = run("verify", str(empty))
    assert proc.returncode == 2 and "empty array" in proc.stderr
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100000 + "]" * 100000)
    proc = run("verify", str(deep))
    assert proc.returncode == 2 and "nests too deeply" in proc.stderr


@pytest.mark.parametrize("bad", [
    {"action_id": "b-2", "action_type": "decide", "x-amount": 12},  # sealable: the duplicate below is the fault
    {"action_id": "b-2", "action_type": "decide", "disposition": {"decision": "accept", "approver": "robot", "human_disposed": False}},
    {"action_id": "b-1", "action_type": "fyi"},
], ids=["duplicate-in-batch", "bad-approver", "duplicate-of-first"])
def test_seal_refuses_a_batch_with_a_bad_spec_and_writes_none_of_it(tmp_path: Path, bad: dict[str, object]) -> None:
    """A batch with a bad spec at [2] wrote [0] and [1] before failing, and the
    error did not say they were written nor which spec was bad. Every spec is
    now checked before any is sealed, and the error names the bad one."""
    key = tmp_path / "k.pem"
    assert run("keys", "create", f"file:{key}", "--alg", "ed25519").returncode == 0
    specs = [{"action_id": "b-1", "action_type": "fyi"}, {"action_id": "b-2", "action_type": "fyi"}, bad]
    if bad["action_id"] == "b-2" and "x-amount" in bad:
        specs = [specs[0], bad, {"action_id": "b-2", "action_type": "fyi"}]
    spec = tmp_path / "batch.json"
    spec.write_text(json.dumps(specs))
    ledger = tmp_path / "l.db"
    proc = run("seal", str(spec), "--key", f"file:{key}", "--ledger", str(ledger), "--operator", "acme", "--developer", "a@1")
    assert proc.returncode == 2 and proc.stderr.startswith("capseal: error:")
    assert f"{spec}[2]" in proc.stderr and "nothing was sealed" in proc.stderr, proc.stderr
    with sqlite3.connect(ledger) as db:
        assert db.execute("SELECT count(*) FROM records").fetchone()[0] == 0


def test_a_closed_pipe_is_not_an_internal_error(sealed: tuple[Path, Path, Path]) -> None:
    """``capseal ledger export … | head -1``: the reader goes away early. It
    ended in "capseal: internal error: BrokenPipeError"; a closed pipe is the
    reader's choice, not a failure to report."""
    from capseal import Producer
    from capseal.keys import UnsafeEphemeralSigner

    _, ledger, _ = sealed
    with Producer("acme", "a@1", UnsafeEphemeralSigner(), ledger) as producer:  # far more than a pipe holds (64 KiB)
        for i in range(200):
            producer.submit({"action_id": f"bulk-{i}", "action_type": "fyi"})
    proc = subprocess.run(f"'{CLI}' ledger export '{ledger}' | head -c 1", shell=True, capture_output=True,
                          text=True, timeout=120)
    assert proc.stdout == "{" and "internal error" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_a_finding_without_a_check_number_prints_none(sealed: tuple[Path, Path, Path]) -> None:
    """A finding that belongs to no -05 §6 check printed as "check None …"."""
    _, _, record = sealed
    data = json.loads(record.read_text())
    cose = bytearray.fromhex(data["capsule"]["signature"])
    cose[-64] ^= 1  # the signature's R no longer verifies (S's last byte, set to 00, was 00 already ~1 time in 16)
    data["capsule"]["signature"] = cose.hex()
    record.write_text(json.dumps(data))
    proc = run("verify", str(record), "--verbose")
    assert proc.returncode == 1 and "check None" not in proc.stdout, proc.stdout
