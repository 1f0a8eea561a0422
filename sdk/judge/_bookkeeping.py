"""The judge family's bookkeeping records: ``calibration-summary/v1`` (k of n,
never a rate), ``sample-manifest/v1``, ``contract-compile/v1`` and
``close/v1``.

:mod:`capseal.judge.shapes` exports them with the other shapes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from capseal.errors import JudgmentRefusedError

from ._record import Count, JudgeRecord
from .citation import Citation, DigestRef, JudgePart, NonEmpty, Target, as_mapping, computed, listed
from .links import Link
from .pin import JudgePin

__all__ = ["KOfN", "ClauseTally", "CalibrationSummary", "SampleManifest", "ContractCompile", "Period",
           "ReconcileTallies", "Reconcile", "Close"]


# --------------------------------------------------------------------------- calibration-summary/v1


class KOfN(JudgePart):
    """A count pair, never a ratio; ``k ≤ n``."""

    k: Count
    n: Count

    @classmethod
    def of(cls, k: int, n: int) -> KOfN:
        """A count pair.

        Args:
            k: how many of ``n`` (an integer, ``k ≤ n``).
            n: how many in all.

        Returns:
            The pair.

        Raises:
            JudgmentRefusedError: ``k_exceeds_n``, or a schema rule (a negative
                or unsafe count, a value that is no integer).
        """
        if type(k) is int and type(n) is int and k > n:
            raise JudgmentRefusedError(f"k={k} exceeds n={n}", rule="k_exceeds_n", path="$.k")
        return cls(k=k, n=n)

    def rate(self) -> Fraction | None:
        """k/n computed at read time (never stored).

        Returns:
            The exact fraction, or None (absent, not 0) when n = 0.
        """
        return Fraction(self.k, self.n) if self.n else None


class ClauseTally(JudgePart):
    """One clause's agreement and drift, each k of n."""

    clause_ref: NonEmpty
    agreement: KOfN
    drift: KOfN


class CalibrationSummary(JudgeRecord):
    """``calibration-summary/v1`` (derived_metric): per-clause agreement and drift, k of n."""

    RECORD_VERSION: ClassVar[str] = "calibration-summary/v1"

    computed_at: NonEmpty
    judge_pin: Citation
    clauses: Annotated[list[ClauseTally], Field(min_length=1)]

    @classmethod
    def of(cls, *, record_id: str, computed_at: str, judge_pin: Target | JudgePin, clauses: Sequence[ClauseTally]) -> CalibrationSummary:
        """Per-clause agreement and drift of one pinned judge.

        Args:
            record_id: the record's id.
            computed_at: when (RFC 3339 UTC).
            judge_pin: the judge's pin, or a Target of it (cited as
                ``calibrates``).
            clauses: one tally per clause, each clause once.

        Returns:
            The record.

        Raises:
            JudgmentRefusedError: ``clause_ref_duplicate``, ``k_exceeds_n``, or a
                rule of the shape.
        """
        pin = judge_pin.target() if isinstance(judge_pin, JudgePin) else judge_pin
        return cls(record_id=record_id, computed_at=computed_at, judge_pin=Citation.to(pin, "calibrates"), clauses=listed(clauses, "clauses"))


# --------------------------------------------------------------------------- sample-manifest/v1, contract-compile/v1


class SampleManifest(JudgeRecord):
    """``sample-manifest/v1`` (producer_claim): which cases, under which policy."""

    RECORD_VERSION: ClassVar[str] = "sample-manifest/v1"

    generated_at: NonEmpty
    policy: Citation
    stratification: dict[str, Count]
    cases: Annotated[list[NonEmpty], Field(min_length=1)]

    @classmethod
    def of(cls, *, record_id: str, generated_at: str, policy: Target, stratification: Mapping[str, int], cases: Sequence[str]) -> SampleManifest:
        """Which cases were sampled, under which policy.

        Args:
            record_id: the record's id.
            generated_at: when (RFC 3339 UTC).
            policy: the sampling policy (cited as ``sampling_policy``).
            stratification: stratum → count.
            cases: the case ids, each once.

        Returns:
            The record.

        Raises:
            JudgmentRefusedError: ``sample_case_duplicate``, or a rule of the shape.
        """
        return cls(record_id=record_id, generated_at=generated_at, policy=Citation.to(policy, "sampling_policy"),
                   stratification=as_mapping(stratification, "stratification"), cases=listed(cases, "cases"))


