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

Public modules (everything else here, ``capseal._internal`` and each name
with a leading underscore, is private to this package):

* ``producer``, ``aio`` (sealing, from threads and from an event loop),
  ``arguments`` (the checks of waits, timeouts and counts they share);
* ``record``, ``canonical``, ``model``, ``assurance``, ``vocab`` (the capsule:
  its record, RFC 8785 bytes and digests, the strict model, derived
  assurance, closed sets);
* ``envelope``, ``cose``, ``cbor`` (signatures: the producer envelope,
  COSE_Sign1, the deterministic CBOR they need);
* ``verify``, ``audit``, ``findings``, ``trust``, ``merkle`` (checking: one
  capsule, a whole ledger, what a check reports, trust anchors, Merkle
  paths);
* ``ledger`` (a package: the durable store), ``errors``, ``process`` (fork
  and exit safety), ``cli`` (the ``capseal`` command);
* ``integrations`` (a package: agent-framework adapters), ``judge`` (a
  package: judgment records); ``keys`` and ``attest`` are packages of their
  own.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import errors
from ._version import __version__

# eager: the submodule capseal.verify shares its name with the function, and
# importing the submodule later (as the producer does) would rebind
# capseal.verify to the module if the function were not bound here first
from .verify import verify, verify_store
from .vocab import SPEC_VERSION

if TYPE_CHECKING:  # what typed callers see; at run time each name is imported on first use (see __getattr__)
    from .assurance import derive_assurance
    from .audit import verify_ledger
    from .canonical import canonical_bytes, capsule_id, json_digest, raw_digest
    from .envelope import Envelope, verify_cose_sign1, verify_profile_envelope
    from .findings import Finding, VerificationResult
    from .ledger import Ledger
    from .model import validate_capsule
    from .producer import PendingRecord, Producer
    from .record import SealedRecord

# name -> module holding it. Why lazy: ``capseal --help`` and ``import
# capseal.errors`` need none of the producer's modules (pydantic, SQLite,
# cryptography), and importing them all took most of the CLI's start-up.
_LAZY = {
    "PendingRecord": ".producer", "Producer": ".producer", "SealedRecord": ".record", "Ledger": ".ledger",
    "Envelope": ".envelope", "verify_profile_envelope": ".envelope", "verify_cose_sign1": ".envelope",
    "Finding": ".findings", "VerificationResult": ".findings",
    "verify_ledger": ".audit", "validate_capsule": ".model", "derive_assurance": ".assurance",
    "canonical_bytes": ".canonical", "capsule_id": ".canonical", "json_digest": ".canonical",
    "raw_digest": ".canonical",
}

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


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'capseal' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
