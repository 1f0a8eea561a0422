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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import Field, ValidationError

from capseal.errors import JudgmentRefusedError

from .citation import (
    Citation,
    DigestRef,
    JudgeModel,
    JudgePart,
    NonEmpty,
    Target,
    as_mapping,
    computed,
    jsonish,
    listed,
    refusal_from,
)
from .links import Link
from .pin import JudgePin
from .rules import check_body, raise_first
from .vocab import SHAPES, Shape

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

Count = Annotated[int, Field(ge=0, le=2**53 - 1)]
R = TypeVar("R", bound="JudgeRecord")
CaseVerdict = Literal["met", "not_met", "not_evaluable"]
RulingVerdict = Literal["corroborated", "inconclusive", "contradicted"]


_Part = JudgePart


class JudgeRecord(JudgeModel):
    """Base of the eight shapes: ``record_id`` plus class-fixed version and type."""

    RECORD_VERSION: ClassVar[str] = ""
    FIXED: ClassVar[dict[str, Any]] = {}

    record_id: NonEmpty

    def __init__(self, **data: Any) -> None:
        for member, rule in (("record_version", "record_version_fixed_by_shape"), ("epistemic_type", "epistemic_type_fixed_by_shape")):
            if member in data:
                raise JudgmentRefusedError(
                    f"{member} comes from the shape ({self.shape().record_version}: {getattr(self.shape(), member)}); it is never set by a caller",
                    rule=rule,
                    path=f"$.{member}",
                )
        for member, value in self.FIXED.items():
            if member in data:
                if data[member] is not value:
                    raise JudgmentRefusedError(f"{member} is fixed to {value!r} in {self.RECORD_VERSION}", rule="rating_not_blind" if member == "blind" else "schema_const_mismatch", path=f"$.{member}")
                data = {k: v for k, v in data.items() if k != member}
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raw = {"record_version": self.RECORD_VERSION, "epistemic_type": self.shape().epistemic_type, **self.FIXED, **jsonish(data)}
            raise_first(check_body(raw), self.RECORD_VERSION)
            raise refusal_from(exc, self.RECORD_VERSION) from None
        raise_first(check_body(self.body()), self.RECORD_VERSION)

    @classmethod
    def shape(cls) -> Shape:
        return SHAPES[cls.RECORD_VERSION]

    @property
    def epistemic_type(self) -> str:
        """Fixed by the shape at commit; there is no setter."""
        return self.shape().epistemic_type

    @property
    def record_version(self) -> str:
        return self.RECORD_VERSION

    def body(self) -> dict[str, Any]:
        """The record body as sealed (JSON), ``record_version``/``epistemic_type`` included."""
        return {"record_version": self.RECORD_VERSION, "epistemic_type": self.shape().epistemic_type, **self.FIXED, **self.to_json()}

    def target(self) -> Target:
        """This record as something another record can cite or link to."""
        return Target.of_record(self.body(), type=self.shape().name)

    @classmethod
    def from_body(cls: type[R], body: Mapping[str, Any]) -> R:
        """Read a body: the refusal engine first (named rules), then the model."""
        raise_first(check_body(body), cls.RECORD_VERSION or "judgment record")
        if body.get("record_version") != cls.RECORD_VERSION:
            raise JudgmentRefusedError(f"{body.get('record_version')!r} is not {cls.RECORD_VERSION}", rule="record_version_mismatch", path="$.record_version")
        fields = {k: v for k, v in body.items() if k not in ("record_version", "epistemic_type", *cls.FIXED)}
        return cls(**fields)


# --------------------------------------------------------------------------- evaluation-report/v1


