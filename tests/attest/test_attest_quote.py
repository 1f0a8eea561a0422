# ruff: noqa: F811  (pytest fixtures imported from test_attest_support are redefined as parameters)
"""One record quoted on a real swtpm: the slot, its verification, and every way
to break it detected with its own finding code (issue 4 items 1, 2, 4)."""

from __future__ import annotations

import base64
import copy
from typing import Any

import agent_action_capsule as ref
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

import capseal.attest as attest
from capseal import Producer, SealedRecord
from capseal.attest import PinnedAK, TrustPolicy, tpmwire, verify_evidence
from capseal.attest.evidence import PCRSelection
from capseal.errors import EvidenceError, InputError, KeyURIError

from .test_attest_support import (  # noqa: F401  (fixtures)
    PLAIN_HANDLE,
    AttestTPM,
    extend_pcr,
    persist_key,
    producer,
    spec,
    tpm_a,
    tpm_b,
)

pytestmark = pytest.mark.swtpm  # counted in the hardware summary

# byte offsets inside a 145-byte TPMS_ATTEST from an ECC P-256 AK (TPM 2.0 Part 2 §10.12.12)
CLOCK_OFFSET = 4 + 2 + (2 + 34) + (2 + 32)
PCR_DIGEST_OFFSET = 145 - 32


def pin(tpm: AttestTPM) -> list[str]:
    return [tpm.ak().public_pem]


@pytest.fixture()
def quoted(producer: Producer, tpm_a: AttestTPM) -> tuple[SealedRecord, SealedRecord]:
    """Two sealed records, both quoted (over their own ids) on TPM A."""
    quoter = tpm_a.quoter()
    r1 = attest.quote(producer.seal(spec(1)), quoter, ledger=producer.ledger)
    r2 = attest.quote(producer.seal(spec(2)), quoter, ledger=producer.ledger)
    return r1, r2


def altered(record: SealedRecord, **members: Any) -> SealedRecord:
    ev = copy.deepcopy(record.hardware_evidence)
    assert ev is not None
    ev.update(members)
    return record.with_evidence(ev)


def flip(b64: str, offset: int) -> str:
    raw = bytearray(base64.b64decode(b64))
    raw[offset] ^= 0x01
    return base64.b64encode(bytes(raw)).decode()


# ---------------------------------------------------------------------------- the AK


def test_ak_loads_by_uri_and_exposes_what_to_pin(tpm_a: AttestTPM) -> None:
    from tpm2_pytss import ESAPI

    ak = attest.AttestationKey(tpm_a.uri)
    key = serialization.load_pem_public_key(ak.public_pem.encode())
    assert isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name == "secp256r1"
    with ESAPI(tpm_a.swtpm.tcti) as ectx:
        pub, name, qname = ectx.read_public(ectx.tr_from_tpmpublic(tpm_a.handle))
    assert ak.name == bytes(name).hex() == pub.get_name().marshal()[2:].hex()
    assert ak.qualified_name == bytes(qname).hex()
    assert pub.to_pem() == ak.public_pem.encode()
    area = tpmwire.parse_public(ak.identity.tpm_public)
    assert area.is_restricted_signing_key and area.name.hex() == ak.name
    assert ak.identity.device["software"] is True and ak.software  # swtpm is software, always
    assert ak.identity.device["manufacturer"] == "IBM"


def test_ak_uri_errors_are_typed() -> None:
    for bad in ("pkcs11:token=x", "tpm2:tcti=swtpm:", "tpm2:handle=zz", "tpm2:handle=0x80000001", "tpm2:handle"):
        with pytest.raises(KeyURIError):
            attest.parse_ak_uri(bad)
    ref_ = attest.parse_ak_uri("tpm2:handle=0x81000102?tcti=swtpm:host=127.0.0.1,port=2321")
    assert (ref_.handle, ref_.tcti) == (0x81000102, "swtpm:host=127.0.0.1,port=2321")
    assert attest.parse_ak_uri("tpm2:handle=0x81000102").tcti == "device:/dev/tpmrm0"


def test_a_key_that_is_not_restricted_is_refused_as_ak(tpm_a: AttestTPM) -> None:
    persist_key(tpm_a.swtpm.tcti, PLAIN_HANDLE, restricted=False)
    with pytest.raises(EvidenceError, match="not an attestation key"):
        attest.AttestationKey(f"tpm2:handle=0x{PLAIN_HANDLE:08x}?tcti={tpm_a.swtpm.tcti}")
    with pytest.raises(EvidenceError):
        attest.AttestationKey(f"tpm2:handle=0x81000999?tcti={tpm_a.swtpm.tcti}")  # nothing there


