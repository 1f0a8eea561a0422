"""Typed builders for the eight judge-family shapes (judge-record-family-v1 §1–§8).

Each shape is a strict, closed, frozen pydantic model. ``record_version`` and
``epistemic_type`` are *class* constants taken from the shape, never fields: a
caller who passes either is refused (``epistemic_type_fixed_by_shape``), and no
instance has a setter for anything. Constructing a model runs the whole refusal
engine (``rules.check_body``) on the body it would produce, so an instance that
exists is a record that may be sealed. ``from_body`` reads an existing body the
same way (the engine first, so a refusal names its rule).

The ``of``/``ruling``/``ack`` … factories take :class:`~capseal.judge.citation.Target`
objects and fix each citation's ``judge_purpose`` from the field it fills.

The verdict records are defined here; the base class (``JudgeRecord``) and the
bookkeeping records (calibration, sample, compile, close) in private modules of
their own, exported from here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from capseal.errors import JudgmentRefusedError

from ._bookkeeping import (
    CalibrationSummary,
    ClauseTally,
    Close,
    ContractCompile,
    KOfN,
    Period,
    Reconcile,
    ReconcileTallies,
    SampleManifest,
)
from ._record import Count as Count  # the count type the shapes share, where it was
from ._record import JudgeRecord
from .citation import Citation, JudgePart, NonEmpty, Target, computed, listed
from .pin import JudgePin
from .rules import check_body, raise_first

__all__ = [
    "JudgeRecord",
    "Case",
    "EvaluationReport",
    "Adjudication",
    "AdjudicationResponse",
    "HumanRating",
    "KOfN",
    "ClauseTally",
    "CalibrationSummary",
    "SampleManifest",
    "ContractCompile",
    "Period",
    "ReconcileTallies",
    "Reconcile",
    "Close",
    "SHAPE_MODELS",
    "parse_record",
]

CaseVerdict = Literal["met", "not_met", "not_evaluable"]
RulingVerdict = Literal["corroborated", "inconclusive", "contradicted"]


# --------------------------------------------------------------------------- evaluation-report/v1


class Case(JudgePart):
    """One case: verdict over cited acts (``grounds``) against a cited rubric (``method``)."""

    case_id: NonEmpty
    verdict: Literal["met", "not_met", "not_evaluable"]
    acts: Annotated[list[Citation], Field(min_length=1)]
    method: Citation

    @classmethod
    def of(cls, case_id: str, verdict: CaseVerdict | str, *, acts: Sequence[Target], method: Target | None) -> Case:
        """One case of an evaluation report.

        Args:
            case_id: the case's id.
            verdict: ``met``, ``not_met`` or ``not_evaluable``.
            acts: the acts it rests on (cited as ``grounds``), at least one.
            method: the rubric it was judged against (cited as ``method``).

        Returns:
            The case.

        Raises:
            JudgmentRefusedError: ``case_acts_required``, ``case_method_required``,
                a citation that is not a Target, or a schema rule.
        """
        acts = listed(acts, "acts")
        if not acts:
            raise JudgmentRefusedError(f"case {case_id!r} cites no act; every case cites the acts it rests on", rule="case_acts_required", path="$.acts")
        if method is None:
            raise JudgmentRefusedError(f"case {case_id!r} cites no rubric; every case cites the method it was judged against", rule="case_method_required", path="$.method")
        fields: dict[str, Any] = {"case_id": case_id, "verdict": verdict, "acts": [Citation.to(t, "grounds") for t in acts], "method": Citation.to(method, "method")}
        return cls(**fields)


class EvaluationReport(JudgeRecord):
    """``evaluation-report/v1`` (semantic_judgment): per-case verdicts under one pinned judge."""

    RECORD_VERSION: ClassVar[str] = "evaluation-report/v1"

    generated_at: NonEmpty
    contract_ref: NonEmpty
    judge_pin: JudgePin
    cases: Annotated[list[Case], Field(min_length=1)]


# --------------------------------------------------------------------------- adjudication/v1 and responses


class Adjudication(JudgeRecord):
    """``adjudication/v1`` (adjudication): a ruling over one or two cited parties."""

    RECORD_VERSION: ClassVar[str] = "adjudication/v1"

    adjudicated_at: NonEmpty
    verdict: Literal["corroborated", "inconclusive", "contradicted"]
    basis: JudgePin
    parties: Annotated[list[Citation], Field(min_length=1, max_length=2)]
    contradicted_party: NonEmpty = None  # type: ignore[assignment]
    margin: NonEmpty = None  # type: ignore[assignment]
    margin_tau: NonEmpty = None  # type: ignore[assignment]
    divergence_index: NonEmpty = None  # type: ignore[assignment]
    referee: Citation = None  # type: ignore[assignment]

    @classmethod
    def ruling(
        cls,
        *,
        record_id: str,
        adjudicated_at: str,
        verdict: str,
        basis: JudgePin,
        parties: Sequence[Target],
        contradicted: Target | None = None,
        referee: Target | None = None,
        margin: str | None = None,
        margin_tau: str | None = None,
        divergence_index: str | None = None,
    ) -> Adjudication:
        """A ruling over one or two cited parties.

        Args:
            record_id: the record's id.
            adjudicated_at: when (RFC 3339 UTC).
            verdict: ``corroborated``, ``inconclusive`` or ``contradicted``.
            basis: the pinned judge that ruled.
            parties: the records ruled on (one or two).
            contradicted: for ``contradicted``, the party it contradicts (one of
                ``parties``; written as ``contradicted_party``).
            referee: the referee's own record, when one ruled.
            margin: exact decimal strings, when measured.
            margin_tau: likewise.
            divergence_index: likewise.

        Returns:
            The record.

        Raises:
            JudgmentRefusedError: ``contradicted_party_not_a_party``, or a rule of
                the shape (a missing or forbidden contradicted party, a referee
                that is a party, a quantity that is no decimal string …).
        """
        parties = listed(parties, "parties")
        fields: dict[str, Any] = {
            "record_id": record_id,
            "adjudicated_at": adjudicated_at,
            "verdict": verdict,
            "basis": basis,
            "parties": [Citation.to(t, "adjudicated_party") for t in parties],
        }
        if contradicted is not None:
            if contradicted not in parties:
                raise JudgmentRefusedError("the contradicted party must be one of the parties", rule="contradicted_party_not_a_party", path="$.contradicted_party")
            fields["contradicted_party"] = contradicted.digest
        if referee is not None:
            fields["referee"] = Citation.to(referee, "referee")
        for name, value in (("margin", margin), ("margin_tau", margin_tau), ("divergence_index", divergence_index)):
            if value is not None:
                fields[name] = value
        return cls(**fields)


class AdjudicationResponse(JudgeRecord):
    """``adjudication-response/v1`` (producer_claim): receipt, ack or rebuttal."""

    RECORD_VERSION: ClassVar[str] = "adjudication-response/v1"

    responded_at: NonEmpty
    kind: Literal["delivery_receipt", "ack", "rebuttal"]
    adjudication: Citation
    verdict: Literal["corroborated", "inconclusive", "contradicted"] = None  # type: ignore[assignment]
    basis: NonEmpty = None  # type: ignore[assignment]

    @classmethod
    def delivery_receipt(cls, *, record_id: str, responded_at: str, adjudication: Target) -> AdjudicationResponse:
        """A party's receipt of an adjudication: no verdict, no basis.

        Args:
            record_id: the record's id.
            responded_at: when (RFC 3339 UTC).
            adjudication: the adjudication received.

        Returns:
            The record.

        Raises:
            JudgmentRefusedError: a rule of the shape.
        """
        return cls(record_id=record_id, responded_at=responded_at, kind="delivery_receipt", adjudication=Citation.to(adjudication, "responds_to"))

    @classmethod
    def ack(cls, *, record_id: str, responded_at: str, adjudication: Target, verdict: RulingVerdict) -> AdjudicationResponse:
        """A party's acknowledgement of an adjudication's verdict.

        Args:
            record_id: the record's id.
            responded_at: when (RFC 3339 UTC).
            adjudication: the adjudication acknowledged.
            verdict: the verdict acknowledged.

        Returns:
            The record.

        Raises:
            JudgmentRefusedError: a rule of the shape.
        """
        return cls(record_id=record_id, responded_at=responded_at, kind="ack", adjudication=Citation.to(adjudication, "responds_to"), verdict=verdict)

    @classmethod
    def rebuttal(cls, *, record_id: str, responded_at: str, adjudication: Target, verdict: RulingVerdict, basis: str) -> AdjudicationResponse:
        """A party's rebuttal of an adjudication.

        Args:
            record_id: the record's id.
            responded_at: when (RFC 3339 UTC).
            adjudication: the adjudication disputed.
            verdict: the verdict the party holds instead.
            basis: why, in prose (never blank).

        Returns:
            The record.

        Raises:
            JudgmentRefusedError: ``rebuttal_basis_empty``, or a rule of the shape.
        """
        return cls(
            record_id=record_id, responded_at=responded_at, kind="rebuttal",
            adjudication=Citation.to(adjudication, "responds_to"), verdict=verdict, basis=basis,
        )


# --------------------------------------------------------------------------- human-rating/v1


class HumanRating(JudgeRecord):
    """``human-rating/v1`` (human_report): a blind rating of one cited case.

    ``blind`` is always ``true`` and is not a parameter: a rating that is not
    blind is another shape, never this one with ``blind: false``."""

    RECORD_VERSION: ClassVar[str] = "human-rating/v1"
    FIXED: ClassVar[dict[str, Any]] = {"blind": True}

    rated_at: NonEmpty
    rater_ref: NonEmpty
    case: Citation
    label: NonEmpty

    @classmethod
    def of(cls, *, record_id: str, rated_at: str, rater_ref: str, case: Target, label: str) -> HumanRating:
        """A blind rating of one case.

        Args:
            record_id: the record's id.
            rated_at: when (RFC 3339 UTC).
            rater_ref: an opaque reference to the rater (never a name or an email).
            case: the blind packet the rater was shown (``judges.blind_packet``):
                a JSON object that does not carry the model's verdict.
            label: the rater's label.

        Returns:
            The record (``blind: true``, so the case must be blind).

        Raises:
            JudgmentRefusedError: ``rated_case_not_blind`` for a judgment record, a
                packet with ``model_verdict_shown`` other than ``false`` or a member
                naming a verdict; ``rater_ref_identifying``; a rule of the shape.
        """
        refuse_unless_blind(computed(case, "case"))
        return cls(record_id=record_id, rated_at=rated_at, rater_ref=rater_ref, case=Citation.to(case, "rated_case"), label=label)


def refuse_unless_blind(case: Target) -> None:
    """Refuse a rated case whose content is not a blind packet (family §3.4: a
    non-blind rating needs another shape).

    ``HumanRating.of`` and the store's ``seal`` (for a case it holds) call it.

    Args:
        case: the rated case's Target.

    Raises:
        JudgmentRefusedError: ``rated_case_not_blind``.
    """
    content = case.content

    def refuse(message: str) -> JudgmentRefusedError:
        return JudgmentRefusedError(f"{message}; a human-rating/v1 is blind: cite the blind packet the rater was shown (judges.blind_packet)",
                                    rule="rated_case_not_blind", path="$.case")

    if case.kind == "record":
        raise refuse(f"the case is a judgment record ({case.type}), which carries the verdict")
    if case.kind != "json" or not isinstance(content, Mapping):
        raise refuse(f"the case is {case.kind} content ({case.type}), not a blind packet (a JSON object)")
    shown = content.get("model_verdict_shown", False)
    if shown is not False:
        raise refuse(f"the packet says model_verdict_shown: {shown!r}, so the rater may have seen the model's verdict")
    # anywhere in the packet (a nested {"model": {"verdict": …}} is shown too): a
    # member naming a verdict, or a judgment record (which carries one)
    stack: list[tuple[Any, str]] = [(content, "$")]
    while stack:
        node, where = stack.pop()
        if isinstance(node, Mapping):
            if "record_version" in node or "result_version" in node:
                raise refuse(f"the packet holds a judgment record at {where}, which carries the verdict")
            for k, v in node.items():
                if "verdict" in str(k).lower() and not (where == "$" and k == "model_verdict_shown"):
                    raise refuse(f"the packet carries {where}.{k}, a verdict the rater would have seen")
                stack.append((v, f"{where}.{k}"))
        elif isinstance(node, list):
            stack.extend((v, f"{where}[{i}]") for i, v in enumerate(node))


SHAPE_MODELS: dict[str, type[JudgeRecord]] = {
    m.RECORD_VERSION: m
    for m in (EvaluationReport, Adjudication, AdjudicationResponse, HumanRating, CalibrationSummary, SampleManifest, ContractCompile, Close)
}


def parse_record(body: Mapping[str, Any]) -> JudgeRecord:
    """Read any judge-family body into its typed model.

    Args:
        body: the body.

    Returns:
        The record's model.

    Raises:
        JudgmentRefusedError: the first rule it breaks, or
            ``record_version_unknown``.
    """
    raise_first(check_body(body))
    model = SHAPE_MODELS.get(str(body.get("record_version")))
    if model is None:
        raise JudgmentRefusedError(f"{body.get('record_version')!r} is not a judge-family shape", rule="record_version_unknown", path="$.record_version")
    return model.from_body(body)
