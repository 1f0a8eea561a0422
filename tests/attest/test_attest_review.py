# ruff: noqa: F811  (pytest fixtures imported from test_attest_support are redefined as parameters)
"""Defects found in review of capseal.attest, each pinned by a test on a real swtpm."""

from __future__ import annotations

import copy
from typing import Any

import pytest

import capseal.attest as attest
from capseal import Producer, SealedRecord
from capseal.attest import PinnedAK, TrustPolicy, verify_evidence

from .test_attest_support import (  # noqa: F401  (fixtures)
    AttestTPM,
    producer,
    spec,
    tpm_a,
)

pytestmark = pytest.mark.swtpm  # counted in the hardware summary


@pytest.fixture()
def quoted(producer: Producer, tpm_a: AttestTPM) -> SealedRecord:
    """One sealed record quoted over its own id on TPM A."""
    record: SealedRecord = attest.quote(producer.seal(spec(1)), tpm_a.quoter(), ledger=producer.ledger)
    return record


def altered(record: SealedRecord, **members: Any) -> SealedRecord:
    ev = copy.deepcopy(record.hardware_evidence)
    assert ev is not None
    ev.update(members)
    return record.with_evidence(ev)


def test_a_required_ek_chain_is_never_passed_unchecked(quoted: SealedRecord) -> None:
    """require_ek_chain with no EK roots let any ek_certificates member pass
    (junk included): the chain was 'present', so the requirement was taken as
    met, though nothing could check it. Without roots a required chain cannot
    be valid, so it fails."""
    ev = quoted.hardware_evidence
    assert ev is not None
    strict = TrustPolicy((PinnedAK.from_pem(ev["ak_public"]),), require_ek_chain=True)
    for chain in (["bm90IGEgY2VydA=="], "junk", [7]):
        result = verify_evidence(altered(quoted, ek_certificates=chain), trust=strict)
        assert result.status == "evidence_ek_chain_invalid" and not result.ok, (chain, result.findings)
    # still: no chain at all under the same policy fails as before
    assert verify_evidence(quoted, trust=strict).status == "evidence_ek_chain_invalid"


def _rsa_public(exponent: int, modulus: bytes) -> bytes:
    """A TPMT_PUBLIC for an RSA restricted signing key with these numbers."""
    import struct

    attrs = 0x00050072  # restricted | sign | fixedTPM | fixedParent | sensitiveDataOrigin | userWithAuth
    return (struct.pack(">HHIH", 0x0001, 0x000B, attrs, 0) + struct.pack(">HHHI", 0x0010, 0x0010, 2048, exponent)
            + struct.pack(">H", len(modulus)) + modulus)


def test_an_rsa_public_area_with_impossible_numbers_is_a_wire_error(quoted: SealedRecord) -> None:
    """tpmwire.parse_public let cryptography's bare ValueError out for an RSA
    modulus < 3 or a bad exponent (its contract: WireError for anything that
    is not the structure). In verify_evidence that hit the last-resort catch,
    so the slot was reported 'evidence_malformed: ValueError: n must be >= 3.'
    and every finding made before it was dropped."""
    import base64

    from capseal.attest import tpmwire

    for exponent, modulus in ((65537, b"\x00"), (2, b"\xff" * 256), (0, b"")):
        with pytest.raises(tpmwire.WireError):
            tpmwire.parse_public(_rsa_public(exponent, modulus))
    ev = quoted.hardware_evidence
    assert ev is not None
    bad = altered(quoted, ak_tpm_public=base64.b64encode(_rsa_public(65537, b"\x00")).decode())
    result = verify_evidence(bad, trust=[ev["ak_public"]])
    assert result.status == "evidence_ak_inconsistent", result.findings
    assert any("not a TPMT_PUBLIC" in f.detail for f in result.findings)
    assert "evidence_signature_invalid" not in result.codes()  # the later checks still ran: the quote itself is good


