"""The signatures of a ledger's records: the keys a verifier knows
(:class:`KeyDirectory`: caller-trusted keys, and the keys custody
statements introduce), each capsule's envelopes checked under them, and
what a custody statement's TPM2_Certify says. Never raises.
(Public through :mod:`capseal.audit`.)
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any

from cryptography.hazmat.primitives import serialization

from .canonical import capsule_id, hex_bytes
from .envelope import PLAIN, PROFILE, verify_cose_sign1
from .envelope import verify_profile_envelope as _verify_profile_envelope
from .findings import Finding
from .trust import trusted_keys

__all__ = ["KeyDirectory", "not_pinned", "check_signatures", "custody_of", "custody_findings"]


class KeyDirectory:
    """kid (hex) -> public key, from custody statements and caller-trusted keys.

    ``trusted`` is None when no trust anchor was given (every signature is
    then reported as not pinned), else the set of pinned kids.

    Args:
        trusted: the keys the caller pins (public keys, PEMs, kids,
            :class:`capseal.trust.TrustedKey`); None or empty: no anchors.

    Raises:
        InputError: a trusted key that cannot be used (named).
    """

    def __init__(self, trusted: Iterable[Any] | None = ()) -> None:
        self._keys: dict[str, Any] = {}
        self.trusted: set[str] | None = None
        self.labels: dict[str, str] = {}
        pinned = trusted_keys(trusted) if trusted is not None else []  # None: no anchors, as ()
        if pinned:
            self.trusted = set()
            for key in pinned:
                if key.public_key is not None:
                    self._keys[key.kid] = key.public_key
                if key.label:
                    self.labels[key.kid] = key.label
                self.trusted.add(key.kid)

    def learn_from_custody(self, custody: Any) -> None:
        """Learn the public key a custody statement carries under its kid.

        A key whose kid is not the one stated, or that cannot be loaded, is
        not learnt; a key the caller gave is never replaced. Never raises.

        Args:
            custody: a custody statement (any value is accepted).
        """
        if not isinstance(custody, Mapping):
            return
        kid, spki = custody.get("kid"), custody.get("public_key")
        if not isinstance(kid, str) or not isinstance(spki, str):
            return
        try:
            from capseal.keys import kid_for

            key = serialization.load_der_public_key(bytes.fromhex(spki))
            if kid_for(key) != kid:  # a custody statement cannot introduce a key under another kid
                return
        except Exception:  # any bad key (cryptography's UnsupportedAlgorithm is no ValueError): none learnt
            return
        self._keys.setdefault(kid, key)  # a trusted key given by the caller is never replaced

    def get(self, kid: str) -> Any:
        """The public key known for ``kid``.

        Args:
            kid: the key id, lower-case hex.

        Returns:
            The public key, or None when none is known.
        """
        return self._keys.get(kid)

    def pinned(self, kid: str | None) -> bool:
        """Is ``kid`` one of the trusted keys?

        Args:
            kid: the key id, lower-case hex (None: not pinned).

        Returns:
            True only when trusted keys were given and ``kid`` is one of them.
        """
        return self.trusted is not None and kid in self.trusted


def not_pinned(signers: Iterable[str]) -> Finding:
    """The warning for a signature no trust anchor pins.

    Args:
        signers: the kids that signed (repeats are named once).

    Returns:
        A ``signer_not_pinned`` warning naming them.
    """
    return _not_pinned(tuple(dict.fromkeys(signers)))


@functools.lru_cache(maxsize=256)
def _not_pinned(signers: tuple[str, ...]) -> Finding:
    """:func:`not_pinned` for distinct kids: one (frozen) finding for every record the same keys signed."""
    kids = ", ".join(signers)
    return Finding("signer_not_pinned", f"signed by {kids}, which no trust anchor pins (no trusted keys were given): "
                   "the record is intact under that key, and nothing says whose key it is", severity="warning")


def custody_of(capsule: Mapping[str, Any]) -> Any:
    """The custody statement of an epoch-boundary capsule (the only place a
    producer writes one); None for any other capsule."""
    disposition = capsule.get("disposition")
    if not isinstance(disposition, Mapping) or disposition.get("verdict_class") != "epoch_boundary":
        return None
    ma = capsule.get("model_attestation")
    ca = ma.get("compute_attestation") if isinstance(ma, Mapping) else None
    return ca.get("x-capseal-key-custody") if isinstance(ca, Mapping) else None


def check_signatures(capsule: Mapping[str, Any], envelopes: list[Any], keys: KeyDirectory, *,
                     capsule_id_hex: str | None = None) -> tuple[str, str | None, list[Finding]]:
    """Verify a capsule record's inline profile envelope and its envelopes[].
    Returns (verdict, signer kid, findings). Never raises.

    Each signature is checked on its own (-05: a capsule has zero or more
    envelopes, each verifying by itself), and the verdict does not depend on
    their order: ``invalid`` if any fails, else ``authored`` if any verifies
    (the kid returned is a trusted one when trusted keys are given and one
    signed), else ``unverifiable`` if one names a key nobody gave us, else
    ``unclaimed``. Kids are returned in lower-case hex. ``capsule_id_hex``:
    the capsule's id when the caller has just computed it (else computed here)."""
    findings: list[Finding] = []
    try:
        cid = capsule_id_hex if capsule_id_hex is not None else capsule_id(capsule)
    except Exception as exc:
        return "invalid", None, [Finding("signature_uncheckable", f"capsule id cannot be computed: {exc}")]
    invalid, unverifiable = False, False
    signers: list[str] = []  # every kid whose signature verified, in order
    has_sig, has_kid = "signature" in capsule, "key_id" in capsule
    inline = hex_bytes(capsule.get("signature"))
    checked: dict[bytes, Any] = {}  # envelope bytes -> their result: the same envelope is verified once

    def verify_profile_envelope(cid: str, envelope: Any) -> Any:
        if not isinstance(envelope, bytes):
            return _verify_profile_envelope(cid, envelope)
        if envelope not in checked:
            checked[envelope] = _verify_profile_envelope(cid, envelope)
        return checked[envelope]

    if has_sig != has_kid:
        findings.append(Finding("envelope_malformed", "signature and key_id appear together or not at all"))
        invalid = True
    elif has_sig:
        result = verify_profile_envelope(cid, inline)
        key_id = hex_bytes(capsule.get("key_id"))
        if not result.ok:
            findings.extend(result.findings)
            invalid = True
        elif key_id is None or result.public_key != key_id:
            findings.append(Finding("key_id_mismatch", "key_id is not the key that signed the envelope"))
            invalid = True
        else:
            signers.append(key_id.hex())
    for i, env in enumerate(envelopes):
        if not isinstance(env, Mapping):
            findings.append(Finding("envelope_malformed", f"envelopes[{i}] is not an object"))
            invalid = True
            continue
        cose = hex_bytes(env.get("cose"))
        if cose is None:
            findings.append(Finding("envelope_malformed", f"envelopes[{i}].cose is not hex"))
            invalid = True
            continue
        profile, env_kid = env.get("profile"), hex_bytes(env.get("kid"))
        if profile == PROFILE:
            result = verify_profile_envelope(cid, cose)
            if not result.ok or result.public_key is None or result.public_key != env_kid:
                findings.extend(result.findings or [Finding("key_id_mismatch", f"envelopes[{i}].kid is not the signing key")])
                invalid = True
            elif has_sig and inline != cose:
                findings.append(Finding("envelope_inconsistent", f"envelopes[{i}] differs from the inline signature"))
                invalid = True
            else:
                signers.append(result.public_key.hex())
        elif profile == PLAIN:
            key = keys.get(env_kid.hex()) if env_kid is not None else None
            if key is None or env_kid is None:
                findings.append(Finding("signer_key_unknown", f"envelopes[{i}]: no public key known for kid {env.get('kid')}; pass it as a trusted key", severity="warning"))
                unverifiable = True
                continue
            result = verify_cose_sign1(cose, key, payload=bytes.fromhex(cid))
            if not result.ok:
                findings.extend(result.findings)
                invalid = True
            elif result.kid is not None and result.kid != env_kid:
                findings.append(Finding("key_id_mismatch", f"envelopes[{i}] protected kid differs from the record's kid"))
                invalid = True
            else:
                signers.append(env_kid.hex())
        else:
            findings.append(Finding("envelope_profile_unknown", f"envelopes[{i}].profile {profile!r} is not known", severity="warning"))
    verdict = "invalid" if invalid else "authored" if signers else "unverifiable" if unverifiable else "unclaimed"
    trusted_signers = [k for k in signers if keys.trusted is not None and k in keys.trusted]
    kid = (trusted_signers or signers)[0] if signers else None
    if keys.trusted is None:
        if verdict == "authored":
            findings.append(not_pinned(signers))
    else:
        if verdict == "authored" and not trusted_signers:
            findings.append(Finding("signer_not_trusted", f"signed by {', '.join(dict.fromkeys(signers))}, none of them "
                                    "among the trusted keys"))
        elif verdict in ("unclaimed", "unverifiable"):  # trusted keys were asked for: no signature by one is an error
            findings.append(Finding("signer_not_trusted", "trusted keys were given, but this capsule carries no signature "
                                    f"a trusted key makes (signature {verdict})"))
    return verdict, kid, findings


def custody_findings(custody: Any, keys: KeyDirectory) -> list[Finding]:
    """A custody statement's TPM2_Certify (the signing key certified by an AK)
    is re-verified here, not only when it was recorded. Never raises."""
    if not isinstance(custody, Mapping) or "tpm_certify" not in custody:
        return []
    try:
        from capseal.keys.tpm import verify_certify
    except ImportError as exc:
        return [Finding("custody_certify_unchecked", f"tpm2-pytss is needed to check the TPM2_Certify: {exc}", severity="warning")]
    kid = custody.get("kid")
    problems = verify_certify(custody["tpm_certify"], public_key=keys.get(kid) if isinstance(kid, str) else None)
    return [Finding("custody_certify_invalid", f"TPM2_Certify in the custody statement: {p}") for p in problems]
