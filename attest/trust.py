"""Which attestation keys a verifier trusts: the relying party's policy.

Why a policy and not "the AK in the evidence": the evidence carries its own AK,
and anyone can make a self-consistent quote with a key they hold in software.
What makes a quote mean "this TPM" is that the relying party enrolled the AK
(pinned its public key or TPM name) — or, with a real TPM, that the TPM's EK
certificate chains to a manufacturer root the relying party accepts.

``TrustPolicy.coerce`` accepts what callers naturally have: PEM bytes/str of
AK public keys (``capseal verify --ak ak.pem``), hex TPM names, ``cryptography``
public keys, :class:`PinnedAK` entries, or a :class:`TrustPolicy`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from capseal.canonical import hex_bytes

__all__ = ["PinnedAK", "TrustPolicy"]



def _spki(key: Any) -> bytes:
    return bytes(key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo))


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
        data = pem.encode() if isinstance(pem, str) else pem
        return cls(spki=_spki(serialization.load_pem_public_key(data)), **kw)

    @classmethod
    def from_key(cls, key: Any, **kw: Any) -> PinnedAK:
        return cls(spki=_spki(key), **kw)


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
        """The pinned entry this AK matches, by public key or TPM name."""
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
        """A policy from what the caller passed (None stays None: no policy)."""
        if trust is None or isinstance(trust, TrustPolicy):
            return trust
        if isinstance(trust, (bytes, str, PinnedAK)) or hasattr(trust, "public_bytes") or hasattr(trust, "public_pem"):
            trust = [trust]
        if not isinstance(trust, Iterable):
            raise TypeError(f"cannot make a trust policy from {type(trust).__name__}")
        return cls(tuple(_pin(item) for item in trust))


def _pin(item: Any) -> PinnedAK:
    if isinstance(item, PinnedAK):
        return item
    if hasattr(item, "public_pem") and hasattr(item, "name"):  # an AKIdentity / AttestationKey
        return PinnedAK.from_pem(item.public_pem, name=item.name, qualified_name=getattr(item, "qualified_name", None))
    if isinstance(item, bytes) and b"-----BEGIN" in item or isinstance(item, str) and "-----BEGIN" in item:
        return PinnedAK.from_pem(item)
    if hex_bytes(item) is not None and len(item) in (68, 100, 132):
        return PinnedAK(name=item.lower())
    if hasattr(item, "public_bytes"):
        return PinnedAK.from_key(item)
    raise TypeError(f"not an AK pin: {type(item).__name__}")
