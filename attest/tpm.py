"""The attestation key on a TPM, and quotes taken with it.

All TPM access goes through :class:`capseal.keys.tpm.TPMDevice`: one
worker thread per TCTI owns the ESAPI context, so a quote never races a
signature on the same TPM, swtpm's three transient slots are not exhausted
(the AK is persistent; nothing transient is loaded), and a restarted TPM is
reconnected to on the next call.

The AK is named by a ``tpm2:`` URI, as the signing keys are::

    tpm2:handle=0x81000102?tcti=swtpm:host=127.0.0.1,port=2321

It must be a restricted, fixedTPM signing key (``capseal tpm provision``
creates one from the ``ecc256:ecdsa-sha256:null`` template); anything else is
refused, since only a restricted key makes TPM_GENERATED_VALUE meaningful.
An AK whose signing scheme hashes with SHA-1 is refused too, and so is a PCR
selection with a PCR only in the SHA-1 bank: the verifier refuses quotes made
so (``evidence_signature_weak_hash``, ``evidence_pcr_weak_hash``), and capseal
never takes a quote it would refuse.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives import serialization

from capseal.errors import CapsealError, EvidenceError, KeyURIError

from . import tpmwire
from .evidence import AKIdentity, PCRSelection, Quote, rfc3339_ms

__all__ = ["AKRef", "parse_ak_uri", "AttestationKey"]



@dataclass(frozen=True)
class AKRef:
    """A parsed ``tpm2:`` URI naming a persistent AK."""

    handle: int
    tcti: str

    def uri(self) -> str:
        """The AK's URI.

        Returns:
            ``tpm2:handle=0x…?tcti=…`` in canonical form.
        """
        from capseal.keys.tpm import TPMKeyURI

        return TPMKeyURI(tcti=self.tcti, handle=self.handle).to_uri()


def parse_ak_uri(uri: str) -> AKRef:
    """Read an AK's URI. The grammar is the signing keys'
    (:func:`capseal.keys.tpm.parse_tpm_uri`: unknown or repeated attributes
    are refused, the TCTI keeps its own ``:``, ``,`` and ``=``).

    Args:
        uri: ``tpm2:handle=0x81000102?tcti=…``.

    Returns:
        The handle and TCTI.

    Raises:
        KeyURIError: a malformed URI, or one that names no persistent handle.
    """
    from capseal.keys.tpm import parse_tpm_uri

    ref = parse_tpm_uri(uri)
    if ref.handle is None:
        raise KeyURIError(f"{uri}: an attestation key is named by handle=0x81…… (a persistent handle)")
    return AKRef(ref.handle, ref.tcti)


def _device(tcti: str) -> Any:
    from capseal.keys.tpm import get_device

    return get_device(tcti)


class AttestationKey:
    """A persistent AK on a TPM. ``identity`` is what a relying party pins:
    the public key (PEM), the TPM name and the qualified name, plus the device
    as the TPM reports it (``software: True`` for swtpm)."""

    def __init__(self, uri: str | AKRef, *, device: Any = None, timeout: float | None = 60.0) -> None:
        """``timeout``: seconds one TPM command may take before the TPM is
        taken to hang (EvidenceError naming it; the job is abandoned), as
        for a TPM signer; None waits for ever."""
        self.ref = uri if isinstance(uri, AKRef) else parse_ak_uri(uri)
        self.device = device if device is not None else _device(self.ref.tcti)
        self.timeout = timeout
        self.identity = self._read_identity()

    def __repr__(self) -> str:
        return f"AttestationKey({self.ref.uri()!r}, name={self.identity.name[:16]}…)"

    # ------------------------------------------------------------------ identity

    @property
    def public_pem(self) -> str:
        """The AK's public key as PEM (what a relying party pins)."""
        return self.identity.public_pem

    @property
    def name(self) -> str:
        """The AK's TPM name, hex."""
        return self.identity.name

    @property
    def qualified_name(self) -> str:
        """The AK's qualified name, hex (the qualifiedSigner quotes carry)."""
        return self.identity.qualified_name

    @property
    def software(self) -> bool:
        """Whether the AK's TPM is (or may be) software."""
        return self.identity.software

    def _handle(self, ectx: Any) -> Any:
        handle = self.ref.handle
        from capseal.keys.tpm import persistent_tr  # asks first: a missing AK prints nothing to stderr

        return self.device.memo(("capseal.attest.ak", handle),
                                lambda e: persistent_tr(e, handle, self.ref.tcti, "attestation key"))

    def _read_identity(self) -> AKIdentity:
        def read(ectx: Any) -> tuple[bytes, bytes, bytes]:
            pub, name, qname = ectx.read_public(self._handle(ectx))
            return bytes(pub.publicArea.marshal()), bytes(name), bytes(qname)

        try:
            tpmt, name, qname = self.device.call(read, what=f"reading AK 0x{self.ref.handle:08x}", timeout=self.timeout)
            info = self.device.info()
        except CapsealError as exc:
            raise EvidenceError(f"cannot read attestation key {self.ref.uri()}: {exc}") from None
        try:
            area = tpmwire.parse_public(tpmt)
        except tpmwire.WireError as exc:
            raise EvidenceError(f"{self.ref.uri()}: the AK's public area cannot be read ({exc})") from None
        if not area.is_restricted_signing_key:
            raise EvidenceError(
                f"{self.ref.uri()} is not an attestation key: it must be a restricted, fixedTPM signing key",
                hint="Create one with `capseal tpm provision` (template ecc256:ecdsa-sha256:null).",
            )
        if area.scheme_hash == tpmwire.ALG.SHA1:
            raise EvidenceError(
                f"{self.ref.uri()}: the AK's signing scheme hashes with SHA-1; verifiers refuse SHA-1 quote signatures",
                hint="Create one with `capseal tpm provision` (template ecc256:ecdsa-sha256:null).",
            )
        if area.name != name:
            raise EvidenceError(f"{self.ref.uri()}: the TPM's name for the AK does not match its public area")
        pem = area.public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        return AKIdentity(
            public_pem=pem.decode(),
            name=name.hex(),
            tpm_public=tpmt,
            qualified_name=qname.hex(),
            device=info.evidence_device(),
        )

    # ------------------------------------------------------------------ quoting

    def quote(self, nonce: bytes, selection: PCRSelection | str) -> Quote:
        """TPM2_Quote over ``selection`` with qualifyingData ``nonce`` and the
        PCR values read right after, in one job on the TPM's worker thread (no
        other capseal command runs in between). Not verified here: see
        :class:`capseal.attest.TPMQuoter`, which verifies before returning.

        Args:
            nonce: 1–64 bytes (a raw 32-byte capsule id or Merkle root).
            selection: the PCRs (``sha256:0-7`` or a PCRSelection).

        Returns:
            The quote.

        Raises:
            EvidenceError: a bad nonce, or the TPM did not quote.
            InputError: a bad or unquotable PCR selection.
        """
        if not isinstance(nonce, bytes) or not 0 < len(nonce) <= 64:
            raise EvidenceError("qualifyingData is 1–64 bytes (a raw 32-byte capsule id or Merkle root)")
        sel = PCRSelection.parse(selection)
        sel.check_quotable()

        def take(ectx: Any) -> tuple[bytes, bytes, dict[str, dict[str, str]]]:
            from tpm2_pytss.constants import TPM2_ALG
            from tpm2_pytss.types import TPML_PCR_SELECTION, TPMT_SIG_SCHEME

            attest, sig = ectx.quote(self._handle(ectx), TPML_PCR_SELECTION.parse(str(sel)), nonce,
                                     TPMT_SIG_SCHEME(scheme=TPM2_ALG.NULL))
            values: dict[str, dict[str, str]] = {}
            for bank in sel.banks:
                got = values.setdefault(bank.hash_name, {})
                for i in range(0, len(bank.pcrs), 8):  # TPML_DIGEST holds at most 8 values
                    chunk = bank.pcrs[i : i + 8]
                    _, out_sel, digests = ectx.pcr_read(
                        TPML_PCR_SELECTION.parse(f"{bank.hash_name}:{','.join(map(str, chunk))}"))
                    if out_sel.count != 1 or len(digests) != len(chunk):
                        raise EvidenceError(f"TPM {self.ref.tcti} did not return {bank.hash_name} PCRs {list(chunk)}")
                    for idx, d in zip(chunk, digests):
                        got[str(idx)] = bytes(d).hex()
            return bytes(attest), bytes(sig.marshal()), values

        try:
            attest, signature, values = self.device.call(take, what="TPM2_Quote", timeout=self.timeout)
        except CapsealError as exc:
            if isinstance(exc, EvidenceError):
                raise
            raise EvidenceError(f"TPM2_Quote with {self.ref.uri()} failed: {exc}") from None
        return Quote(attest=attest, signature=signature, pcr_selection=str(sel), pcr_values=values,
                     ak=self.identity, taken_at=rfc3339_ms())