class ContractCompile(JudgeRecord):
    """``contract-compile/v1`` (producer_claim): a compile, with its human approval cited."""

    RECORD_VERSION: ClassVar[str] = "contract-compile/v1"

    compiled_at: NonEmpty
    contract_ref: NonEmpty
    contract: Citation
    compiled_skill: Annotated[list[Citation], Field(min_length=1)]
    human_approval: Citation

    @classmethod
    def of(
        cls, *, record_id: str, compiled_at: str, contract_ref: str, contract: Target,
        compiled_skill: Sequence[Target], human_approval: Target | None,
    ) -> ContractCompile:
        """A contract compiled into skills, with its human approval cited.

        Args:
            record_id: the record's id.
            compiled_at: when (RFC 3339 UTC).
            contract_ref: the contract version.
            contract: the contract (cited as ``compiles_contract``).
            compiled_skill: the compiled skills, at least one.
            human_approval: the separate human approval record (a compile never
                self-certifies).

        Returns:
            The record.

        Raises:
            JudgmentRefusedError: ``human_approval_required``,
                ``human_approval_self_certifying``, or a rule of the shape.
        """
        if human_approval is None:
            raise JudgmentRefusedError("a compile never self-certifies: cite the human approval record", rule="human_approval_required", path="$.human_approval")
        return cls(
            record_id=record_id, compiled_at=compiled_at, contract_ref=contract_ref,
            contract=Citation.to(contract, "compiles_contract"),
            compiled_skill=[Citation.to(t, "compiled_skill") for t in listed(compiled_skill, "compiled_skill")],
            human_approval=Citation.to(human_approval, "approves"),
        )


# --------------------------------------------------------------------------- close/v1


class Period(JudgePart):
    """The period a Close covers: ``start`` and ``end`` timestamps."""

    start: NonEmpty
    end: NonEmpty


class ReconcileTallies(JudgePart):
    """How two parties' records matched over a period, as counts."""

    matched: Count
    a_only: Count
    b_only: Count
    conflicting: Count
    insufficient: Count
    unresolved: Count


class Reconcile(JudgePart):
    """A reconciliation with a peer: the tallies and ``AGREED``, ``UNILATERAL`` or ``CONTESTED``."""

    tallies: ReconcileTallies
    status: Literal["AGREED", "UNILATERAL", "CONTESTED"]


class Close(JudgeRecord):
    """``close/v1`` (producer_claim). With ``reconcile`` it carries exactly one
    ``cites`` link to the peer's Close in ``x-evidence-links`` (family §0a)."""

    RECORD_VERSION: ClassVar[str] = "close/v1"

    closed_at: NonEmpty
    period: Period
    counts_by_kind: dict[str, Count]
    head: DigestRef
    reconcile: Reconcile = None  # type: ignore[assignment]
    evidence_links: list[Link] = Field(default=None, alias="x-evidence-links")  # type: ignore[arg-type]

    @classmethod
    def of(
        cls, *, record_id: str, closed_at: str, period: tuple[str, str], counts_by_kind: Mapping[str, int],
        head: Target, reconcile: Reconcile | None = None, peer_close: Target | None = None,
    ) -> Close:
        """A period's close: counts by kind and the head it closes at.

        Args:
            record_id: the record's id.
            closed_at: when (RFC 3339 UTC).
            period: ``(start, end)`` timestamps.
            counts_by_kind: kind → count.
            head: the head digest's Target.
            reconcile: the reconciliation with a peer, if any.
            peer_close: the peer's Close (one ``cites`` link in
                ``x-evidence-links``; required with ``reconcile``).

        Returns:
            The record.

        Raises:
            JudgmentRefusedError: ``close_period_malformed``,
                ``reconcile_peer_close_link_required``, or a rule of the shape.
        """
        if isinstance(period, (str, bytes, Mapping)) or not isinstance(period, Sequence) or len(period) != 2:
            got = f"{type(period).__name__} of {len(period)}" if isinstance(period, Sequence) else type(period).__name__
            raise JudgmentRefusedError(f"period is a (start, end) pair of timestamps, not {got}", rule="close_period_malformed", path="$.period")
        fields: dict[str, Any] = {
            "record_id": record_id, "closed_at": closed_at, "period": Period(start=period[0], end=period[1]),
            "counts_by_kind": as_mapping(counts_by_kind, "counts_by_kind"), "head": DigestRef.of(computed(head, "head")),
        }
        if reconcile is not None:
            fields["reconcile"] = reconcile
        if peer_close is not None:
            fields["x-evidence-links"] = [Link.to("cites", peer_close)]
        return cls(**fields)

    def links(self) -> list[Link]:
        """The links this Close carries in its body (mirrored in the store header).

        Returns:
            A new list of them.
        """
        return list(self.evidence_links or [])
