"""capseal.attest.evidence — the filled evidence slot: a TPM2_Quote, what it covers and whose it is.

A slot is ``None`` until a quote is taken and verified; when filled it is::

    {"kind": "tpm2-quote",
     "binding": {"capsule_id": hex}                       # quote over this capsule's id
              | {"merkle_root": hex, "leaf_index": i,     # quote over an RFC 9162 root
                 "tree_size": n, "inclusion_proof": [hex, …]},
     "attest": b64 TPMS_ATTEST, "signature": b64 TPMT_SIGNATURE,
     "pcr_selection": "sha256:0,1,2,3,4,5,6,7", "pcr_values": {"sha256": {"0": hex, …}},
     "ak_public": PEM, "ak_name": hex, "ak_tpm_public": b64 TPMT_PUBLIC, "ak_qualified_name": hex,
     "device": {"manufacturer", "vendor", "firmware", "software": bool},
     "taken_at": RFC 3339,
     "tpm_clock": {"clock", "reset_count", "restart_count", "safe",
                   "firmware_version" (16 hex digits), "obfuscated": [...]}}

Why the extra AK members: ``ak_tpm_public`` lets a verifier recompute the AK's
TPM name and see that it is a *restricted* signing key (only then does
``TPM_GENERATED_VALUE`` mean the TPM made the structure); ``ak_qualified_name``
is what the TPM writes into every quote as ``qualifiedSigner``, so a quote made
by another TPM's key is told apart from a damaged signature. ``tpm_clock``
repeats what the attest says, as read: for an AK outside the endorsement and
platform hierarchies the TPM obfuscates resetCount, restartCount and
firmwareVersion, so they are listed under ``obfuscated`` and never compared
across quotes. ``device`` is read with TPM2_GetCapability by the producer and
is not signed: it can only lower a claim (``software: true``), never raise one.
"""

from __future__ import annotations

import base64
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from capseal.canonical import hex_bytes
from capseal.errors import InputError
from capseal.ledger import batch_slot

from . import tpmwire
from .tpmwire import PCRBank

__all__ = [
    "KIND",
    "DEFAULT_PCRS",
    "PCRSelection",
    "AKIdentity",
    "Quote",
    "evidence_for_capsule",
    "evidence_for_batch",
    "is_software_device",
    "pcr_digest",
    "pcrs_only_in_sha1",
    "rfc3339_ms",
]

KIND = "tpm2-quote"
DEFAULT_PCRS = "sha256:0,1,2,3,4,5,6,7"

#: Members an owner-hierarchy AK's quote carries obfuscated (TPM 2.0 Part 1 §36.7).
OBFUSCATED_COUNTS = ["firmware_version", "reset_count", "restart_count"]

_BANK = re.compile(r"^(sha1|sha256|sha384|sha512):([0-9,\-]+)$")


@dataclass(frozen=True)
class PCRSelection:
    """A PCR selection, written like tpm2-tools: ``sha256:0-7`` or
    ``sha256:0,1,2+sha1:0``. ``str()`` gives the canonical form stored in
    evidence (indices listed, ascending)."""

    banks: tuple[PCRBank, ...]

    @classmethod
    def parse(cls, text: str | PCRSelection) -> PCRSelection:
        """Read a PCR selection.

        Args:
            text: ``sha256:0-7``, ``sha256:0,1,2+sha1:0`` (or a PCRSelection, returned as it is).

        Returns:
            The selection, each bank's PCRs ascending.

        Raises:
            InputError: not such a string, a bank named twice, an unknown bank, or a
                PCR outside 0–23.
        """
        if isinstance(text, PCRSelection):
            return text
        if not isinstance(text, str) or not text:
            raise InputError("a PCR selection is a string like 'sha256:0-7'")
        banks: list[PCRBank] = []
        seen: set[str] = set()
        for part in text.split("+"):
            m = _BANK.match(part.strip())
            if not m or m.group(1) in seen:
                raise InputError(f"bad PCR selection {text!r}")
            seen.add(m.group(1))
            pcrs: set[int] = set()
            for item in m.group(2).split(","):
                lo, _, hi = item.partition("-")
                if not lo.isdigit() or (hi and not hi.isdigit()):
                    raise InputError(f"bad PCR selection {text!r}")
                start, stop = _pcr_index(lo, item, text), _pcr_index(hi or lo, item, text)
                if start > stop or stop > 23:
                    raise InputError(f"bad PCR range {item!r} in {text!r} (PCRs are 0–23)")
                pcrs.update(range(start, stop + 1))
            banks.append(PCRBank(tpmwire.HASH_ALGS[m.group(1)], tuple(sorted(pcrs))))
        return cls(tuple(banks))

    def __str__(self) -> str:
        return "+".join(f"{b.hash_name}:{','.join(str(i) for i in b.pcrs)}" for b in self.banks)

    def check_quotable(self) -> None:
        """Refuse a selection whose quote the verifier would refuse: a PCR selected
        only in the SHA-1 bank (:func:`pcrs_only_in_sha1`).

        Raises:
            InputError: naming those PCRs.
        """
        weak = pcrs_only_in_sha1(self.banks)
        if weak:
            raise InputError(f"PCR selection {self}: PCR(s) {weak} are selected only in the SHA-1 bank, which verifiers "
                             "refuse (a SHA-1 PCR does not pin what was measured); select them in sha256 too")

    def same_as(self, banks: tuple[PCRBank, ...]) -> bool:
        """Whether ``banks`` are this selection's (the bitmap size may differ).

        Args:
            banks: the banks a quote names.

        Returns:
            True for the same banks, in the same order, with the same PCRs.
        """
        return [(b.hash_alg, b.pcrs) for b in self.banks] == [(b.hash_alg, b.pcrs) for b in banks]


