"""Verify a record's hardware-evidence slot. Never raises.

Every check has its own finding code, so an auditor can tell *what* is wrong:

==================================  =====================================================
``evidence_malformed``              a member is missing or not of its type
``evidence_attest_malformed``       ``attest`` is not a TPMS_ATTEST
``evidence_signature_malformed``    ``signature`` is not a TPMT_SIGNATURE
``evidence_ak_inconsistent``        ak_public / ak_name / ak_tpm_public name different keys
``evidence_ak_not_restricted``      the AK is not a restricted, fixedTPM signing key
``evidence_not_tpm_generated``      magic is not TPM_GENERATED_VALUE
``evidence_not_a_quote``            type is not TPM_ST_ATTEST_QUOTE
``evidence_foreign_quote``          the attest's qualifiedSigner is not the named AK
                                    (a quote from another TPM or another key)
``evidence_attest_altered``         the attest disagrees with the clock/firmware fields
                                    recorded when it was verified at write time
``evidence_signature_invalid``      the AK's signature does not verify over the attest
``evidence_signature_weak_hash``    the signature (and so the pcrDigest) hashes with
                                    SHA-1 (RSASSA, RSAPSS or ECDSA): refused, since a
                                    SHA-1 collision lets one signature cover two attests
``evidence_nonce_mismatch``         extraData is not this capsule's id (or the batch
                                    root): a quote of another record, i.e. a replay
``evidence_inclusion_invalid``      the inclusion proof does not lead from this id's
                                    leaf to the quoted root
``evidence_pcr_selection_mismatch`` the recorded PCR selection is not the quoted one
``evidence_pcr_mismatch``           the recorded PCR values do not hash to pcrDigest
``evidence_pcr_weak_hash``          a PCR is quoted only from the SHA-1 bank (a quote
                                    over only sha1 banks included): a SHA-1 PCR does not
                                    pin what was measured (see ``pcrs_only_in_sha1``);
                                    the same PCR also quoted from sha256 is fine
``evidence_ak_untrusted``           the AK is not in the trust policy
``evidence_ek_chain_invalid``       an EK certificate chain is required or present and fails
                                    (not an end-entity EK certificate issued up to a
                                    trusted root)
``evidence_ak_not_pinned``          (warning) no trust policy was given: the quote is
                                    self-consistent, but nothing says whose AK it is
==================================  =====================================================

Statuses (``capseal verify --evidence``): ``no-evidence`` (slot null: missing
information, never a negative claim), ``verified``, ``verified-software-tpm``,
or the code of the first failure in the order above.

``verified`` (a hardware TPM) needs more than a valid quote: the device strings
in the slot are read by the producer and unsigned, so they can only *lower*
the claim. Hardware is reported only when the device does not say software
AND the verifier's own trust says hardware: the AK pinned with
``software=False`` (enrolled as a hardware AK, after the relying party bound
it to the TPM's EK, e.g. by credential activation; ``PinnedAK.from_provisioning``
carries what provisioning read from the TPM, so an AK provisioned in a
software TPM is pinned as software and nothing in a slot raises it). Such a
``verified`` carries the ``evidence_hardware_by_enrollment`` information. An EK certificate chain
in the slot never does: it is producer-supplied, unsigned and not bound to
the AK that made the quote, so a slot could carry a real TPM's chain beside
a swtpm quote. When roots are configured the chain is checked (a bad one is
``evidence_ek_chain_invalid``), and ``require_ek_chain`` demands one, but a
valid chain only tells the TPM's make. Everything else — swtpm always — is
``verified-software-tpm``.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa

from capseal import merkle
from capseal.canonical import hex_bytes
from capseal.errors import InputError
from capseal.findings import Finding, HasFindings

from . import tpmwire
from .evidence import KIND, PCRSelection, is_software_device, pcr_digest, pcrs_only_in_sha1
from .trust import TrustPolicy

__all__ = ["EvidenceResult", "verify_evidence", "evidence_status", "FAILURE_ORDER", "VERIFIED", "VERIFIED_SOFTWARE", "NO_EVIDENCE"]

NO_EVIDENCE = "no-evidence"
VERIFIED = "verified"
VERIFIED_SOFTWARE = "verified-software-tpm"

FAILURE_ORDER = (
    "evidence_malformed",
    "evidence_attest_malformed",
    "evidence_signature_malformed",
    "evidence_ak_inconsistent",
    "evidence_ak_not_restricted",
    "evidence_not_tpm_generated",
    "evidence_not_a_quote",
    "evidence_foreign_quote",
    "evidence_attest_altered",
    "evidence_signature_invalid",
    "evidence_signature_weak_hash",
    "evidence_nonce_mismatch",
    "evidence_inclusion_invalid",
    "evidence_pcr_selection_mismatch",
    "evidence_pcr_mismatch",
    "evidence_pcr_weak_hash",
    "evidence_ak_untrusted",
    "evidence_ek_chain_invalid",
    "evidence_ak_not_pinned",
)

_HASHES = {"sha1": hashes.SHA1(), "sha256": hashes.SHA256(), "sha384": hashes.SHA384(), "sha512": hashes.SHA512()}


@dataclass
class EvidenceResult(HasFindings):
    """What the verifier concluded about one slot. ``ok`` is True only for
    ``verified`` and ``verified-software-tpm``."""

    status: str
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether the slot verified (on a hardware or a software TPM)."""
        return self.status in (VERIFIED, VERIFIED_SOFTWARE)


