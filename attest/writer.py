"""Writing a quoted batch's slots into the ledger, verified first.

:func:`write_batch` checks the quote (signature, magic, type, the Merkle root
as qualifyingData, PCR digest, AK in the policy) on the first slot — every
slot of a batch shares those members — and every record's inclusion proof,
then appends all the slots in one ledger transaction: a batch is written
whole or not at all.

(A helper process that wrote the slots outside the sealing process's GIL was
tried and dropped. On the 2-vCPU machine it was measured on, sealing got no
faster — the sealing thread's own CPU per record rose about as much as the
worker's fell — and across processes there is no fair hand-off of SQLite's
write lock: under sustained sealing no batch landed within a whole timed
round, so evidence latency had no bound.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from capseal.errors import EvidenceError

from . import merkle
from .evidence import BatchBodies, evidence_for_batch
from .trust import TrustPolicy
from .verify import verify_evidence

__all__ = ["write_batch"]


def write_batch(ledger: Any, policy: TrustPolicy, ids: Sequence[str], shared: Mapping[str, Any], root: bytes,
                tree: merkle.Tree | None = None) -> int:
    """Verify, then append the slots of one quoted batch (``ids`` in leaf
    order) in one ledger transaction. Raises EvidenceError (nothing written)
    when anything does not verify."""
    leaves = [bytes.fromhex(cid) for cid in ids]
    if not leaves or any(len(leaf) != 32 for leaf in leaves):
        raise EvidenceError("a batch is one or more 32-byte capsule ids")
    if tree is None:
        tree = merkle.build(leaves)
    if tree.root != root:
        raise EvidenceError("the batch's Merkle root is not the quoted one; nothing written")
    n = len(ids)
    first = evidence_for_batch(shared, root, 0, n, tree.proofs[0])
    result = verify_evidence(ids[0], policy, evidence=first)
    if not result.ok:
        raise EvidenceError(f"batch quote did not verify ({result.status}); nothing written")
    if not merkle.verify_all(leaves, tree.proofs, root):
        raise EvidenceError(f"an inclusion proof of the batch of {n} does not verify; nothing written")
    bodies = BatchBodies(shared, root, n)  # the shared members serialized once per batch
    return int(ledger.add_evidence_many([(cid, bodies.body(i, tree.proofs[i])) for i, cid in enumerate(ids)]))