def pcrs_only_in_sha1(banks: tuple[PCRBank, ...]) -> list[int]:
    """The PCRs selected in the SHA-1 bank and in no other bank. Why refused (by
    the verifier as ``evidence_pcr_weak_hash``, and by the quoter before the
    TPM is asked): a SHA-1 PCR is a SHA-1 hash chain, and with SHA-1
    collisions two different measurement logs can end in the same SHA-1
    value, so the quote would not pin what ran. The same PCR quoted from a
    SHA-256 (or stronger) bank is extended with the same events and pins
    them; a SHA-1 bank beside it adds values, and takes nothing away.

    Args:
        banks: the selected banks.

    Returns:
        Those PCRs, ascending (empty: none; a quote over only the SHA-1 bank
        has every PCR here).
    """
    strong = {i for b in banks if b.hash_alg != tpmwire.ALG.SHA1 for i in b.pcrs}
    return sorted({i for b in banks if b.hash_alg == tpmwire.ALG.SHA1 for i in b.pcrs} - strong)


def _pcr_index(digits: str, item: str, text: str) -> int:
    """One PCR index of a selection (ASCII digits). Why not ``int()`` alone:
    past 4300 digits it raises a bare ValueError, and PCRSelection.parse
    promises InputError; an index of more than two significant digits is
    out of range (PCRs are 0–23) whatever its value."""
    significant = digits.lstrip("0") or "0"
    if len(significant) > 2:
        raise InputError(f"bad PCR range {item[:40]!r} in {text[:80]!r} (PCRs are 0–23)")
    return int(significant)


def pcr_digest(selection: PCRSelection, values: Mapping[str, Mapping[str, str]], hash_name: str) -> bytes:
    """The quote's pcrDigest: H(concatenation of the selected PCR values, banks
    in selection order, indices ascending), H being the signing scheme's hash.
    ``values`` must hold exactly the selected banks and PCRs, each the hex of
    one digest of its bank: the hash covers only the concatenation, so a
    value split differently (PCR 0 holding 64 bytes, PCR 1 none) or a PCR or
    bank nobody quoted would otherwise pass as quoted.

    Args:
        selection: the quoted selection.
        values: bank name → PCR index (str) → hex digest.
        hash_name: the signing scheme's hash (``sha256``, …).

    Returns:
        The digest.

    Raises:
        ValueError: ``values`` hold other banks or PCRs, or a value of the wrong size.
        KeyError: a selected value is missing.
    """
    import hashlib

    if not isinstance(values, Mapping) or set(values) != {b.hash_name for b in selection.banks}:
        raise ValueError("pcr_values must hold exactly the selected banks "
                         f"({', '.join(b.hash_name for b in selection.banks)})")
    h = hashlib.new(hash_name)
    for bank in selection.banks:
        bank_values = values[bank.hash_name]
        if not isinstance(bank_values, Mapping) or set(bank_values) != {str(i) for i in bank.pcrs}:
            raise ValueError(f"pcr_values[{bank.hash_name!r}] must hold exactly PCRs {list(bank.pcrs)}")
        size = hashlib.new(bank.hash_name).digest_size
        for i in bank.pcrs:
            value = hex_bytes(bank_values[str(i)])
            if value is None or len(value) != size:
                raise ValueError(f"pcr_values[{bank.hash_name!r}][{str(i)!r}] is not {size} bytes in hex")
            h.update(value)
    return h.digest()