class _Stop(Exception):
    """A check failed in a way that makes the later checks meaningless."""


def _parts(record: Any, evidence: Any) -> tuple[str | None, Any]:
    """(capsule id, evidence) from a SealedRecord, a record dict or a capsule id."""
    if isinstance(record, str):
        return record, evidence
    if isinstance(record, Mapping):
        capsule = record.get("capsule", record)
        cid = capsule.get("capsule_id") if isinstance(capsule, Mapping) else None
        ev = evidence if evidence is not None else record.get("hardware_evidence")
        return (cid if isinstance(cid, str) else None), ev
    cid = getattr(record, "capsule_id", None)
    ev = evidence if evidence is not None else getattr(record, "hardware_evidence", None)
    return (cid if isinstance(cid, str) else None), ev


def verify_evidence(record: Any, trust: Any = None, *, evidence: Any = None) -> EvidenceResult:
    """Verify the hardware-evidence slot of a record. Never raises.

    Args:
        record: a SealedRecord, a ``capseal-record/1`` dict, or a capsule id
            (with ``evidence=``).
        trust: the AKs trusted (see :meth:`TrustPolicy.coerce`); None: none pinned.
        evidence: the slot, for a capsule id (or to check another slot).

    Returns:
        The status and findings (``evidence_malformed`` for what cannot be read).
    """
    try:
        return _verify(record, trust, evidence)
    except Exception as exc:  # a verifier reports, it does not raise
        return EvidenceResult("evidence_malformed", [Finding("evidence_malformed", f"{type(exc).__name__}: {exc}")])


def evidence_status(record: Any, trust: Any = None) -> tuple[str, list[Finding]]:
    """What ``capseal verify --evidence`` reports for a record (see the module docstring).

    Args:
        record: as for :func:`verify_evidence`.
        trust: as for :func:`verify_evidence`.

    Returns:
        ``(status, findings)``.
    """
    result = verify_evidence(record, trust)
    return result.status, result.findings


def _verify(record: Any, trust: Any, evidence_arg: Any) -> EvidenceResult:
    cid, ev = _parts(record, evidence_arg)
    if ev is None:
        return EvidenceResult(NO_EVIDENCE, [])
    findings: list[Finding] = []

    def fail(code: str, detail: str, severity: str = "error") -> None:
        findings.append(Finding(code, detail, severity=severity))  # type: ignore[arg-type]

    try:
        policy = TrustPolicy.coerce(trust)
    except InputError as exc:  # the caller's policy is wrong: reported, never raised
        fail("evidence_malformed", f"the trust policy cannot be used: {exc}")
        return _result(findings, None, ev)
    try:
        _check(cid, ev, policy, fail)
    except _Stop:
        pass
    return _result(findings, policy, ev)


def _result(findings: list[Finding], policy: TrustPolicy | None, ev: Any) -> EvidenceResult:
    errors = [f for f in findings if f.severity == "error"]
    if errors:
        rank = {code: i for i, code in enumerate(FAILURE_ORDER)}
        first = min(errors, key=lambda f: rank.get(f.code, len(rank)))
        return EvidenceResult(first.code, findings)
    if any(f.code == "evidence_ak_not_pinned" for f in findings):
        return EvidenceResult("evidence_ak_not_pinned", findings)
    software = any(f.code == "evidence_software_tpm" for f in findings)
    return EvidenceResult(VERIFIED_SOFTWARE if software else VERIFIED, findings)


