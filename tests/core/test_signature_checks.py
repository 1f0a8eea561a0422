"""What the verifiers check on each record: signatures (``audit.check_signatures``,
the plain COSE_Sign1 verifier, ``capseal verify``) and the stored body's form.
Each case was found by a review and fails on the code before; the reference
verifier is asked beside capseal's where it has a verdict."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from agent_action_capsule.producer_envelope import verify_record_signature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from scitt_cose.cose_sign1 import verify_sign1

from capseal import Producer, SealedRecord
from capseal.audit import KeyDirectory, check_signatures, verify_ledger
from capseal.cbor import enc_bytes, enc_head, enc_int
from capseal.cose import sig_structure
from capseal.envelope import sign_envelope, verify_cose_sign1
from capseal.keys import UnsafeEphemeralSigner
from capseal.ledger import Ledger, LedgerEntry
from capseal.record import storage_json

CLI = str(Path(sys.executable).parent / "capseal")


def _sealed(path: Path) -> tuple[SealedRecord, UnsafeEphemeralSigner]:
    signer = UnsafeEphemeralSigner()
    with Producer(operator="acme", developer="agent@1", signer=signer, ledger=path) as producer:
        record = producer.seal({"action_id": "po-1", "action_type": "decide", "effect": {
            "status": "confirmed", "type": "write_order", "response_digest": "b" * 64, "effect_attestation": "gate_executed"}})
    return record, signer


def _pem(key: Any) -> bytes:
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([CLI, *args], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def test_a_key_id_without_a_signature_fails_the_cli_too(tmp_path: Path) -> None:
    """``capseal verify FILE`` said ok, signature=unclaimed: it only looked
    for "signature" before checking signatures at all."""
    record, _ = _sealed(tmp_path / "l.db")
    capsule = {k: v for k, v in record.capsule.items() if k != "signature"}
    assert verify_record_signature(capsule)[0] == "invalid"
    assert check_signatures(capsule, [], KeyDirectory())[0] == "invalid"
    path = tmp_path / "c.json"
    path.write_text(json.dumps(capsule))
    proc = _cli("verify", str(path))
    assert proc.returncode == 1 and "signature=invalid" in proc.stdout, proc.stdout


def test_hex_fields_are_read_as_the_reference_reads_them(tmp_path: Path) -> None:
    """Whitespace inside ``signature`` was accepted (bytes.fromhex skips it),
    and an upper-case ``key_id`` was refused: the reference says the opposite."""
    record, _ = _sealed(tmp_path / "l.db")
    sig = record.capsule["signature"]
    spaced = dict(record.capsule, signature=sig[:20] + " \n" + sig[20:])
    upper = dict(record.capsule, key_id=record.capsule["key_id"].upper())
    assert verify_record_signature(spaced)[0] == check_signatures(spaced, [], KeyDirectory())[0] == "invalid"
    assert verify_record_signature(upper)[0] == "authored"
    verdict, kid, findings = check_signatures(upper, [], KeyDirectory([record.capsule["key_id"]]))  # pinned by its kid
    assert (verdict, kid, findings) == ("authored", record.capsule["key_id"].lower(), [])


def test_the_verdict_does_not_depend_on_the_order_of_envelopes(tmp_path: Path) -> None:
    """Each envelope verifies on its own (-05): a valid profile envelope and
    one whose key is unknown gave authored in one order, unverifiable in the other."""
    record, signer = _sealed(tmp_path / "l.db")
    bare = {k: v for k, v in record.capsule.items() if k not in ("signature", "key_id")}
    cid = bytes.fromhex(bare["capsule_id"])
    profile = sign_envelope(signer, cid).to_json()
    plain = sign_envelope(UnsafeEphemeralSigner("ES256"), cid).to_json()
    first = check_signatures(bare, [profile, plain], KeyDirectory())
    second = check_signatures(bare, [plain, profile], KeyDirectory())
    assert first[0] == second[0] == "authored"
    assert first[1] == second[1] == signer.kid


def test_a_trusted_signature_beside_an_untrusted_one_is_trusted(tmp_path: Path) -> None:
    """Only the first key that signed was weighed against the trusted keys:
    adding a valid signature by the trusted key to a capsule signed inline by
    another key gave signer_not_trusted, an error."""
    record, _ = _sealed(tmp_path / "l.db")
    trusted = UnsafeEphemeralSigner("ES256")
    plain = sign_envelope(trusted, bytes.fromhex(record.capsule["capsule_id"])).to_json()
    verdict, kid, findings = check_signatures(record.capsule, [plain], KeyDirectory([_pem(trusted.public_key)]))
    assert (verdict, kid, findings) == ("authored", trusted.kid, [])
    verdict, _, findings = check_signatures(record.capsule, [], KeyDirectory([_pem(trusted.public_key)]))
    assert verdict == "authored" and [f.code for f in findings] == ["signer_not_trusted"]


def test_a_critical_header_capseal_does_not_process_is_refused() -> None:
    """crit (RFC 9052 §3.1) naming header 99 verified as ok; the reference's
    COSE layer refuses it."""
    key = ec.generate_private_key(ec.SECP256R1())
    payload = os.urandom(32)

    def sign1(protected: bytes) -> bytes:
        r, s = decode_dss_signature(key.sign(sig_structure(protected, payload), ec.ECDSA(hashes.SHA256())))
        return (b"\xd2\x84" + enc_bytes(protected) + b"\xa0" + enc_bytes(payload)
                + enc_bytes(r.to_bytes(32, "big") + s.to_bytes(32, "big")))

    critical = sign1(enc_head(5, 3) + enc_int(1) + enc_int(-7) + enc_int(2) + enc_head(4, 1) + enc_int(99)
                     + enc_int(99) + enc_int(1))
    result = verify_cose_sign1(critical, key.public_key(), payload=payload)
    assert not result.ok and [f.code for f in result.findings] == ["envelope_crit_unknown"]
    with pytest.raises(Exception, match="crit"):
        verify_sign1(critical, public_key_pem=_pem(key.public_key()))
    kid_only = sign1(enc_head(5, 2) + enc_int(1) + enc_int(-7) + enc_int(2) + enc_head(4, 1) + enc_int(1))
    assert verify_cose_sign1(kid_only, key.public_key(), payload=payload).ok  # crit naming alg: processed


def test_a_custody_key_of_an_unknown_algorithm_fails_its_record_only(tmp_path: Path) -> None:
    """cryptography's UnsupportedAlgorithm is no ValueError: one record whose
    custody key has an unknown algorithm OID made verify_ledger report the
    whole file unreadable, with no record reported."""
    path = tmp_path / "l.db"
    _sealed(path)
    oid = bytes.fromhex("06032a0304")  # 1.2.3.4
    alg = b"\x30" + bytes([len(oid)]) + oid
    spki = b"\x30" + bytes([len(alg) + 4]) + alg + bytes.fromhex("03020001")
    capsule = {"capsule_id": "a" * 64, "disposition": {"verdict_class": "epoch_boundary"}, "model_attestation": {
        "compute_attestation": {"x-capseal-key-custody": {"kid": "b" * 64, "public_key": spki.hex()}}}}
    with Ledger(path) as ledger:
        ledger.append(LedgerEntry(record_id="a" * 64, record_type="capsule", epistemic_type="producer_claim",
                                  body=storage_json({"record_version": "capseal-record/1", "capsule": capsule,
                                                        "envelopes": []})))
    report = verify_ledger(path)
    assert report.findings == [] and len(report.records) == 3
    assert [r.ok for r in report.records] == [True, True, False]
    assert _cli("verify", str(path)).returncode == 1


def test_a_bad_trusted_key_is_named_not_blamed_on_the_ledger(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    _sealed(path)
    bad = tmp_path / "bad.pem"
    bad.write_text("not a key")
    proc = _cli("verify", str(path), "--trust", str(bad))
    assert proc.returncode == 2 and f"--trust {bad} is not a PEM public key" in proc.stderr
    assert "ledger_unreadable" not in proc.stdout + proc.stderr
    proc = _cli("verify", str(path), "--trust", str(tmp_path / "missing.pem"))
    assert proc.returncode == 2 and "cannot read" in proc.stderr and "missing.pem" in proc.stderr and "internal error" not in proc.stderr


def _rewrite_body(path: Path, record_id: str, body: bytes) -> None:
    """What someone holding the file can do without any key: replace a body
    and recompute the (unkeyed) row hashes, and the heads the ledger keeps
    of them (in ``meta``, and its side file)."""
    import sqlite3

    from capseal.ledger import GENESIS, row_hash

    db = sqlite3.connect(path, isolation_level=None)
    db.execute("DROP TRIGGER records_no_update")
    db.execute("UPDATE records SET body=? WHERE record_id=?", (body, record_id))
    prev = GENESIS
    rows = db.execute("SELECT seq, record_id, record_type, epistemic_type, links, nonce, body FROM records ORDER BY seq")
    for seq, rid, rtype, etype, links, nonce, stored in rows.fetchall():
        header = {"seq": seq, "record_id": rid, "record_type": rtype, "epistemic_type": etype,
                  "links": json.loads(links), "nonce": nonce}
        hashed = row_hash(prev, header, bytes(stored))
        db.execute("UPDATE records SET prev_hash=?, row_hash=? WHERE seq=?", (prev, hashed, seq))
        prev = hashed
    db.execute("UPDATE meta SET value=? WHERE key='head'", (f"{seq} {prev}",))
    db.close()
    Path(f"{path}-head").unlink()


@pytest.mark.parametrize("shape", ["duplicate", "nan", "spaced"])
def test_a_body_that_reads_two_ways_fails_its_record(tmp_path: Path, shape: str) -> None:
    """verify_ledger parsed bodies with plain json.loads: a body holding two
    "capsule" members (Python keeps the last, other readers the first) or a
    NaN verified as ok."""
    path = tmp_path / "l.db"
    record, _ = _sealed(path)
    with Ledger(path, readonly=True) as ledger:
        entry = ledger.entry(record.capsule_id)
    assert entry is not None
    stored = json.loads(entry.body)
    canon = storage_json(stored)
    evil = dict(stored["capsule"], effect=dict(stored["capsule"]["effect"], type="send_payment"))
    body = {
        "duplicate": b'{"capsule":' + storage_json(evil) + b"," + canon[1:],
        "nan": canon[:-1] + b',"x":NaN}',
        "spaced": canon.replace(b'","', b'", "', 1),
    }[shape]
    _rewrite_body(path, record.capsule_id, body)
    report = verify_ledger(path)
    assert report.findings == []  # the chain is intact: only this record fails
    bad = [r for r in report.records if not r.ok]
    assert [r.record_id for r in bad] == [record.capsule_id]
    assert "record_body_not_canonical" in {f.code for f in bad[0].findings}


def test_a_ledger_in_a_directory_the_verifier_cannot_write_verifies(tmp_path: Path) -> None:
    """An auditor verifying another user's ledger got "not a capseal ledger
    (attempt to write a readonly database)": reading a WAL file needs a -shm
    beside it, which SQLite could not create there. Run as root (who may
    write anywhere), the check runs in a forked process that became user
    nobody; everything it needs was imported before the fork."""
    import shutil
    import tempfile

    source = tmp_path / "l.db"
    _sealed(source)
    assert verify_ledger(source).ok  # imports what verifying needs, while they can still be read
    outer = Path(tempfile.mkdtemp(prefix="capseal-ro-", dir="/tmp"))  # traversable by another user
    try:
        os.chmod(outer, 0o755)
        shut = outer / "ro"
        shut.mkdir()
        shutil.copy(source, shut / "l.db")
        os.chmod(shut / "l.db", 0o444)
        os.chmod(shut, 0o555)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover (the child reports through the pipe)
            code = 1
            try:
                if os.geteuid() == 0:
                    os.setgroups([])
                    os.setgid(65534)
                    os.setuid(65534)
                report = verify_ledger(shut / "l.db")
                os.write(write, json.dumps([report.ok, len(report.records), [str(f) for f in report.findings]]).encode())
                code = 0
            finally:
                os._exit(code)
        os.close(write)
        with os.fdopen(read, "rb") as fh:
            answer = fh.read()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert json.loads(answer) == [True, 2, []]
        assert sorted(p.name for p in shut.iterdir()) == ["l.db"]  # nothing created beside it
    finally:
        for p in (outer / "ro", outer):
            if p.exists():
                os.chmod(p, 0o755)
        shutil.rmtree(outer)


def _edwards_multiple_is_neutral(y: int, sign: int, n: int) -> bool:
    """[n]P == the neutral point for the Ed25519 point of y-coordinate ``y``
    and x-sign ``sign`` (RFC 8032 §5.1.3 decoding, extended coordinates),
    computed here from the curve equation, not taken from any library."""
    p = 2**255 - 19
    d = -121665 * pow(121666, p - 2, p) % p
    y %= p
    u, v = (y * y - 1) % p, (d * y * y + 1) % p
    x = u * pow(v, 3, p) * pow(u * pow(v, 7, p), (p - 5) // 8, p) % p
    if (v * x * x - u) % p:
        x = x * pow(2, (p - 1) // 4, p) % p
    assert (v * x * x - u) % p == 0, "not on the curve"
    if x & 1 != sign:
        x = (p - x) % p

    def add(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
        x1, y1, z1, t1 = a
        x2, y2, z2, t2 = b
        aa, bb = (y1 - x1) * (y2 - x2) % p, (y1 + x1) * (y2 + x2) % p
        cc, dd = t1 * 2 * d * t2 % p, z1 * 2 * z2 % p
        e, f, g, h = bb - aa, dd - cc, dd + cc, bb + aa
        return e * f % p, g * h % p, f * g % p, e * h % p

    point, acc = (x, y, 1, x * y % p), (0, 1, 1, 0)
    for _ in range(n):
        acc = add(acc, point)
    return acc[0] % p == 0 and (acc[1] - acc[2]) % p == 0


def test_every_listed_small_order_key_is_one_and_an_ordinary_key_is_not() -> None:
    from cryptography.hazmat.primitives.asymmetric import ed25519

    from capseal.cose import SMALL_ORDER_Y, small_order_key

    assert len(SMALL_ORDER_Y) == 7  # y = 0, 1, p-1, the two of order 8, and p, p+1 (non-canonical 0 and 1)
    for y in SMALL_ORDER_Y:
        assert _edwards_multiple_is_neutral(y, 0, 8)
        assert small_order_key(y.to_bytes(32, "little")) and small_order_key((y | 1 << 255).to_bytes(32, "little"))
    for _ in range(50):
        raw = ed25519.Ed25519PrivateKey.generate().public_key().public_bytes_raw()
        assert not small_order_key(raw)
        assert not _edwards_multiple_is_neutral(int.from_bytes(raw, "little") & ((1 << 255) - 1), raw[31] >> 7, 8)


def test_a_capsule_signed_under_the_neutral_key_is_not_authored(tmp_path: Path) -> None:
    """OpenSSL (and so the reference verifier) accepts R = neutral point,
    S = 0 under the neutral point's key for any message: a capsule anyone can
    "sign". capseal reports envelope_kid_weak and the signature invalid;
    the reference calls it authored."""
    from capseal.cose import assemble_sign1
    from capseal.envelope import profile_protected

    record, _ = _sealed(tmp_path / "l.db")
    neutral = bytes([1]) + bytes(31)
    protected = profile_protected(neutral)
    cose = assemble_sign1(protected, bytes.fromhex(record.capsule_id), neutral + bytes(32))
    forged = dict(record.capsule, signature=cose.hex(), key_id=neutral.hex())
    assert verify_record_signature(forged)[0] == "authored"  # the reference is fooled
    verdict, _, findings = check_signatures(forged, [], KeyDirectory())
    assert verdict == "invalid" and "envelope_kid_weak" in {f.code for f in findings}, findings
