"""Which attestation keys a verifier trusts: the relying party's policy.

Why a policy and not "the AK in the evidence": the evidence carries its own AK,
and anyone can make a self-consistent quote with a key they hold in software.
What makes a quote mean "this TPM" is that the relying party enrolled the AK
(pinned its public key or TPM name) — or, with a real TPM, that the TPM's EK
certificate chains to a manufacturer root the relying party accepts.

``TrustPolicy.coerce`` accepts what callers naturally have: PEM bytes/str of
AK public keys (``capseal verify --ak ak.pem``), hex TPM names, ``cryptography``
public keys, the result of ``capseal tpm provision`` (its JSON, a mapping),
:class:`PinnedAK` entries, or a :class:`TrustPolicy`.

Hardware or software. What a slot's ``device`` strings say is unsigned, so it
may only lower the claim. What raises it is the relying party's enrollment: a
pin with ``software=False``. :meth:`PinnedAK.from_provisioning` carries what
provisioning read from the TPM itself into the pin (``software_device``): an
AK provisioned in a software TPM is pinned as software, and cannot be enrolled
as hardware at all, whatever a slot says later.

Anything else is refused with :class:`~capseal.errors.InputError` naming what
is wrong (not PEM, a private key, a key type no TPM AK has, an argument of the
wrong type): a pin that can never match would only make every quote
``evidence_ak_untrusted`` later, with the real mistake out of sight. The
message never echoes the input (a private key pasted by mistake is a secret).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from capseal.canonical import hex_bytes
from capseal.errors import InputError

__all__ = ["PinnedAK", "TrustPolicy"]



def _spki(key: Any) -> bytes:
    """The DER SubjectPublicKeyInfo of an AK public key; InputError for
    anything else. Why only RSA and ECC: a TPM AK is one of the two (and the
    verifier checks quote signatures of no other kind), so a pinned Ed25519 or
    DSA key could never match a quote."""
    if hasattr(key, "private_bytes"):  # any cryptography private key
        raise InputError(f"an AK pin is a public key, not a private key ({type(key).__name__})")
    if not isinstance(key, (rsa.RSAPublicKey, ec.EllipticCurvePublicKey)):
        what = "key" if hasattr(key, "public_bytes") else "object"
        raise InputError(f"an AK pin is an RSA or ECC public key (what a TPM AK is), not a {type(key).__name__} {what}")
    return bytes(key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo))


def _load_pem(pem: Any) -> Any:
    """A public key from PEM text or bytes; InputError naming what is wrong,
    without the input itself."""
    if isinstance(pem, str):
        try:
            data = pem.encode()
        except UnicodeEncodeError:
            raise InputError("an AK pin's PEM text is not encodable as UTF-8 (a lone surrogate)") from None
    elif isinstance(pem, (bytes, bytearray, memoryview)):
        data = bytes(pem)
    else:
        raise InputError(f"an AK pin's PEM is text or bytes, not {type(pem).__name__}")
    if b"PRIVATE KEY-----" in data:
        raise InputError("an AK pin is a public key; this PEM holds a private key (not used, not echoed)")
    try:
        return serialization.load_pem_public_key(data)
    except UnsupportedAlgorithm as exc:  # e.g. an EC curve cryptography does not know
        raise InputError(f"an AK pin's PEM holds a public key of a type capseal cannot use ({exc})") from None
    except ValueError:  # cryptography's message only says the bytes are not a PEM public key
        raise InputError("an AK pin's PEM is not a PEM public key (-----BEGIN PUBLIC KEY-----, SubjectPublicKeyInfo)") from None


@dataclass(frozen=True)
class PinnedAK:
    """One enrolled AK. ``spki`` is its DER SubjectPublicKeyInfo; ``name`` and
    ``qualified_name`` (hex), when known, pin it further; ``software`` is what
    the relying party knows from enrolling the AK: ``False`` = a hardware TPM
    (the only way to get the status ``verified``: enrol an AK as hardware
    only after binding it to the TPM's EK, e.g. by credential activation),
    ``True`` = software, ``None`` = not said (reported as software)."""

    spki: bytes | None = None
    name: str | None = None
    qualified_name: str | None = None
    software: bool | None = None
    label: str = ""

    @classmethod
    def from_pem(cls, pem: bytes | str, **kw: Any) -> PinnedAK:
        """A pin of the RSA or ECC public key in a PEM.

        Args:
            pem: the PEM (a public key or a certificate).
            kw: the pin's other fields (``name``, ``qualified_name``, ``software``, ``label``).

        Returns:
            The pin.

        Raises:
            InputError: the PEM holds no RSA or ECC public key.
        """
        return cls(spki=_spki(_load_pem(pem)), **kw)

    @classmethod
    def from_key(cls, key: Any, **kw: Any) -> PinnedAK:
        """A pin of a ``cryptography`` public key.

        Args:
            key: an RSA or ECC public key.
            kw: the pin's other fields.

        Returns:
            The pin.

        Raises:
            InputError: another kind of key (a private key among them).
        """
        return cls(spki=_spki(key), **kw)

    @classmethod
    def from_provisioning(cls, result: Any, *, hardware: bool = False) -> PinnedAK:
        """A pin of the AK in a provisioning result (what ``capseal tpm
        provision`` prints, or an enrollment of the same form:
        ``{"attestation_key": {"public_key_pem", "name"?}, "software_device"}``),
        carrying what provisioning found about the TPM.

        Args:
            result: the provisioning result (a mapping, e.g. its parsed JSON).
            hardware: enrol the AK as a hardware TPM's (the only way to the
                status ``verified``). Do so only after binding the AK to the
                TPM's EK (e.g. by credential activation).

        Returns:
            The pin: public key and TPM name from the result; ``software=True``
            when provisioning found a software TPM, ``False`` when ``hardware``
            was asked for and provisioning found hardware, else ``None``.

        Raises:
            InputError: the result holds no AK public key, or ``hardware`` was
                asked for an AK whose TPM provisioning found to be software
                (``software_device: true``) or could not tell (absent/null).
        """
        if not isinstance(result, Mapping) or not isinstance(result.get("attestation_key"), Mapping):
            raise InputError("a provisioning result is an object with attestation_key {public_key_pem, name} and "
                             "software_device (what capseal tpm provision prints)")
        ak = result["attestation_key"]
        name = ak.get("name")
        if name is not None and (hex_bytes(name) is None or len(name) not in (68, 100, 132)):
            raise InputError("the provisioning result's attestation_key.name is not a TPM name in hex")
        software_device = result.get("software_device")
        if software_device not in (True, False, None):
            raise InputError("the provisioning result's software_device is true, false or absent")
        if hardware and software_device is not False:
            said = ("found a software TPM (software_device: true)" if software_device is True
                    else "could not tell whether the TPM is hardware (no software_device)")
            raise InputError(f"this AK cannot be enrolled as a hardware TPM's: its provisioning {said}; "
                             "pin it as software (--ak)")
        software = True if software_device is True else False if hardware else None
        tcti = result.get("tcti")
        label = f"provisioned on {tcti}" if isinstance(tcti, str) else "provisioned"
        return cls.from_pem(ak.get("public_key_pem"), name=name.lower() if isinstance(name, str) else None,
                            software=software, label=label)


@dataclass(frozen=True)
class TrustPolicy:
    """Pinned AKs, plus (for real TPMs) EK roots. An EK chain in a slot is
    checked against ``ek_roots`` when present, but never makes a quote
    ``verified`` (it is not bound to the AK); ``require_ek_chain`` makes a
    quote without a valid EK chain fail even when its AK is pinned."""

    aks: tuple[PinnedAK, ...] = ()
    ek_roots: tuple[x509.Certificate, ...] = field(default=(), compare=False)
    require_ek_chain: bool = False

    def match(self, spki: bytes, name: str) -> PinnedAK | None:
        """The pinned entry an AK matches, by public key and/or TPM name.

        Args:
            spki: the AK's DER SubjectPublicKeyInfo.
            name: its TPM name, hex.

        Returns:
            The first matching pin, or None.
        """
        for pin in self.aks:
            if pin.spki is not None and pin.spki != spki:
                continue
            if pin.name is not None and pin.name.lower() != name.lower():
                continue
            if pin.spki is None and pin.name is None:
                continue
            return pin
        return None

    @classmethod
    def coerce(cls, trust: Any) -> TrustPolicy | None:
        """A policy from what a caller passed.

        Args:
            trust: None (no policy), a TrustPolicy, a PinnedAK, a PEM, a
                ``cryptography`` key, a TPM name, a provisioning result, or a list of them.

        Returns:
            The policy (None stays None).

        Raises:
            InputError: anything that is not one of those forms.
        """
        if trust is None or isinstance(trust, TrustPolicy):
            return trust
        if isinstance(trust, Mapping) and "attestation_key" in trust:  # one provisioning result
            trust = [trust]
        if isinstance(trust, (bytes, str, PinnedAK)) or any(hasattr(trust, a) for a in ("public_bytes", "private_bytes", "public_pem")):
            trust = [trust]  # one pin (a private key: to be refused as one)
        if not isinstance(trust, Iterable) or isinstance(trust, Mapping):
            raise InputError(f"cannot make a trust policy from {type(trust).__name__}: pass AK public keys (PEM or "
                             "cryptography keys), TPM names (hex), PinnedAK entries, a list of them, or a TrustPolicy")
        return cls(tuple(_pin(item, i) for i, item in enumerate(trust)))


def _pin(item: Any, index: int) -> PinnedAK:
    where = f"trust policy entry {index}"
    try:
        if isinstance(item, PinnedAK):
            return item
        if isinstance(item, Mapping):
            return PinnedAK.from_provisioning(item)
        if hasattr(item, "public_pem") and hasattr(item, "name"):  # an AKIdentity / AttestationKey
            return PinnedAK.from_pem(item.public_pem, name=item.name, qualified_name=getattr(item, "qualified_name", None))
        if isinstance(item, bytes) and b"-----BEGIN" in item or isinstance(item, str) and "-----BEGIN" in item:
            return PinnedAK.from_pem(item)
        if hex_bytes(item) is not None and len(item) in (68, 100, 132):
            return PinnedAK(name=item.lower())
        if hasattr(item, "public_bytes") or hasattr(item, "private_bytes"):
            return PinnedAK.from_key(item)
    except InputError as exc:
        raise InputError(f"{where}: {exc}") from None
    if isinstance(item, (str, bytes)):  # its length only: the text itself is not echoed
        raise InputError(f"{where} ({type(item).__name__} of length {len(item)}) is neither a PEM public key nor a TPM "
                         "name in hex (68, 100 or 132 hex digits)")
    raise InputError(f"{where} is not an AK pin: {type(item).__name__}")