def _b64(ev: Mapping[str, Any], key: str) -> bytes:
    value = ev.get(key)
    if not isinstance(value, str) or not value:
        raise ValueError(f"{key} is missing")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{key} is not base64") from None


def _hex(value: Any, key: str, size: int | None = None) -> bytes:
    raw = hex_bytes(value)
    if raw is None:
        raise ValueError(f"{key} is not a hex string")
    if size is not None and len(raw) != size:
        raise ValueError(f"{key} is not {size} bytes")
    return raw


def _check(cid: str | None, ev: Any, policy: TrustPolicy | None, fail: Any) -> None:
    # ---- shape
    if not isinstance(ev, Mapping) or not ev:
        fail("evidence_malformed", "the slot is filled but is not a non-empty object (never {})")
        raise _Stop
    if ev.get("kind") != KIND:
        fail("evidence_malformed", f"kind {ev.get('kind')!r} is not {KIND!r}")
        raise _Stop
    try:
        cid_raw = _hex(cid, "the record's capsule_id", 32)
        attest_bytes = _b64(ev, "attest")
        sig_bytes = _b64(ev, "signature")
        ak_tpm_public = _b64(ev, "ak_tpm_public")
        ak_pem = ev.get("ak_public")
        if not isinstance(ak_pem, str):
            raise ValueError("ak_public is not a PEM string")
        ak_key = serialization.load_pem_public_key(ak_pem.encode())
        ak_name = _hex(ev.get("ak_name"), "ak_name")
        ak_qn = _hex(ev.get("ak_qualified_name"), "ak_qualified_name")
        selection = PCRSelection.parse(ev.get("pcr_selection"))  # type: ignore[arg-type]
        pcr_values = ev.get("pcr_values")
        if not isinstance(pcr_values, Mapping):
            raise ValueError("pcr_values is not an object")
        binding = ev.get("binding")
        if not isinstance(binding, Mapping):
            raise ValueError("binding is not an object")
        clock = ev.get("tpm_clock")
        if not isinstance(clock, Mapping):
            raise ValueError("tpm_clock is not an object")
    except (ValueError, TypeError) as exc:
        fail("evidence_malformed", str(exc))
        raise _Stop from None

    # ---- structures
    try:
        attest = tpmwire.parse_attest(attest_bytes)
    except tpmwire.WireError as exc:
        fail("evidence_attest_malformed", f"attest is not a TPMS_ATTEST: {exc}")
        raise _Stop from None
    try:
        sig = tpmwire.parse_signature(sig_bytes)
    except tpmwire.WireError as exc:
        fail("evidence_signature_malformed", f"signature is not a TPMT_SIGNATURE: {exc}")
        raise _Stop from None

    # ---- the AK: one key under three names, and restricted
    spki = ak_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    try:
        area = tpmwire.parse_public(ak_tpm_public)
        area_spki = area.public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
        if area_spki != spki:
            fail("evidence_ak_inconsistent", "ak_public is not the key in ak_tpm_public")
        if area.name != ak_name:
            fail("evidence_ak_inconsistent", f"ak_name {ak_name.hex()} is not the name of ak_tpm_public ({area.name.hex()})")
        if not area.is_restricted_signing_key:
            fail("evidence_ak_not_restricted",
                 "the AK is not a restricted fixedTPM signing key, so TPM_GENERATED_VALUE proves nothing")
    except tpmwire.WireError as exc:
        fail("evidence_ak_inconsistent", f"ak_tpm_public is not a TPMT_PUBLIC: {exc}")

    # ---- the signature
    hash_name = tpmwire.HASH_NAMES.get(sig.hash_alg)
    if hash_name is None:
        fail("evidence_signature_malformed", f"signature hash 0x{sig.hash_alg:04x} is not supported")
        raise _Stop
    if not _signature_ok(ak_key, sig, attest_bytes, hash_name):
        fail("evidence_signature_invalid", "the AK's signature does not verify over the attest bytes")
    if sig.hash_alg == tpmwire.ALG.SHA1:  # checked above all the same: an invalid one is named as such too
        fail("evidence_signature_weak_hash",
             "the quote is signed with SHA-1, which a verifier does not accept (a SHA-1 collision lets one signature "
             "cover two attests); quote with an AK whose scheme hashes with SHA-256 or stronger")

    # ---- the attest header
    if attest.magic != tpmwire.TPM_GENERATED_VALUE:
        fail("evidence_not_tpm_generated", f"magic 0x{attest.magic:08x} is not TPM_GENERATED_VALUE")
    if attest.type != tpmwire.TPM_ST_ATTEST_QUOTE:
        fail("evidence_not_a_quote", f"attest type 0x{attest.type:04x} is not TPM_ST_ATTEST_QUOTE")
        raise _Stop
    pin = policy.match(spki, ak_name.hex()) if policy is not None else None
    expected_qn = {ak_qn}
    if pin is not None and pin.qualified_name:
        expected_qn.add(bytes.fromhex(pin.qualified_name))
    if any(attest.qualified_signer != qn for qn in expected_qn):
        fail("evidence_foreign_quote",
             f"the quote was made by key {attest.qualified_signer.hex()[:20]}… (qualifiedSigner), not by the named AK "
             f"{ak_qn.hex()[:20]}…: a quote from another TPM or another key")
    recorded = {k: clock.get(k) for k in ("clock", "reset_count", "restart_count", "safe", "firmware_version")}
    actual = {"clock": attest.clock, "reset_count": attest.reset_count, "restart_count": attest.restart_count,
              "safe": attest.safe, "firmware_version": f"{attest.firmware_version:016x}"}
    differing = sorted(k for k in actual if recorded[k] != actual[k])
    if differing:
        fail("evidence_attest_altered",
             f"the attest's {', '.join(differing)} differ from the values recorded when it was verified")

    # ---- the binding: extraData is this id, or a root this id is a leaf of
    if "capsule_id" in binding:
        if binding.get("capsule_id") != cid or attest.extra_data != cid_raw:
            fail("evidence_nonce_mismatch",
                 f"the quote's qualifyingData {attest.extra_data.hex()[:16]}… is not this capsule's id {cid[:16]}…"  # type: ignore[index]
                 " (a quote of another record)")
    elif "merkle_root" in binding:
        try:
            root = _hex(binding.get("merkle_root"), "binding.merkle_root", 32)
            index, size = binding.get("leaf_index"), binding.get("tree_size")
            proof_hex = binding.get("inclusion_proof")
            if not isinstance(proof_hex, list):
                raise ValueError("binding.inclusion_proof is not a list")
            proof = [_hex(p, "binding.inclusion_proof[]", 32) for p in proof_hex]
        except ValueError as exc:
            fail("evidence_malformed", str(exc))
            raise _Stop from None
        if attest.extra_data != root:
            fail("evidence_nonce_mismatch",
                 f"the quote's qualifyingData {attest.extra_data.hex()[:16]}… is not the batch root {root.hex()[:16]}…")
        # What this proves: the capsule id is a leaf of the quoted root. The
        # quote covers the root only (qualifyingData = the root),
        # so leaf_index and tree_size are the writer's claim, not the TPM's:
        # other (index, size) pairs with the same proof can verify too. A
        # ledger's own batch row (hash-chained, checked by check_chain) holds
        # the real leaves; a lone slot's position and batch size are unproven.
        if not merkle.verify_inclusion(cid_raw, index, size, proof, root):  # type: ignore[arg-type]
            fail("evidence_inclusion_invalid",
                 f"the inclusion proof does not lead from this capsule's leaf (index {index} of {size}) to the quoted root")
    else:
        fail("evidence_malformed", "binding names neither capsule_id nor merkle_root")

    # ---- PCRs
    if not selection.same_as(attest.pcr_select):
        fail("evidence_pcr_selection_mismatch",
             f"recorded selection {selection} is not the quoted one "
             f"({'+'.join(f'{b.hash_name}:{list(b.pcrs)}' for b in attest.pcr_select)})")
    else:
        try:
            digest = pcr_digest(selection, pcr_values, hash_name)
        except (KeyError, ValueError, TypeError) as exc:
            fail("evidence_pcr_mismatch", f"the recorded PCR values are incomplete or not hex ({exc})")
        else:
            if digest != attest.pcr_digest:
                fail("evidence_pcr_mismatch", "the recorded PCR values do not hash to the quoted pcrDigest")
    weak = pcrs_only_in_sha1(attest.pcr_select)  # what the TPM signed, whatever the slot records
    if weak:
        fail("evidence_pcr_weak_hash",
             f"PCR(s) {weak} are quoted only from the SHA-1 bank, which does not pin what was measured "
             "(SHA-1 collisions); quote them from sha256 too")

    # ---- trust, and what kind of device: hardware only when the relying
    # party's own enrollment says so (a pin enrolled as hardware); an EK chain
    # in the slot is checked but never upgrades the claim (it is not bound to the AK)
    if policy is None:
        fail("evidence_ak_not_pinned", "no trust policy: the quote is self-consistent, but nothing says whose AK this is",
             "warning")
        return
    if pin is None:
        fail("evidence_ak_untrusted", f"AK {ak_name.hex()[:20]}… is not in the trust policy")
        return
    ek_ok = _check_ek(ev, policy, fail)
    if pin.software is True:  # the enrollment says software: nothing in the slot can raise it
        fail("evidence_software_tpm", f"the AK is pinned as a software TPM's{f' ({pin.label})' if pin.label else ''}", "info")
    elif is_software_device(ev.get("device")):
        fail("evidence_software_tpm", "the quote comes from a software TPM (swtpm), or the device does not say it is hardware",
             "info")
    elif pin.software is not False:
        chain = "; the slot's EK chain is valid, but it tells the TPM's make and is not bound to this AK" if ek_ok else ""
        fail("evidence_software_tpm",
             "reported as a software TPM: the device strings say hardware, but they are producer-reported and unsigned, "
             f"and this AK is not enrolled as hardware (--ak-hardware){chain}", "info")
    else:
        fail("evidence_hardware_by_enrollment",
             "hardware because the relying party enrolled this AK as a hardware TPM's"
             f"{f' ({pin.label})' if pin.label else ''}; the slot's device strings are unsigned and could only have "
             "lowered it", "info")