# ---------------------------------------------------------------------------- one quote


def test_quoted_record_verifies_and_keeps_its_capsule(producer: Producer, tpm_a: AttestTPM) -> None:
    record = producer.seal(spec(1))
    assert record.hardware_evidence is None
    before = record.capsule.copy()
    quoted = attest.quote(record, tpm_a.uri, ledger=producer.ledger)  # by URI, sync
    assert quoted.capsule == before and quoted.capsule_id == record.capsule_id
    ev = quoted.hardware_evidence
    assert ev is not None and ev["kind"] == "tpm2-quote"
    assert ev["binding"] == {"capsule_id": record.capsule_id}
    assert ev["pcr_selection"] == "sha256:0,1,2,3,4,5,6,7" and sorted(ev["pcr_values"]["sha256"], key=int) == [str(i) for i in range(8)]
    assert ev["device"]["software"] is True
    for member in ("attest", "signature", "ak_public", "ak_name", "taken_at", "tpm_clock"):
        assert ev[member]
    assert set(ev["tpm_clock"]) >= {"clock", "reset_count", "restart_count", "obfuscated"}
    # the quote's qualifyingData is the raw 32-byte id
    parsed = tpmwire.parse_attest(base64.b64decode(ev["attest"]))
    assert parsed.extra_data == bytes.fromhex(record.capsule_id)
    assert parsed.clock == ev["tpm_clock"]["clock"] and parsed.reset_count == ev["tpm_clock"]["reset_count"]

    result = verify_evidence(quoted, trust=pin(tpm_a))
    assert result.status == "verified-software-tpm" and result.ok, result.findings
    assert "evidence_software_tpm" in result.codes()

    # the ledger: filled slot beside the record, the null state kept in history
    stored = producer.ledger.get(record.capsule_id)
    assert stored is not None and stored.hardware_evidence == ev and stored.capsule == before
    assert producer.ledger.evidence_history(record.capsule_id) == [None, ev]
    # the reference verifier still accepts the capsule, same id
    assert ref.verify(stored.capsule).ok
    assert ref.compute_capsule_id(stored.capsule) == record.capsule_id


def test_wire_readers_agree_with_tpm2_pytss(quoted: tuple[SealedRecord, SealedRecord]) -> None:
    from tpm2_pytss.types import TPMS_ATTEST, TPMT_PUBLIC, TPMT_SIGNATURE

    ev = quoted[0].hardware_evidence
    assert ev is not None
    raw = base64.b64decode(ev["attest"])
    theirs, _ = TPMS_ATTEST.unmarshal(raw)
    ours = tpmwire.parse_attest(raw)
    assert (ours.magic, ours.type) == (int(theirs.magic), int(theirs.type))
    assert ours.qualified_signer == bytes(theirs.qualifiedSigner) and ours.extra_data == bytes(theirs.extraData)
    assert (ours.clock, ours.reset_count, ours.restart_count, ours.firmware_version) == (
        theirs.clockInfo.clock, theirs.clockInfo.resetCount, theirs.clockInfo.restartCount, theirs.firmwareVersion)
    assert ours.pcr_digest == bytes(theirs.attested.quote.pcrDigest)
    sig, _ = TPMT_SIGNATURE.unmarshal(base64.b64decode(ev["signature"]))
    assert tpmwire.parse_signature(base64.b64decode(ev["signature"])).der == bytes(sig)  # DER, as pytss gives it
    pub, _ = TPMT_PUBLIC.unmarshal(base64.b64decode(ev["ak_tpm_public"]))
    assert tpmwire.parse_public(base64.b64decode(ev["ak_tpm_public"])).name == pub.get_name().marshal()[2:]
    sig.verify_signature(pub, raw)  # and pytss agrees the signature is good


def test_a_changed_pcr_is_quoted_as_it_is(tpm_a: AttestTPM, producer: Producer) -> None:
    extend_pcr(tpm_a.swtpm.tcti, 7, b"\x07" * 32)
    record = attest.quote(producer.seal(spec(9)), tpm_a.quoter(pcrs="sha256:0,7,16+sha1:0"))
    ev = record.hardware_evidence
    assert ev is not None and ev["pcr_selection"] == "sha256:0,7,16+sha1:0"
    assert ev["pcr_values"]["sha256"]["7"] != "00" * 32
    assert verify_evidence(record, trust=pin(tpm_a)).ok


# ---------------------------------------------------------------------------- breaking it