def test_batch_limits_it_cannot_keep_are_refused_typed(producer: Producer, tpm_a: AttestTPM) -> None:
    """max_delay=inf killed the worker thread at its first wait (OverflowError
    in Event.wait): flush() then answered True, 'all quoted', with the slot
    still null and no failure counted. max_delay=nan never closed a batch by
    time and spun a CPU (wait(nan) returns at once). A negative or
    non-numeric limit was a bare ValueError or TypeError. All are refused
    with InputError (still a ValueError), before a thread starts."""
    from capseal.attest import BatchEvidence
    from capseal.errors import InputError

    quoter = tpm_a.quoter()
    bad_delays: tuple[Any, ...] = (float("inf"), float("nan"), -1, 1e300, "0.1", None, True)
    for delay in bad_delays:
        with pytest.raises(InputError, match="max_delay"):
            BatchEvidence(producer.ledger, quoter, max_delay=delay)
        with pytest.raises(InputError, match="max_delay"):
            attest.attach(producer, quoter, max_delay=delay)
    bad_sizes: tuple[Any, ...] = (0, -3, 1.5, "8", None, True)
    for size in bad_sizes:
        with pytest.raises(InputError, match="max_records"):
            BatchEvidence(producer.ledger, quoter, max_records=size)
    # the limits it can keep still work, a long delay included (closed by flush)
    worker = BatchEvidence(producer.ledger, quoter, max_records=1, max_delay=10**6)
    record = producer.seal(spec(2))
    worker.submit(record.capsule_id)
    assert worker.flush(30) and worker.close()
    stored = producer.ledger.get(record.capsule_id)
    assert stored is not None and verify_evidence(stored, trust=[quoter.identity.public_pem]).ok


def test_quote_refuses_what_is_not_a_sealed_record_or_a_quoter_typed(producer: Producer, tpm_a: AttestTPM) -> None:
    """attest.quote / quote_record let AttributeError (a record dict, None, a
    quoter that is None) and TypeError (a capsule_id that is not a string)
    out of a public call. They are EvidenceError, raised before the TPM is
    asked, and nothing is written."""
    from capseal.attest.quoter import quote_record
    from capseal.errors import EvidenceError

    record = producer.seal(spec(3))
    quoter = tpm_a.quoter()

    class NotSealed:
        capsule_id = 12345

    not_records: tuple[Any, ...] = (record.to_json(), None, NotSealed())
    for bad in not_records:
        with pytest.raises(EvidenceError, match="capsule id"):
            quote_record(bad, quoter, ledger=producer.ledger)
    for not_a_quoter in (None, 5, object()):
        with pytest.raises(EvidenceError, match="quoter"):
            attest.quote(record, not_a_quoter, ledger=producer.ledger)
    assert producer.ledger.evidence_history(record.capsule_id) == [None]


def test_a_pcr_index_with_thousands_of_digits_is_refused_typed() -> None:
    """PCRSelection.parse promises InputError for a bad selection; an index of
    more than 4300 digits let int()'s bare ValueError out instead."""
    from capseal.attest.evidence import PCRSelection
    from capseal.errors import InputError

    for text in ("sha256:" + "9" * 5000, "sha256:0-" + "1" * 4999 + "7", "sha256:" + "0" * 4999 + "24"):
        with pytest.raises(InputError, match="PCR"):
            PCRSelection.parse(text)
    # leading zeros are still read as before, however many
    assert str(PCRSelection.parse("sha256:007")) == "sha256:7"
    assert str(PCRSelection.parse("sha256:" + "0" * 5000 + "-" + "0" * 5000 + "2")) == "sha256:0,1,2"


# secp112r1: a curve cryptography cannot load (UnsupportedAlgorithm, not ValueError)
P112_PUBLIC_PEM = ("-----BEGIN PUBLIC KEY-----\nMDIwEAYHKoZIzj0CAQYFK4EEAAYDHgAEnM3RuOdcLENwSGHgJyU3AfAe50dUoqxz\n"
                   "Tz6qvw==\n-----END PUBLIC KEY-----\n")