def _signature_ok(key: Any, sig: tpmwire.Signature, data: bytes, hash_name: str) -> bool:
    algo = _HASHES[hash_name]
    try:
        if sig.sig_alg == tpmwire.ALG.ECDSA and isinstance(key, ec.EllipticCurvePublicKey):
            key.verify(sig.der, data, ec.ECDSA(algo))
        elif sig.sig_alg == tpmwire.ALG.RSASSA and isinstance(key, rsa.RSAPublicKey):
            key.verify(sig.raw, data, padding.PKCS1v15(), algo)
        elif sig.sig_alg == tpmwire.ALG.RSAPSS and isinstance(key, rsa.RSAPublicKey):
            key.verify(sig.raw, data, padding.PSS(padding.MGF1(algo), algo.digest_size), algo)
        else:
            return False
    except (InvalidSignature, ValueError):
        return False
    return True


def _check_ek(ev: Mapping[str, Any], policy: TrustPolicy, fail: Any) -> bool:
    """An EK chain (leaf first, b64 DER) up to one of ``policy.ek_roots``;
    True only when one is present and valid: its first certificate an
    end-entity certificate (not a CA: a chain of just the public root names
    no TPM at all), each issued by the next, the last issued by (or equal to)
    a trusted root.

    It tells the TPM's make, not that the AK lives in it: that binding is the
    relying party's enrollment (credential activation), which is why only an
    AK pinned as hardware gives ``verified``. swtpm here has no EK certificate.
    """
    chain_b64 = ev.get("ek_certificates")
    if not chain_b64:
        if policy.require_ek_chain:
            fail("evidence_ek_chain_invalid", "the trust policy requires an EK certificate chain; the evidence has none")
        return False
    if not policy.ek_roots:
        # Without roots nothing can check the chain; a required chain that
        # cannot be checked is not a valid one (it could be anything).
        if policy.require_ek_chain:
            fail("evidence_ek_chain_invalid",
                 "the trust policy requires an EK certificate chain but names no EK roots to check it against")
        return False
    try:
        chain = [x509.load_der_x509_certificate(base64.b64decode(c, validate=True)) for c in chain_b64]
    except Exception as exc:  # noqa: BLE001
        fail("evidence_ek_chain_invalid", f"ek_certificates cannot be read: {exc}")
        return False
    if _is_ca(chain[0]) or any(chain[0] == root for root in policy.ek_roots):
        fail("evidence_ek_chain_invalid", "the EK chain has no EK certificate: its first certificate is a CA")
        return False
    for child, parent in zip(chain, chain[1:]):
        if not _issued_by(child, parent):
            fail("evidence_ek_chain_invalid", f"{child.subject.rfc4514_string()} is not signed by the next certificate")
            return False
    if not any(_issued_by(chain[-1], root) or chain[-1] == root for root in policy.ek_roots):
        fail("evidence_ek_chain_invalid", "the EK chain does not end at a trusted root")
        return False
    return True


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False
    except ValueError:  # a malformed extension: not an end-entity certificate we can read
        return True


def _issued_by(child: x509.Certificate, parent: x509.Certificate) -> bool:
    try:
        child.verify_directly_issued_by(parent)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True