def test_each_attack_has_its_own_finding_code(
    quoted: tuple[SealedRecord, SealedRecord], tpm_a: AttestTPM, tpm_b: AttestTPM
) -> None:
    r1, r2 = quoted
    ev1, ev2 = r1.hardware_evidence, r2.hardware_evidence
    assert ev1 is not None and ev2 is not None
    trust_a = pin(tpm_a)
    # the same record quoted on TPM B (same AK template, another TPM)
    on_b = attest.quote(r1.with_evidence(None), tpm_b.quoter())
    ev_b = on_b.hardware_evidence
    assert ev_b is not None
    values = copy.deepcopy(ev1["pcr_values"])
    values["sha256"]["3"] = "ab" * 32

    cases = {
        "attest bytes altered": (altered(r1, attest=flip(ev1["attest"], CLOCK_OFFSET + 7)), trust_a),
        "signature altered": (altered(r1, signature=flip(ev1["signature"], len(base64.b64decode(ev1["signature"])) - 1)), trust_a),
        "nonce of another record (replay)": (r2.with_evidence(ev1), trust_a),
        "PCR values altered": (altered(r1, pcr_values=values), trust_a),
        "AK not in the trust policy": (r1, pin(tpm_b)),
        "quote from a different TPM": (altered(r1, attest=ev_b["attest"], signature=ev_b["signature"]), trust_a),
    }
    expected = {
        "attest bytes altered": "evidence_attest_altered",
        "signature altered": "evidence_signature_invalid",
        "nonce of another record (replay)": "evidence_nonce_mismatch",
        "PCR values altered": "evidence_pcr_mismatch",
        "AK not in the trust policy": "evidence_ak_untrusted",
        "quote from a different TPM": "evidence_foreign_quote",
    }
    seen = {}
    for what, (record, trust) in cases.items():
        result = verify_evidence(record, trust=trust)
        assert not result.ok, what
        assert result.status == expected[what], (what, [str(f) for f in result.findings])
        seen[what] = result.status
    assert len(set(seen.values())) == len(seen)  # every attack its own code
    # the untouched records verify, and TPM B's evidence verifies only under TPM B's pin
    assert verify_evidence(r1, trust=trust_a).ok and verify_evidence(r2, trust=trust_a).ok
    assert verify_evidence(on_b, trust=pin(tpm_b)).ok
    assert verify_evidence(on_b, trust=trust_a).status == "evidence_ak_untrusted"


def test_every_single_byte_change_to_the_attest_is_caught(quoted: tuple[SealedRecord, SealedRecord], tpm_a: AttestTPM) -> None:
    r1, _ = quoted
    ev = r1.hardware_evidence
    assert ev is not None
    trust = TrustPolicy.coerce(pin(tpm_a))
    size = len(base64.b64decode(ev["attest"]))
    assert size == 145
    codes: set[str] = set()
    for i in range(size):
        result = verify_evidence(altered(r1, attest=flip(ev["attest"], i)), trust=trust)
        assert not result.ok and result.status not in ("verified", "verified-software-tpm"), i
        # a damaged attest never carries a valid signature, and says what differs
        assert "evidence_signature_invalid" in result.codes() or result.status.endswith("malformed"), i
        codes.update(result.codes())
    assert {"evidence_not_tpm_generated", "evidence_foreign_quote", "evidence_nonce_mismatch",
            "evidence_attest_altered", "evidence_pcr_mismatch"} <= codes
    assert "evidence_pcr_mismatch" in verify_evidence(altered(r1, attest=flip(ev["attest"], PCR_DIGEST_OFFSET)), trust=trust).codes()


def test_other_damage_is_named(quoted: tuple[SealedRecord, SealedRecord], tpm_a: AttestTPM) -> None:
    r1, _ = quoted
    ev = r1.hardware_evidence
    assert ev is not None
    trust = pin(tpm_a)
    other_key = tpm_a.ak()  # a PEM of another key under the same name
    from cryptography.hazmat.primitives.asymmetric import ec

    stranger = ec.generate_private_key(ec.SECP256R1()).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    cases = {
        "evidence_ak_inconsistent": altered(r1, ak_public=stranger),
        "evidence_pcr_selection_mismatch": altered(r1, pcr_selection="sha256:0-6"),
        "evidence_attest_malformed": altered(r1, attest=base64.b64encode(b"\xff\x54").decode()),
        "evidence_signature_malformed": altered(r1, signature=base64.b64encode(b"\x00\x99").decode()),
        "evidence_malformed": altered(r1, attest="not base64!"),
    }
    for code, record in cases.items():
        assert verify_evidence(record, trust=trust).status == code, code
    assert other_key.public_pem == ev["ak_public"]


