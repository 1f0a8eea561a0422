"""capseal.attest — TPM quotes in the hardware-evidence slot.

A sealed record's ``hardware_evidence`` is ``null`` until a TPM quote covering
its capsule id is taken *and verified*; then it holds the quote (see
:mod:`capseal.attest.evidence` for the shape). The slot lives beside the
capsule, so adding evidence never changes the capsule or its id, and the
ledger keeps the earlier null state in the record's evidence history.

>>> from capseal.attest import AttestationKey, TPMQuoter, quote_record, attach, verify_evidence
>>> ak = AttestationKey("tpm2:handle=0x81000102?tcti=swtpm:host=127.0.0.1,port=2321")  # doctest: +SKIP
>>> quoter = TPMQuoter(ak)                               # default PCRs sha256:0-7      # doctest: +SKIP
>>> record = quote_record(record, quoter, ledger=producer.ledger)   # one record, sync # doctest: +SKIP
>>> evidence = attach(producer, quoter)     # epoch quote + batches over Merkle roots  # doctest: +SKIP
>>> verify_evidence(record, trust=[ak.public_pem]).status                              # doctest: +SKIP
'verified-software-tpm'

Verification (:func:`verify_evidence`, :func:`evidence_status`) needs neither
tpm2-pytss nor a TPM: only ``cryptography``.

Public modules (the TPM side loads on first use: it needs tpm2-pytss):

* :mod:`capseal.attest.evidence` — the slot's shape: PCR selections, quotes, AK identities;
* :mod:`capseal.attest.verify` — verifying a slot (never raises);
* :mod:`capseal.attest.trust` — which AKs a verifier trusts;
* :mod:`capseal.attest.tpmwire` — the TPM wire structures a verifier reads, in pure Python;
* :mod:`capseal.attest.tpm` — the attestation key on a TPM, and quotes taken with it;
* :mod:`capseal.attest.quoter` — verified quotes, one record's slot filled;
* :mod:`capseal.attest.batch` — one quote per batch of records, off the seal path;
* :mod:`capseal.attest.writer` — a quoted batch written to the ledger, verified first;
* :mod:`capseal.attest.platform` — evidence wired into a producer (:func:`attach`);
* :mod:`capseal.attest.merkle` — the name :mod:`capseal.merkle` had here before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from capseal.merkle import leaf_hash, node_hash, verify_inclusion

from .evidence import DEFAULT_PCRS, KIND, AKIdentity, PCRSelection, Quote, is_software_device
from .trust import PinnedAK, TrustPolicy
from .verify import NO_EVIDENCE, VERIFIED, VERIFIED_SOFTWARE, EvidenceResult, evidence_status, verify_evidence

__all__ = [
    "KIND",
    "DEFAULT_PCRS",
    "AKIdentity",
    "PCRSelection",
    "Quote",
    "PinnedAK",
    "TrustPolicy",
    "EvidenceResult",
    "verify_evidence",
    "evidence_status",
    "is_software_device",
    "leaf_hash",
    "node_hash",
    "verify_inclusion",
    "NO_EVIDENCE",
    "VERIFIED",
    "VERIFIED_SOFTWARE",
    # TPM side (loaded lazily: needs tpm2-pytss)
    "AttestationKey",
    "parse_ak_uri",
    "TPMQuoter",
    "quote_record",
    "quote",
    "BatchEvidence",
    "attach",
    "is_epoch_boundary",
]

if TYPE_CHECKING:  # loaded on first use at run time (see __getattr__); typed callers see their real types
    from .batch import BatchEvidence
    from .platform import attach, is_epoch_boundary
    from .quoter import TPMQuoter, quote_record
    from .tpm import AttestationKey, parse_ak_uri

_LAZY = {
    "AttestationKey": "tpm",
    "parse_ak_uri": "tpm",
    "TPMQuoter": "quoter",
    "quote_record": "quoter",
    "BatchEvidence": "batch",
    "attach": "platform",
    "is_epoch_boundary": "platform",
}


def quote(record: Any, quoter: Any, *, ledger: Any = None) -> Any:
    """Quote one record now (sync): see :func:`capseal.attest.quoter.quote_record`.

    Args:
        record: a sealed record.
        quoter: a quoter, an :class:`AttestationKey` or an AK ``tpm2:`` URI.
        ledger: when given, the slot is appended there first.

    Returns:
        The record with its slot filled.

    Raises:
        EvidenceError: the quote could not be taken or did not verify (nothing written).
    """
    from .quoter import TPMQuoter, quote_record

    if isinstance(quoter, str) or type(quoter).__name__ == "AttestationKey":
        quoter = TPMQuoter(quoter)
    return quote_record(record, quoter, ledger=ledger)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'capseal.attest' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