def test_bad_ak_pins_are_refused_typed_and_reported_by_the_verifier(quoted: SealedRecord, producer: Producer,
                                                                   tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """PinnedAK.from_pem and TrustPolicy.coerce let cryptography's bare
    ValueError or UnsupportedAlgorithm out, or raised a bare TypeError, for a
    pin that is not PEM, holds a private key, or a key no TPM AK has, and for
    a policy argument of the wrong type (the CLI printed an internal error
    for --ak with an unloadable curve). All are InputError naming what is
    wrong, never echoing a private key; the verifier reports them as a
    finding, never raises."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519

    from capseal.cli import main
    from capseal.errors import InputError

    private = ec.generate_private_key(ec.SECP256R1())
    private_pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption())
    ed_public = ed25519.Ed25519PrivateKey.generate().public_key()
    ed_pem = ed_public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    not_public_pem = b"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n"
    pems: dict[str, tuple[Any, str]] = {
        "not PEM at all": (b"hello", "not a PEM public key"),
        "PEM, not a public key": (not_public_pem, "not a PEM public key"),
        "a private key": (private_pem, "private key"),
        "an Ed25519 key (no TPM AK is one)": (ed_pem, "RSA or ECC"),
        "a curve cryptography cannot load": (P112_PUBLIC_PEM, "type capseal cannot use"),
        "not text or bytes": (12345, "text or bytes"),
    }
    secret = private_pem.decode().splitlines()[1]
    for what, (pem, says) in pems.items():
        with pytest.raises(InputError, match=says) as info:
            PinnedAK.from_pem(pem)
        assert secret not in str(info.value), what
        if isinstance(pem, (bytes, str)) and "BEGIN" in str(pem):
            with pytest.raises(InputError, match=f"trust policy entry 1: .*{says}"):
                TrustPolicy.coerce([quoted.hardware_evidence["ak_public"], pem])  # type: ignore[index]
            result = verify_evidence(quoted, trust=[pem])
            assert result.status == "evidence_malformed" and not result.ok, what
            assert any("trust policy cannot be used" in f.detail and says in f.detail for f in result.findings), what
            assert all(secret not in f.detail for f in result.findings)
    keys: dict[str, tuple[Any, str]] = {"a private key": (private, "not a private key"),
                                        "an Ed25519 key": (ed_public, "RSA or ECC"),
                                        "not a key": (b"\x00" * 32, "RSA or ECC")}
    for what, (key, says) in keys.items():
        with pytest.raises(InputError, match=says, check=lambda exc: secret not in str(exc)):
            PinnedAK.from_key(key)
        assert verify_evidence(quoted, trust=[key]).status == "evidence_malformed", what
    policies: dict[str, tuple[Any, str]] = {
        "a number": (7, "cannot make a trust policy from int"),
        "a dict": ({"ak": quoted.hardware_evidence["ak_public"]}, "cannot make a trust policy from dict"),  # type: ignore[index]
        "a list holding a number": ([7], "entry 0 is not an AK pin: int"),
        "a string that is no pin": ("s3cret-looking-text", r"entry 0 \(str of length 19\) is neither"),
        "a private key object": (private, "not a private key"),
    }
    for what, (trust, says) in policies.items():
        with pytest.raises(InputError, match=says) as info:
            TrustPolicy.coerce(trust)
        assert "s3cret" not in str(info.value), what
        assert verify_evidence(quoted, trust=trust).status == "evidence_malformed", what
    # what worked still works
    assert verify_evidence(quoted, trust=[quoted.hardware_evidence["ak_public"].encode()]).ok  # type: ignore[index]
    # the CLI: a typed refusal naming the flag and the file, not an internal error
    ak = tmp_path / "p112.pem"
    ak.write_text(P112_PUBLIC_PEM)
    assert main(["verify", str(producer.ledger.path), "--evidence", "--ak", str(ak)]) == 2
    err = capsys.readouterr().err
    assert f"capseal: error: --ak {ak}: an AK pin's PEM holds a public key of a type capseal cannot use" in err
    assert "internal error" not in err


SHA1_ECDSA_AK = 0x81000144
SHA1_RSASSA_AK = 0x81000145


def _plain_quote_slot(tcti: str, handle: int, capsule_id: str, pcrs: str) -> dict[str, Any]:
    """The slot of a real TPM2_Quote over ``capsule_id`` taken with plain
    tpm2-pytss (no capseal check: capseal's quoter refuses what this makes),
    as a producer without those checks would write it."""
    from cryptography.hazmat.primitives import serialization
    from tpm2_pytss import ESAPI
    from tpm2_pytss.constants import TPM2_ALG
    from tpm2_pytss.types import TPML_PCR_SELECTION, TPMT_SIG_SCHEME

    from capseal.attest import tpmwire
    from capseal.attest.evidence import AKIdentity, PCRSelection, Quote, evidence_for_capsule, rfc3339_ms

    sel = PCRSelection.parse(pcrs)
    with ESAPI(tcti) as ectx:
        key = ectx.tr_from_tpmpublic(handle)
        public, name, qualified_name = ectx.read_public(key)
        attest_bytes, signature = ectx.quote(key, TPML_PCR_SELECTION.parse(str(sel)), bytes.fromhex(capsule_id),
                                             TPMT_SIG_SCHEME(scheme=TPM2_ALG.NULL))  # the AK's own scheme
        values: dict[str, dict[str, str]] = {}
        for bank in sel.banks:
            _, _, digests = ectx.pcr_read(TPML_PCR_SELECTION.parse(f"{bank.hash_name}:{','.join(map(str, bank.pcrs))}"))
            values[bank.hash_name] = {str(i): bytes(d).hex() for i, d in zip(bank.pcrs, digests)}
    tpmt = bytes(public.publicArea.marshal())
    pem = tpmwire.parse_public(tpmt).public_key.public_bytes(serialization.Encoding.PEM,
                                                             serialization.PublicFormat.SubjectPublicKeyInfo)
    identity = AKIdentity(public_pem=pem.decode(), name=bytes(name).hex(), tpm_public=tpmt,
                          qualified_name=bytes(qualified_name).hex(),
                          device={"manufacturer": "IBM", "vendor": "SW   TPM", "firmware": "0", "software": True})
    quote = Quote(bytes(attest_bytes), bytes(signature.marshal()), str(sel), values, identity, rfc3339_ms())
    return evidence_for_capsule(quote, capsule_id)


def test_sha1_quote_signatures_and_sha1_only_pcrs_are_refused(producer: Producer, tpm_a: AttestTPM) -> None:
    """A quote signed with SHA-1 (an AK with an ECDSA-SHA1 or RSASSA-SHA1
    scheme, on a real swtpm) verified as verified-software-tpm, and so did a
    quote whose PCRs came only from the SHA-1 bank. Both are error findings
    now (evidence_signature_weak_hash, evidence_pcr_weak_hash), and capseal's
    own quoter refuses to make either, before the TPM is asked."""
    from capseal.errors import EvidenceError, InputError

    from .test_attest_support import persist_key

    tcti = tpm_a.swtpm.tcti
    persist_key(tcti, SHA1_ECDSA_AK, scheme="ecc256:ecdsa-sha1")
    persist_key(tcti, SHA1_RSASSA_AK, scheme="rsa2048:rsassa-sha1")
    record = producer.seal(spec(11))
    cid = record.capsule_id
    for handle in (SHA1_ECDSA_AK, SHA1_RSASSA_AK):
        ev = _plain_quote_slot(tcti, handle, cid, "sha256:0-7")
        assert tpmwire_hash(ev) == "sha1"
        result = verify_evidence(record.with_evidence(ev), trust=[ev["ak_public"]])
        assert result.status == "evidence_signature_weak_hash" and not result.ok, result.findings
        assert "evidence_signature_invalid" not in result.codes()  # a good signature, over a SHA-1 hash
        # capseal will not quote with such an AK
        with pytest.raises(EvidenceError, match="SHA-1"):
            attest.AttestationKey(f"tpm2:handle=0x{handle:08x}?tcti={tcti}")
    # the SHA-256 AK: PCRs only in the SHA-1 bank are refused; beside a sha256 bank they are fine
    trust = [tpm_a.ak().public_pem]
    cases = {"sha1:0-7": "evidence_pcr_weak_hash", "sha256:16+sha1:0-7": "evidence_pcr_weak_hash",
             "sha256:0-7+sha1:0-7": "verified-software-tpm", "sha256:0-7": "verified-software-tpm"}
    for pcrs, status in cases.items():
        ev = _plain_quote_slot(tcti, tpm_a.handle, cid, pcrs)
        assert tpmwire_hash(ev) == "sha256"
        assert verify_evidence(record.with_evidence(ev), trust=trust).status == status, pcrs
    for pcrs in ("sha1:0-7", "sha256:16+sha1:0-7"):
        with pytest.raises(InputError, match=r"only in the SHA-1 bank"):
            tpm_a.quoter(pcrs=pcrs)
        with pytest.raises(InputError, match=r"only in the SHA-1 bank"):
            tpm_a.ak().quote(bytes.fromhex(cid), pcrs)
    assert producer.ledger.evidence_history(cid) == [None]
    assert attest.quote(record, tpm_a.quoter(pcrs="sha256:0-7+sha1:0-7"), ledger=producer.ledger).hardware_evidence


def tpmwire_hash(ev: dict[str, Any]) -> str:
    """The hash algorithm a slot's TPMT_SIGNATURE names."""
    import base64

    from capseal.attest import tpmwire

    return tpmwire.HASH_NAMES[tpmwire.parse_signature(base64.b64decode(ev["signature"])).hash_alg]
