"""TPM2_Certify of a signing key by an attestation key.

Why: a custody statement that says ``fixedTPM`` is only the backend's word. A
TPM2_Certify signed by a restricted attestation key (AK) is the TPM's own
statement that an object with this *name* is loaded in it; the name is the
hash of the key's public area, and the public area holds both the public key
and the attributes (fixedTPM, fixedParent, sensitiveDataOrigin, …). A verifier
who trusts the AK (pinned after enrolling it, on real hardware by credential activation against the EK) can therefore
check that the signing key is TPM-resident, from the statement alone.

The record (custody statement member ``tpm_certify``)::

    {"kind": "tpm2-certify",
     "ak_handle": "0x81000102", "ak_public": PEM, "ak_name": hex, "ak_public_area": b64 TPM2B_PUBLIC,
     "key_name": hex, "key_public_area": b64 TPM2B_PUBLIC,
     "qualifying_data": hex,                  # SHA-256 of the key's DER SubjectPublicKeyInfo
     "attest": b64 TPMS_ATTEST, "signature": b64 TPMT_SIGNATURE}

It is verified with :func:`verify_certify` before it is recorded, and anyone
can run the same function later. swtpm AKs certify just as well; the custody
statement's ``software_device`` still says what the TPM is.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
from tpm2_pytss import TSS2_Exception
from tpm2_pytss.constants import TPM2_ALG, TPM2_GENERATED, TPM2_ST, TPMA_OBJECT
from tpm2_pytss.types import TPM2B_DATA, TPM2B_PUBLIC, TPMS_ATTEST, TPMT_SIG_SCHEME, TPMT_SIGNATURE

from capseal.errors import DeviceError, KeyNotFoundError, SignatureFailedError

from ._uri import format_handle

__all__ = ["take_certify", "verify_certify", "spki_der", "AK_REQUIRED", "CERTIFY_KIND"]

CERTIFY_KIND = "tpm2-certify"

#: An AK must be a restricted signing key that cannot leave the TPM.
AK_REQUIRED = TPMA_OBJECT.RESTRICTED | TPMA_OBJECT.SIGN_ENCRYPT | TPMA_OBJECT.FIXEDTPM | TPMA_OBJECT.FIXEDPARENT
_HASHES = {int(TPM2_ALG.SHA256): hashes.SHA256, int(TPM2_ALG.SHA384): hashes.SHA384}


def spki_der(public_key: Any) -> bytes:
    """A public key's DER SubjectPublicKeyInfo.

    Args:
        public_key: a ``cryptography`` public key.

    Returns:
        The DER bytes.
    """
    der: bytes = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return der


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def take_certify(ectx: Any, key_tr: Any, key_public: TPM2B_PUBLIC, ak_tr: Any, ak_handle: int,
                 public_key: Any, tcti: str) -> dict[str, Any]:
    """Run TPM2_Certify(key, AK) and return the verified record. Runs on the TPM
    worker thread.

    Args:
        ectx: the ESAPI context.
        key_tr: the signing key's ESYS_TR.
        key_public: its public area.
        ak_tr: the AK's ESYS_TR.
        ak_handle: the AK's persistent handle.
        public_key: the signing key's ``cryptography`` public key.
        tcti: the TPM, named in errors.

    Returns:
        The ``tpm2-certify`` record (see the module docstring).

    Raises:
        KeyNotFoundError: the AK is missing.
        DeviceError: the AK is not a restricted signing key.
        SignatureFailedError: the TPM's answer does not verify.
    """
    try:
        ak_public, _ak_name, _ = ectx.read_public(ak_tr)
    except TSS2_Exception as exc:
        raise KeyNotFoundError(f"no attestation key at {format_handle(ak_handle)} on TPM {tcti}: {exc}") from None
    attrs = ak_public.publicArea.objectAttributes
    if (attrs & AK_REQUIRED) != AK_REQUIRED or attrs & TPMA_OBJECT.DECRYPT:
        raise DeviceError(f"the key at {format_handle(ak_handle)} on TPM {tcti} is not a restricted signing key "
                          f"(attributes {attrs}); an attestation key must be restricted|sign|fixedTPM|fixedParent")
    qualifying = hashlib.sha256(spki_der(public_key)).digest()
    attest, signature = ectx.certify(key_tr, ak_tr, TPM2B_DATA(qualifying), TPMT_SIG_SCHEME(scheme=TPM2_ALG.NULL))
    record = {
        "kind": CERTIFY_KIND,
        "ak_handle": format_handle(ak_handle),
        "ak_public": ak_public.to_pem().decode("ascii"),
        "ak_name": bytes(ak_public.get_name()).hex(),
        "ak_public_area": _b64(ak_public.marshal()),
        "key_name": bytes(key_public.get_name()).hex(),
        "key_public_area": _b64(key_public.marshal()),
        "qualifying_data": qualifying.hex(),
        "attest": _b64(bytes(attest)),
        "signature": _b64(signature.marshal()),
    }
    problems = verify_certify(record, public_key=public_key)
    if problems:
        raise SignatureFailedError(f"TPM {tcti} returned a TPM2_Certify that does not verify: {'; '.join(problems)}")
    return record


def verify_certify(record: Any, *, public_key: Any = None, trusted_ak_names: Any = None) -> list[str]:
    """Check a ``tpm2-certify`` record. Never raises: a malformed record is a
    problem in the list. (:func:`capseal.keys.verify_certify` also takes a
    PEM and checks its arguments without tpm2-pytss.)

    Checks: the AK public area hashes to ``ak_name`` and is a restricted
    signing key; its PEM is that public area's key; the signature by the AK
    over the attest bytes; ``magic`` = TPM_GENERATED_VALUE; type =
    TPM_ST_ATTEST_CERTIFY; ``extraData`` = ``qualifying_data`` = SHA-256 of the
    key's SPKI; the certified name = ``key_name`` = the hash of
    ``key_public_area``, whose key is ``public_key`` (when given) and whose
    attributes include fixedTPM and fixedParent.

    Args:
        record: the record (a custody statement's ``tpm_certify``).
        public_key: the ``cryptography`` public key the record must be about (None: any).
        trusted_ak_names: hex TPM names of the AKs enrolled; an AK not among
            them is a problem (None: not checked against a list).

    Returns:
        The problems found, each a sentence (empty: verified).
    """
    problems: list[str] = []
    try:
        _verify(record, public_key, trusted_ak_names, problems)
    except Exception as exc:  # a malformed record is a finding, not a crash
        problems.append(f"malformed certify record: {type(exc).__name__}: {exc}")
    return problems


def _verify(record: Any, public_key: Any, trusted_ak_names: Any, problems: list[str]) -> None:
    if not isinstance(record, dict) or record.get("kind") != CERTIFY_KIND:
        problems.append(f"not a {CERTIFY_KIND} record")
        return
    ak_area = _public_area(record["ak_public_area"])
    if bytes(ak_area.get_name()).hex() != record["ak_name"]:
        problems.append("ak_public_area does not hash to ak_name")
    ak_attrs = ak_area.publicArea.objectAttributes
    if (ak_attrs & AK_REQUIRED) != AK_REQUIRED or ak_attrs & TPMA_OBJECT.DECRYPT:
        problems.append(f"the AK is not a restricted signing key ({ak_attrs})")
    ak_key = serialization.load_der_public_key(ak_area.to_der())
    pem_key = serialization.load_pem_public_key(record["ak_public"].encode("ascii"))
    if spki_der(ak_key) != spki_der(pem_key):
        problems.append("ak_public is not the key in ak_public_area")
    if trusted_ak_names is not None and record["ak_name"] not in set(trusted_ak_names):
        problems.append(f"AK {record['ak_name']} is not a trusted attestation key")
    attest_bytes = base64.b64decode(record["attest"])
    sig, _ = TPMT_SIGNATURE.unmarshal(base64.b64decode(record["signature"]))
    if not _signature_ok(ak_key, sig, attest_bytes):
        problems.append("the AK's signature over the attest bytes does not verify")
    attest, used = TPMS_ATTEST.unmarshal(attest_bytes)
    if used != len(attest_bytes):
        problems.append("trailing bytes after TPMS_ATTEST")
    if int(attest.magic) != int(TPM2_GENERATED.VALUE):
        problems.append("attest magic is not TPM_GENERATED_VALUE")
    if int(attest.type) != int(TPM2_ST.ATTEST_CERTIFY):
        problems.append(f"attest type is 0x{int(attest.type):x}, not TPM_ST_ATTEST_CERTIFY")
    if bytes(attest.extraData).hex() != record["qualifying_data"]:
        problems.append("attest extraData is not qualifying_data")
    certified_name = bytes(attest.attested.certify.name).hex()
    if certified_name != record["key_name"]:
        problems.append("the certified name is not key_name")
    key_area = _public_area(record["key_public_area"])
    if bytes(key_area.get_name()).hex() != record["key_name"]:
        problems.append("key_public_area does not hash to key_name")
    area_key = serialization.load_der_public_key(key_area.to_der())
    if hashlib.sha256(spki_der(area_key)).hexdigest() != record["qualifying_data"]:
        problems.append("qualifying_data is not SHA-256 of the certified key's SubjectPublicKeyInfo")
    if public_key is not None and spki_der(public_key) != spki_der(area_key):
        problems.append("the certified key is not this signer's public key")
    attrs = key_area.publicArea.objectAttributes
    need = TPMA_OBJECT.FIXEDTPM | TPMA_OBJECT.FIXEDPARENT
    if (attrs & need) != need:
        problems.append(f"the certified key is not fixedTPM|fixedParent ({attrs})")


def _public_area(b64: str) -> TPM2B_PUBLIC:
    raw = base64.b64decode(b64, validate=True)
    area, used = TPM2B_PUBLIC.unmarshal(raw)
    if used != len(raw):
        raise ValueError("trailing bytes after TPM2B_PUBLIC")
    return area


def _signature_ok(ak_key: Any, sig: TPMT_SIGNATURE, data: bytes) -> bool:
    if int(sig.sigAlg) != int(TPM2_ALG.ECDSA) or not isinstance(ak_key, ec.EllipticCurvePublicKey):
        return False
    hash_cls = _HASHES.get(int(sig.signature.ecdsa.hash))
    if hash_cls is None:
        return False
    r = int.from_bytes(bytes(sig.signature.ecdsa.signatureR), "big")
    s = int.from_bytes(bytes(sig.signature.ecdsa.signatureS), "big")
    try:
        ak_key.verify(encode_dss_signature(r, s), data, ec.ECDSA(hash_cls()))
    except InvalidSignature:
        return False
    return True
