"""capseal — seal IETF Agent Action Capsules (draft -05) honestly.

>>> from capseal import Producer
>>> from capseal.keys import UnsafeEphemeralSigner
>>> with Producer("acme", "buyer-agent@1.4", UnsafeEphemeralSigner(), "capsules.db") as p:  # doctest: +SKIP
...     planned = p.planned("po-7", effect_type="write_order", request={"sku": "A1", "qty": 2})
...     record = p.confirmed(planned, response={"order": "O-1"})

Public surface: :class:`Producer`, :func:`verify`, :func:`verify_ledger`,
:class:`SealedRecord`, :class:`Ledger`, the digest helpers and
:mod:`capseal.errors`. Keys live in :mod:`capseal.keys`, TPM quotes in
:mod:`capseal.attest`, judgment records in :mod:`capseal.judge`.
"""

from typing import TYPE_CHECKING

from . import errors
from .assurance import derive_assurance
from .canonical import canonical_bytes, capsule_id, json_digest, raw_digest
from .envelope import Envelope, verify_cose_sign1, verify_profile_envelope
from .findings import Finding, VerificationResult
from .ledger import Ledger
from .model import validate_capsule
from .producer import PendingRecord, Producer
from .record import SealedRecord
from .verify import verify, verify_store
from .vocab import SPEC_VERSION

if TYPE_CHECKING:  # imported on first use at run time (see __getattr__); typed callers see its real signature
    from .audit import verify_ledger

__version__ = "0.1.0"

__all__ = [
    "PendingRecord",
    "Producer",
    "SealedRecord",
    "Ledger",
    "Envelope",
    "Finding",
    "VerificationResult",
    "verify",
    "verify_store",
    "verify_ledger",
    "verify_profile_envelope",
    "verify_cose_sign1",
    "validate_capsule",
    "derive_assurance",
    "canonical_bytes",
    "capsule_id",
    "json_digest",
    "raw_digest",
    "errors",
    "SPEC_VERSION",
    "__version__",
]


def __getattr__(name: str) -> object:
    if name == "verify_ledger":
        from .audit import verify_ledger

        return verify_ledger
    raise AttributeError(name)