def rfc3339_ms(t: float | None = None) -> str:
    """A time as the evidence's ``taken_at`` writes it.

    Args:
        t: seconds since the epoch (None: now).

    Returns:
        UTC RFC 3339 with milliseconds, e.g. ``2025-01-31T12:00:00.123Z``.
    """
    t = time.time() if t is None else t
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1000) % 1000:03d}Z"


@dataclass(frozen=True)
class AKIdentity:
    """Who signs quotes: the AK's public key and TPM names, and the device it
    was read from. What a relying party pins is ``public_pem`` (or ``name``)."""

    public_pem: str
    name: str  # hex TPM name (nameAlg || H(TPMT_PUBLIC))
    tpm_public: bytes  # marshaled TPMT_PUBLIC
    qualified_name: str  # hex; the qualifiedSigner the TPM writes into quotes
    device: Mapping[str, Any] = field(default_factory=dict)

    @property
    def software(self) -> bool:
        """Whether the AK's TPM is (or may be) software (see :func:`is_software_device`)."""
        return is_software_device(self.device)


@dataclass(frozen=True)
class Quote:
    """One TPM2_Quote as taken, with the PCR values read beside it."""

    attest: bytes
    signature: bytes  # marshaled TPMT_SIGNATURE
    pcr_selection: str
    pcr_values: Mapping[str, Mapping[str, str]]
    ak: AKIdentity
    taken_at: str

    def shared_members(self) -> dict[str, Any]:
        """Every evidence member except ``binding`` (the same for each record a
        batch quote covers, so it is built once per batch).

        Returns:
            The members, JSON values only.
        """
        a = tpmwire.parse_attest(self.attest)
        return {
            "kind": KIND,
            "attest": base64.b64encode(self.attest).decode(),
            "signature": base64.b64encode(self.signature).decode(),
            "pcr_selection": self.pcr_selection,
            "pcr_values": {bank: dict(vals) for bank, vals in self.pcr_values.items()},
            "ak_public": self.ak.public_pem,
            "ak_name": self.ak.name,
            "ak_tpm_public": base64.b64encode(self.ak.tpm_public).decode(),
            "ak_qualified_name": self.ak.qualified_name,
            "device": dict(self.ak.device),
            "taken_at": self.taken_at,
            "tpm_clock": {
                "clock": a.clock,
                "reset_count": a.reset_count,
                "restart_count": a.restart_count,
                "safe": a.safe,
                "firmware_version": f"{a.firmware_version:016x}",  # 64-bit: hex, not a JSON number
                "obfuscated": list(OBFUSCATED_COUNTS),
            },
        }


def evidence_for_capsule(quote: Quote, capsule_id: str, shared: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The slot for a quote whose qualifyingData is this capsule's id.

    Args:
        quote: the quote.
        capsule_id: the capsule's id (hex).
        shared: :meth:`Quote.shared_members`, when already built.

    Returns:
        The evidence slot.
    """
    out = dict(shared if shared is not None else quote.shared_members())
    out["binding"] = {"capsule_id": capsule_id}
    return out


# The slot of leaf ``leaf_index`` of a quoted root: built in one place, by the
# ledger, which stores a batch's quote once and rebuilds slots on read.
evidence_for_batch = batch_slot


_SOFTWARE_VENDORS = ("SW TPM", "SWTPM", "SW_TPM")


def is_software_device(device: Any) -> bool:
    """Whether a device is (or may be) software. Missing information never
    becomes a hardware claim.

    Args:
        device: the ``device`` member of an evidence slot or custody statement.

    Returns:
        True unless the device says, explicitly, that it is not software and
        its vendor strings are not a known software TPM's.
    """
    if not isinstance(device, Mapping) or device.get("software") is not False:
        return True
    vendor = " ".join(str(device.get("vendor", "")).split()).upper()
    return any(v in vendor for v in _SOFTWARE_VENDORS)
