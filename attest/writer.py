"""Writing a quoted batch into the ledger, verified first.

:func:`write_batch` checks the quote (signature, magic, type, the Merkle root
as qualifyingData, PCR digest, AK in the policy) through the slot of the
batch's first record — every slot of a batch shares those members — then
hands the ledger the batch: the shared quote members once, and the record
ids in leaf order (``Ledger.add_evidence_batch``, one transaction, whole or
not at all). The ledger refuses ids that do not hash to the quoted root, and
rebuilds each record's slot and inclusion proof when it is read; the proofs
are RFC 9162 paths in the tree of exactly these ids, so the root check is
what makes every one of them valid.

Why in the sealing process, and the quote stored once per batch: across
processes there is no fair hand-off of SQLite's write lock, so a writer
process could leave evidence waiting without bound under sustained sealing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from capseal.errors import EvidenceError
from capseal.ledger import batch_root

from .evidence import evidence_for_batch
from .trust import TrustPolicy
from .verify import verify_evidence

__all__ = ["write_batch"]


def write_batch(ledger: Any, policy: TrustPolicy, ids: Sequence[str], shared: Mapping[str, Any], root: bytes,
                first_proof: Sequence[bytes] | None = None) -> int:
    """Verify, then append one quoted batch in one ledger transaction.

    Args:
        ledger: the ledger.
        policy: the trust policy the quote must verify under.
        ids: the batch's capsule ids, in leaf order.
        shared: the quote's shared evidence members.
        root: the Merkle root the quote covers.
        first_proof: ``ids[0]``'s audit path, when the caller has it from
            :func:`capseal.ledger.batch_root`.

    Returns:
        The number of records the batch covers.

    Raises:
        EvidenceError: no ids, ids that do not hash to ``root``, or a quote that
            does not verify (nothing written).
    """
    if not ids:
        raise EvidenceError("a batch covers at least one record; nothing written")
    if first_proof is None:
        try:
            computed, first_proof = batch_root(ids)
        except ValueError as exc:
            raise EvidenceError(f"{exc}; nothing written") from None
        if computed != root:
            raise EvidenceError("the batch's Merkle root is not the quoted one; nothing written")
    first = evidence_for_batch(shared, root, 0, len(ids), tuple(first_proof))
    result = verify_evidence(ids[0], policy, evidence=first)
    if not result.ok:
        raise EvidenceError(f"batch quote did not verify ({result.status}); nothing written")
    try:
        ledger.add_evidence_batch(ids, root, shared)  # re-derives the root from the ids: refuses a mismatch
    except ValueError as exc:
        raise EvidenceError(f"{exc}; nothing written") from None
    return len(ids)