def test_slot_states_and_no_hardware_claim_without_trust(quoted: tuple[SealedRecord, SealedRecord], tpm_a: AttestTPM) -> None:
    r1, _ = quoted
    ev = r1.hardware_evidence
    assert ev is not None
    # null: missing information, never a negative claim
    assert attest.evidence_status(r1.with_evidence(None), trust=pin(tpm_a)) == ("no-evidence", [])
    # {} is never a slot; odd values are reported, never raised
    odd: Any
    for odd in ({}, [], 7, "x", {"kind": "tpm2-quote"}, {"kind": "sgx"}):
        result = verify_evidence(r1.capsule_id, trust=pin(tpm_a), evidence=odd)
        assert result.status == "evidence_malformed" and not result.ok
    assert verify_evidence(r1.to_json(), trust=pin(tpm_a)).ok  # the record's JSON form works too
    # no trust policy: self-consistent, but not verified
    nopin = verify_evidence(r1, trust=None)
    assert nopin.status == "evidence_ak_not_pinned" and not nopin.ok
    assert all(f.severity != "error" for f in nopin.findings)
    # device strings can only lower the claim: swtpm claiming hardware is still software
    liar = altered(r1, device={"manufacturer": "IFX", "vendor": "SLB9670", "firmware": "7.85", "software": False})
    assert verify_evidence(liar, trust=pin(tpm_a)).status == "verified-software-tpm"
    # hardware only when the relying party enrolled the AK as hardware (or an EK chain verifies) ...
    enrolled = TrustPolicy((PinnedAK.from_pem(ev["ak_public"], software=False),))
    assert verify_evidence(liar, trust=enrolled).status == "verified"
    # ... and never when the device itself says software
    assert verify_evidence(r1, trust=enrolled).status == "verified-software-tpm"
    # an EK chain demanded but absent (swtpm has no EK certificate)
    strict = TrustPolicy((PinnedAK.from_pem(ev["ak_public"]),), require_ek_chain=True)
    assert verify_evidence(r1, trust=strict).status == "evidence_ek_chain_invalid"
    # pins by TPM name work like pins by key
    assert verify_evidence(r1, trust=[ev["ak_name"]]).ok


def test_a_quote_that_does_not_verify_is_never_written(producer: Producer, tpm_a: AttestTPM) -> None:
    """A quoter whose quote covers another nonce: refused before the ledger."""
    real = tpm_a.quoter()

    class WrongNonce:
        identity = real.identity

        def take(self, nonce: bytes) -> Any:
            return real.take(bytes(32))

    record = producer.seal(spec(5))
    with pytest.raises(EvidenceError, match="did not verify"):
        attest.quote(record, WrongNonce(), ledger=producer.ledger)
    assert producer.ledger.evidence_history(record.capsule_id) == [None]
    assert producer.ledger.get(record.capsule_id).hardware_evidence is None  # type: ignore[union-attr]


def test_pcr_selection_parsing() -> None:
    assert str(PCRSelection.parse("sha256:0-7")) == "sha256:0,1,2,3,4,5,6,7"
    assert str(PCRSelection.parse("sha256:7,0,3-4+sha1:1")) == "sha256:0,3,4,7+sha1:1"
    for bad in ("", "sha256", "md5:1", "sha256:9-2", "sha256:24", "sha256:1+sha256:2"):
        with pytest.raises(InputError):  # typed (and still a ValueError)
            PCRSelection.parse(bad)


def test_pcr_values_the_quote_does_not_cover_are_refused(quoted: tuple[SealedRecord, SealedRecord], tpm_a: AttestTPM) -> None:
    """pcrDigest hashes only the concatenation of the values: a slot whose
    values split it differently, or that lists a PCR or bank nobody quoted,
    was reported verified."""
    r1, _ = quoted
    ev = r1.hardware_evidence
    assert ev is not None
    trust = pin(tpm_a)
    assert verify_evidence(r1, trust=trust).ok
    v = ev["pcr_values"]["sha256"]
    moved = {**ev["pcr_values"], "sha256": {**v, "0": v["0"] + v["1"], "1": ""}}
    shifted = {**ev["pcr_values"], "sha256": {**v, "0": v["0"][:-2], "1": v["0"][-2:] + v["1"]}}
    extra_pcr = {**ev["pcr_values"], "sha256": {**v, "16": "ab" * 32}}
    extra_bank = {**ev["pcr_values"], "sha1": {"0": "cd" * 20}}
    spaced = {**ev["pcr_values"], "sha256": {**v, "0": v["0"][:-2] + " 1"}}
    for values in (moved, shifted, extra_pcr, extra_bank, spaced):
        assert verify_evidence(altered(r1, pcr_values=values), trust=trust).status == "evidence_pcr_mismatch"