class Case(_Part):
    """One case: verdict over cited acts (``grounds``) against a cited rubric (``method``)."""

    case_id: NonEmpty
    verdict: Literal["met", "not_met", "not_evaluable"]
    acts: Annotated[list[Citation], Field(min_length=1)]
    method: Citation

    @classmethod
    def of(cls, case_id: str, verdict: CaseVerdict | str, *, acts: Sequence[Target], method: Target | None) -> Case:
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
        """A ruling; ``contradicted`` must be one of ``parties`` (its digest is
        written as ``contradicted_party``)."""
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
        return cls(record_id=record_id, responded_at=responded_at, kind="delivery_receipt", adjudication=Citation.to(adjudication, "responds_to"))

    @classmethod
    def ack(cls, *, record_id: str, responded_at: str, adjudication: Target, verdict: RulingVerdict) -> AdjudicationResponse:
        return cls(record_id=record_id, responded_at=responded_at, kind="ack", adjudication=Citation.to(adjudication, "responds_to"), verdict=verdict)

    @classmethod
    def rebuttal(cls, *, record_id: str, responded_at: str, adjudication: Target, verdict: RulingVerdict, basis: str) -> AdjudicationResponse:
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
        """``case`` is the blind packet the rater was shown (see ``judges.blind_packet``):
        a JSON object that does not carry the model's verdict. A judgment record, a
        packet with ``model_verdict_shown`` other than ``false`` or a member naming a
        verdict is refused — the record says ``blind: true``, so it must be."""
        refuse_unless_blind(computed(case, "case"))
        return cls(record_id=record_id, rated_at=rated_at, rater_ref=rater_ref, case=Citation.to(case, "rated_case"), label=label)


def refuse_unless_blind(case: Target) -> None:
    """Refuse a rated case whose content is not a blind packet (family §3.4: a
    non-blind rating needs another shape). ``HumanRating.of`` and the store's
    ``seal`` (for a case it holds) call it."""
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


# --------------------------------------------------------------------------- calibration-summary/v1


class KOfN(_Part):
    """A count pair, never a ratio; ``k ≤ n``."""

    k: Count
    n: Count

    @classmethod
    def of(cls, k: int, n: int) -> KOfN:
        if type(k) is int and type(n) is int and k > n:
            raise JudgmentRefusedError(f"k={k} exceeds n={n}", rule="k_exceeds_n", path="$.k")
        return cls(k=k, n=n)

    def rate(self) -> Fraction | None:
        """k/n computed at read time; ``None`` (absent, not 0) when n = 0."""
        return Fraction(self.k, self.n) if self.n else None


class ClauseTally(_Part):
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
        if human_approval is None:
            raise JudgmentRefusedError("a compile never self-certifies: cite the human approval record", rule="human_approval_required", path="$.human_approval")
        return cls(
            record_id=record_id, compiled_at=compiled_at, contract_ref=contract_ref,
            contract=Citation.to(contract, "compiles_contract"),
            compiled_skill=[Citation.to(t, "compiled_skill") for t in listed(compiled_skill, "compiled_skill")],
            human_approval=Citation.to(human_approval, "approves"),
        )


# --------------------------------------------------------------------------- close/v1


class Period(_Part):
    start: NonEmpty
    end: NonEmpty


class ReconcileTallies(_Part):
    matched: Count
    a_only: Count
    b_only: Count
    conflicting: Count
    insufficient: Count
    unresolved: Count


class Reconcile(_Part):
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
    evidence_links: list[Link] = Field(default=None, alias="x-evidence-links")  # type: ignore[assignment, arg-type]

    @classmethod
    def of(
        cls, *, record_id: str, closed_at: str, period: tuple[str, str], counts_by_kind: Mapping[str, int],
        head: Target, reconcile: Reconcile | None = None, peer_close: Target | None = None,
    ) -> Close:
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
        """The links this Close carries in its body (mirrored in the store header)."""
        return list(self.evidence_links or [])


SHAPE_MODELS: dict[str, type[JudgeRecord]] = {
    m.RECORD_VERSION: m
    for m in (EvaluationReport, Adjudication, AdjudicationResponse, HumanRating, CalibrationSummary, SampleManifest, ContractCompile, Close)
}


def parse_record(body: Mapping[str, Any]) -> JudgeRecord:
    """Read any judge-family body into its typed model (refusing by rule name)."""
    raise_first(check_body(body))
    model = SHAPE_MODELS.get(str(body.get("record_version")))
    if model is None:
        raise JudgmentRefusedError(f"{body.get('record_version')!r} is not a judge-family shape", rule="record_version_unknown", path="$.record_version")
    return model.from_body(body)
