"""Taking verified quotes, and filling one record's slot.

A *quoter* is anything with ``identity`` (an :class:`AKIdentity`) and
``take(nonce) -> Quote``. :class:`TPMQuoter` is the real one; the batch worker
and the benchmark accept any quoter, so a slow-TPM wrapper (or a failing one,
in tests) slots in without touching the worker.

Nothing unverified is ever written: :func:`quote_record` checks the filled
slot with the same :func:`verify_evidence` an auditor runs, under a policy
that pins exactly the AK that was asked for, and refuses (the slot stays null)
on any finding.
"""

from __future__ import annotations

from typing import Any, Protocol

from capseal.errors import EvidenceError

from .evidence import DEFAULT_PCRS, AKIdentity, PCRSelection, Quote, evidence_for_capsule
from .tpm import AttestationKey
from .trust import PinnedAK, TrustPolicy
from .verify import verify_evidence

__all__ = ["Quoter", "TPMQuoter", "quote_record", "self_policy"]


class Quoter(Protocol):
    """Takes a quote with qualifyingData ``nonce``; raises EvidenceError."""

    identity: AKIdentity

    def take(self, nonce: bytes) -> Quote:
        """Take a quote whose qualifyingData is ``nonce``.

        Args:
            nonce: 1–64 bytes (a raw capsule id or Merkle root).

        Returns:
            The quote, verified.

        Raises:
            EvidenceError: it could not be taken, or did not verify.
        """


def self_policy(identity: AKIdentity) -> TrustPolicy:
    """A policy that trusts exactly this AK, for checking a quoter's own quotes.

    Args:
        identity: the AK's identity.

    Returns:
        The policy.
    """
    return TrustPolicy((PinnedAK.from_pem(identity.public_pem, name=identity.name, qualified_name=identity.qualified_name),))


class TPMQuoter:
    """Quotes with an AK over a PCR selection (default sha256:0–7), verifying
    each quote before returning it.

    The PCR values are read just after the quote; if another process extends a
    PCR in between, the digest check fails and the quote is taken again (up to
    ``attempts`` times) rather than written with values it does not cover.
    """

    def __init__(self, ak: AttestationKey | str, *, pcrs: str | PCRSelection = DEFAULT_PCRS, attempts: int = 3,
                 timeout: float | None = 60.0) -> None:
        # timeout: seconds a TPM command may take (a hung TPM: EvidenceError), for an AK given by URI
        self.ak = ak if isinstance(ak, AttestationKey) else AttestationKey(ak, timeout=timeout)
        self.selection = PCRSelection.parse(pcrs)
        self.selection.check_quotable()  # refused here, not after a quote the verifier would refuse
        self.attempts = max(1, attempts)
        self.identity = self.ak.identity
        self._policy = self_policy(self.identity)

    def take(self, nonce: bytes) -> Quote:
        """Take a quote over ``nonce`` and verify it (see :class:`Quoter`); a quote
        whose PCR values changed between the quote and their reading is taken
        again, up to ``attempts`` times.

        Args:
            nonce: 1–64 bytes (a raw capsule id or Merkle root).

        Returns:
            The quote, verified.

        Raises:
            EvidenceError: it could not be taken, or did not verify (nothing written).
        """
        last = ""
        for _ in range(self.attempts):
            q = self.ak.quote(nonce, self.selection)
            result = verify_evidence(nonce.hex(), self._policy, evidence=evidence_for_capsule(q, nonce.hex()))
            if result.ok:
                return q
            last = "; ".join(str(f) for f in result.findings if f.severity == "error")
            if result.status != "evidence_pcr_mismatch":
                break
        raise EvidenceError(f"the quote from {self.ak.ref.uri()} did not verify, nothing was written: {last}")


def quote_record(record: Any, quoter: Quoter, *, ledger: Any = None) -> Any:
    """Quote over ``record``'s capsule id (raw 32 bytes), verify, and return the
    record with its slot filled; the capsule and its id are unchanged.

    Args:
        record: a sealed record.
        quoter: a quoter (``identity`` and ``take()``).
        ledger: when given, the slot is appended there first (append-only: the
            record's earlier null state stays in its evidence history).

    Returns:
        The record with its slot filled.

    Raises:
        EvidenceError: something that is not a sealed record (no string
            ``capsule_id``: a record dict, None) or not a quoter, refused before
            the TPM is asked; a quote that could not be taken or did not verify.
    """
    cid = getattr(record, "capsule_id", None)
    if not isinstance(cid, str):
        raise EvidenceError(f"quote_record() takes a sealed record with a capsule id, not {type(record).__name__}")
    if not callable(getattr(quoter, "take", None)) or getattr(quoter, "identity", None) is None:
        raise EvidenceError(f"quote_record() takes a quoter (identity and take()), not {type(quoter).__name__}")
    try:
        nonce = bytes.fromhex(cid)
    except ValueError:
        raise EvidenceError(f"capsule id {cid[:80]!r} is not hex") from None
    if len(nonce) != 32:
        raise EvidenceError(f"capsule id {cid[:80]!r} is not 32 bytes")
    q = quoter.take(nonce)
    evidence = evidence_for_capsule(q, cid)
    result = verify_evidence(record.with_evidence(evidence), self_policy(quoter.identity))
    if not result.ok:
        raise EvidenceError(f"evidence for {cid[:16]}… did not verify ({result.status}); nothing was written")
    if ledger is not None:
        ledger.add_evidence(cid, evidence)
    return record.with_evidence(evidence)