def test_the_ak_from_tpm_provision_quotes_and_verifies(fresh_swtpm: Any, producer: Producer) -> None:
    """`capseal tpm provision` (keys backend) creates the AK; capseal.attest loads
    it by the URI provision returns, and a relying party pins the PEM it printed."""
    from capseal.keys.tpm import get_device, provision

    try:
        info = provision(fresh_swtpm.tcti)
        ak_info = info["attestation_key"]
        ak = attest.AttestationKey(ak_info["uri"])
        assert ak.name == ak_info["name"] and ak.public_pem == ak_info["public_key_pem"]
        record = attest.quote(producer.seal(spec(3)), ak_info["uri"], ledger=producer.ledger)
        assert verify_evidence(record, trust=[ak_info["public_key_pem"]]).status == "verified-software-tpm"
        assert info["software_device"] is True
    finally:
        get_device(fresh_swtpm.tcti).close()  # disconnect before the fixture stops swtpm


def _ca_chain() -> tuple[Any, list[str], Any]:
    """A root CA and an EK-like leaf it signs (cryptography-made: swtpm has no EK certificate)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    def cert(subject: str, issuer: str, key: Any, signer: Any, ca: bool) -> Any:
        now = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
        return (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
                .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=3650))
                .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
                .sign(signer, hashes.SHA256()))

    root_key, ek_key, other_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    root = cert("Example TPM Root CA", "Example TPM Root CA", root_key, root_key, True)
    ek = cert("EK", "Example TPM Root CA", ek_key, root_key, False)
    other_root = cert("Other Root", "Other Root", other_key, other_key, True)
    chain = [base64.b64encode(ek.public_bytes(serialization.Encoding.DER)).decode()]
    return root, chain, other_root


def test_ek_certificate_chain_is_checked_when_present_and_never_gives_hardware(quoted: tuple[SealedRecord, SealedRecord]) -> None:
    r1, _ = quoted
    ev = r1.hardware_evidence
    assert ev is not None
    root, chain, other_root = _ca_chain()
    hw_device = {"manufacturer": "IFX", "vendor": "SLB9672", "firmware": "16.10", "software": False}
    with_chain = altered(r1, ek_certificates=chain, device=hw_device)
    pin = PinnedAK.from_pem(ev["ak_public"])
    # a valid chain to a trusted root never upgrades the claim: it is producer-supplied and
    # not bound to the AK (this quote is swtpm's, the chain and device strings are pasted in)
    result = verify_evidence(with_chain, trust=TrustPolicy((pin,), ek_roots=(root,)))
    assert result.status == "verified-software-tpm"
    assert "not bound to this AK" in " ".join(f.detail for f in result.findings)
    # only the relying party's enrollment of the AK as hardware does
    hardware_pin = PinnedAK.from_pem(ev["ak_public"], software=False)
    assert verify_evidence(with_chain, trust=TrustPolicy((hardware_pin,), ek_roots=(root,))).status == "verified"
    # a chain that is only the trusted root names no TPM: refused, not passed
    root_only = altered(r1, ek_certificates=[base64.b64encode(root.public_bytes(serialization.Encoding.DER)).decode()],
                        device=hw_device)
    assert verify_evidence(root_only, trust=TrustPolicy((pin,), ek_roots=(root,))).status == "evidence_ek_chain_invalid"
    assert verify_evidence(root_only, trust=TrustPolicy((hardware_pin,), ek_roots=(root,))).status == \
        "evidence_ek_chain_invalid"
    assert verify_evidence(with_chain, trust=TrustPolicy((pin,), ek_roots=(other_root,))).status == "evidence_ek_chain_invalid"
    # no roots configured: the chain is not evaluated, nothing says hardware
    assert verify_evidence(with_chain, trust=TrustPolicy((pin,))).status == "verified-software-tpm"
    # a software device stays software whatever the chain
    assert verify_evidence(altered(r1, ek_certificates=chain), trust=TrustPolicy((pin,), ek_roots=(root,))).status == \
        "verified-software-tpm"
    garbage = altered(r1, ek_certificates=["bm90IGEgY2VydA=="], device=hw_device)
    assert verify_evidence(garbage, trust=TrustPolicy((pin,), ek_roots=(root,))).status == "evidence_ek_chain_invalid"
