"""Evidence Result v0: two answers per claim, coverage first, never one number.

Every claim keeps *sufficiency* (was there enough evidence to judge at all:
SATISFIED / GAP / INSUFFICIENT / UNKNOWN) apart from the *verdict* (met /
not_met / not_evaluable); ``met``/``not_met`` only under SATISFIED. Each claim
says how it was reached (``tier``: ``recomputed`` by a fixed function of cited
inputs, or ``judged`` by a pinned model or a human) and, when recomputed, which
code did it (``implementation``, a git object id — never a version string).

:class:`ResultBuilder` derives coverage and buckets from the claims (a caller
cannot state a count that no claim backs), and *withholds* a recomputed row whose
code cannot be named, counting it in ``producer_defects`` — it never relabels it
``judged`` (evidence-result-v0 §3.1).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, ValidationError

from capseal.errors import JudgmentRefusedError

from .citation import DigestRef, Hex64, JudgeModel, JudgePart, NonEmpty, Target, jsonish, listed, refusal_from
from .rules import check_body, epistemic_type_of, raise_first
from .vocab import RESULT_VERSION

__all__ = [
    "CodeDigest",
    "Implementation",
    "ProofRef",
    "DisclosureCarrier",
    "AnalysisCarrier",
    "StoryCarrier",
    "Claim",
    "ProducerDefects",
    "Coverage",
    "Buckets",
    "Aggregate",
    "View",
    "EvidenceResult",
    "ResultBuilder",
    "git_blob_id",
    "git_tree_id",
    "code_identity",
    "presentation_for",
]

Count = Annotated[int, Field(ge=0, le=2**53 - 1)]
Sufficiency = Literal["SATISFIED", "GAP", "INSUFFICIENT", "UNKNOWN"]
Verdict = Literal["met", "not_met", "not_evaluable"]
Grade = Literal["self-attested", "witnessed", "countersigned"]


class CodeDigest(JudgePart):
    """A git commit or tree id (40 or 64 hex), or the admission ``unknown``."""

    alg: Literal["git-commit", "git-tree", "unknown"]
    value: NonEmpty


class Implementation(JudgePart):
    """Which code computed a claim, graded (self-attested gives comparability only)."""

    name: NonEmpty
    code_digest: CodeDigest
    grade: Grade
    captured_at: NonEmpty


class ProofRef(JudgePart):
    """A proof behind a claim's grade: a receipt or an inclusion proof, by digest."""

    kind: Literal["inclusion_proof", "receipt"]
    digest_alg: Literal["SHA-256"]
    digest: Hex64


class DisclosureCarrier(JudgePart):
    """Evidence the producer holds and may show, by digest, under a status."""

    kind: Literal["disclosure"]
    status: Literal["SATISFIED", "INSUFFICIENT", "NOT_FOUND", "CONTRADICTED", "NOT_APPLICABLE", "UNKNOWN"]
    evidence: list[DigestRef]


class AnalysisCarrier(JudgePart):
    """A presentation by analysis: a status and a summary."""

    kind: Literal["analysis"]
    status: NonEmpty
    summary: NonEmpty


class StoryCarrier(JudgePart):
    """A presentation as a story: a status and a narrative."""

    kind: Literal["story"]
    status: NonEmpty
    narrative: NonEmpty


class Claim(JudgeModel):
    """One requirement of one contract version, judged once. ``reconcile`` and
    ``close`` bodies (PROPOSED claim types) are carried as checked JSON.

    A wrong value is refused by rule name. The builders (:meth:`of`,
    :meth:`ResultBuilder.add`) also refuse a grade above ``self-attested``
    with no proof at all: the grade would claim an assurance nothing backs.
    (Reading a stored Result, ``EvidenceResult.from_body``, leaves grades to
    the refusal engine.)"""

    id: NonEmpty
    contract_ref: NonEmpty
    requirement_ref: NonEmpty
    tier: Literal["recomputed", "judged"]
    grade: Grade
    sufficiency: Sufficiency
    verdict: Verdict
    evidence: list[DigestRef]
    proofs: list[ProofRef]
    presentation: DisclosureCarrier | AnalysisCarrier | StoryCarrier = Field(discriminator="kind")
    type: Literal["requirement", "reconcile", "close"] = None  # type: ignore[assignment]
    implementation: Implementation = None  # type: ignore[assignment]
    reconcile: dict[str, Any] = None  # type: ignore[assignment]
    close: dict[str, Any] = None  # type: ignore[assignment]

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise _claim_refusal(exc, data) from None

    @classmethod
    def of(
        cls,
        *,
        id: str,
        contract_ref: str,
        requirement_ref: str,
        tier: str,
        grade: str,
        sufficiency: str,
        verdict: str,
        evidence: Sequence[Target],
        proofs: Sequence[ProofRef] = (),
        presentation: DisclosureCarrier | AnalysisCarrier | StoryCarrier | None = None,
        implementation: Implementation | None = None,
    ) -> Claim:
        """A claim whose evidence digests come from Targets.

        Without an explicit ``presentation`` the evidence is disclosed by digest
        under the status the sufficiency implies (GAP → NOT_FOUND).

        Args:
            id: the claim's id (unique within its Result).
            contract_ref: the contract version.
            requirement_ref: the requirement judged.
            tier: ``recomputed`` or ``judged``.
            grade: ``self-attested``, or a higher grade with ``proofs``.
            sufficiency: ``SATISFIED``, ``INSUFFICIENT``, ``GAP`` or ``UNKNOWN``.
            verdict: ``met``, ``not_met`` or ``not_evaluable`` (as the
                sufficiency allows).
            evidence: the cited evidence, as Targets.
            proofs: receipts or inclusion proofs behind the grade.
            presentation: how the evidence is shown, or None for the default.
            implementation: the code identity, for a recomputed claim.

        Returns:
            The claim.

        Raises:
            JudgmentRefusedError: a rule of the claim's schema (named as the
                refusal engine names it), or ``claim_grade_without_proof``.
        """
        refs = [DigestRef.of(t) for t in listed(evidence, "evidence")]
        fields: dict[str, Any] = {
            "id": id, "contract_ref": contract_ref, "requirement_ref": requirement_ref, "tier": tier, "grade": grade,
            "sufficiency": sufficiency, "verdict": verdict, "evidence": refs, "proofs": listed(proofs, "proofs"),
            "presentation": presentation or presentation_for(sufficiency, refs),
        }
        if implementation is not None:
            fields["implementation"] = implementation
        claim = cls(**fields)
        raise_first(_claim_violations(claim))
        _refuse_unbacked_grade(claim)
        return claim


def _refuse_unbacked_grade(claim: Claim) -> None:
    """A claim graded ``witnessed`` or ``countersigned`` needs a proof behind it
    (a receipt or an inclusion proof, as in the published positive vectors):
    with none, the grade would claim what nothing in the record backs."""
    if claim.grade != "self-attested" and not claim.proofs:
        raise JudgmentRefusedError(
            f"claim {claim.id!r} is graded {claim.grade} with no proofs: a grade above self-attested needs a proof "
            "(a ProofRef: receipt or inclusion_proof) behind it; grade it self-attested otherwise",
            rule="claim_grade_without_proof", path="$.proofs")


_STATUS_FOR = {"SATISFIED": "SATISFIED", "INSUFFICIENT": "INSUFFICIENT", "GAP": "NOT_FOUND", "UNKNOWN": "UNKNOWN"}


def presentation_for(sufficiency: str, evidence: Sequence[DigestRef]) -> DisclosureCarrier:
    """The disclosure carrier for evidence the producer holds and may show by
    digest.

    Args:
        sufficiency: the claim's sufficiency (GAP → NOT_FOUND; an unknown
            one → UNKNOWN, which the claim's own check names).
        evidence: the evidence's digests.

    Returns:
        The carrier.

    Raises:
        JudgmentRefusedError: ``evidence`` is not a list.
    """
    status = _STATUS_FOR.get(sufficiency, "UNKNOWN") if isinstance(sufficiency, str) else "UNKNOWN"  # the claim's own check names a bad one
    return DisclosureCarrier(kind="disclosure", status=status, evidence=listed(evidence, "evidence"))  # type: ignore[arg-type]


def _claim_violations(claim: Claim) -> list[Any]:
    """The schema's claim rules, checked on a one-claim Result."""
    probe = {
        "result_version": RESULT_VERSION, "generated_at": "1970-01-01T00:00:00Z", "claims": [claim.to_json()],
        "aggregate": {
            "coverage": {"evaluated_population": 1, "excluded_not_applicable": 0, "unknown_count": int(claim.sufficiency == "UNKNOWN")},
            "buckets": {v: ([claim.id] if v == claim.verdict else []) for v in ("met", "not_met", "not_evaluable")},
        },
    }
    return [v for v in check_body(probe) if v.severity == "error"]


class ProducerDefects(JudgePart):
    """Rows the producer attempted and withheld (their code could not be named), of how many."""

    count: Count
    denominator: Count
    as_of: NonEmpty


class Coverage(JudgePart):
    """How many requirements were evaluated, excluded as not applicable, and left unknown."""

    evaluated_population: Count
    excluded_not_applicable: Count
    unknown_count: Count
    producer_defects: ProducerDefects = None  # type: ignore[assignment]


class Buckets(JudgePart):
    """The claim ids by verdict; each claim in exactly one."""

    met: list[NonEmpty]
    not_met: list[NonEmpty]
    not_evaluable: list[NonEmpty]


class Aggregate(JudgePart):
    """A Result's coverage and buckets, each traceable to its claims."""

    coverage: Coverage
    buckets: Buckets


class View(JudgePart):
    """How a Result is presented (``presentation/v1``): producer name, logo, title."""

    spec_version: Literal["presentation/v1"]
    producer_name: NonEmpty = None  # type: ignore[assignment]
    logo_data_url: NonEmpty = None  # type: ignore[assignment]
    title: NonEmpty = None  # type: ignore[assignment]


def _claim_refusal(exc: ValidationError, fields: dict[str, Any]) -> JudgmentRefusedError:
    """A claim the model refuses, named by the engine's rule when it has one."""
    probe = {**jsonish(fields)}
    for v in check_body({"result_version": RESULT_VERSION, "generated_at": "1970-01-01T00:00:00Z", "claims": [probe],
                         "aggregate": {"coverage": {"evaluated_population": 1, "excluded_not_applicable": 0, "unknown_count": 0},
                                       "buckets": {"met": [], "not_met": [], "not_evaluable": []}}}):
        if v.path.startswith("$.claims[0]"):
            return JudgmentRefusedError(f"claim refused: {v.message}", rule=v.rule, path="$" + v.path[len("$.claims[0]"):])
    return refusal_from(exc, "Claim")


class EvidenceResult(JudgeModel):
    """An Evidence Result v0 document. Constructing one runs the refusal engine."""

    RESULT_VERSION: ClassVar[str] = RESULT_VERSION

    generated_at: NonEmpty
    claims: Annotated[list[Claim], Field(min_length=1)]
    aggregate: Aggregate
    view: View = None  # type: ignore[assignment]

    def __init__(self, **data: Any) -> None:
        if "result_version" in data:
            raise JudgmentRefusedError("result_version comes from the shape", rule="record_version_fixed_by_shape", path="$.result_version")
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise_first(check_body({"result_version": RESULT_VERSION, **jsonish(data)}), RESULT_VERSION)
            raise refusal_from(exc, RESULT_VERSION) from None
        raise_first(check_body(self.body()), RESULT_VERSION)

    def body(self) -> dict[str, Any]:
        """The Result as sealed (JSON), ``result_version`` included.

        Returns:
            The body.
        """
        return {"result_version": RESULT_VERSION, **self.to_json()}

    @property
    def epistemic_type(self) -> str:
        """``derived_metric`` if every claim was recomputed, else ``semantic_judgment``."""
        return str(epistemic_type_of(self.body()))

    @property
    def record_version(self) -> str:
        return RESULT_VERSION

    def target(self) -> Target:
        """This Result as something another record can cite.

        Returns:
            Its Target.
        """
        return Target.of_record(self.body(), type="evidence-result")

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> EvidenceResult:
        """Read a stored Result: the refusal engine first (named rules), then the
        model.

        Args:
            body: the body, ``result_version`` included.

        Returns:
            The Result.

        Raises:
            JudgmentRefusedError: the first rule the body breaks.
        """
        raise_first(check_body(body), RESULT_VERSION)
        return cls(**{k: v for k, v in body.items() if k != "result_version"})


class ResultBuilder:
    """Collect claims; derive coverage and buckets; withhold unnameable recomputed rows.

    Args:
        generated_at: the Result's RFC 3339 timestamp.
        view: the view the Result is computed for, if any.
    """

    def __init__(self, *, generated_at: str, view: View | None = None) -> None:
        self.generated_at = generated_at
        self.view = view
        self.claims: list[Claim] = []
        self.excluded_not_applicable = 0
        self.withheld = 0
        self.recomputed_attempted = 0

    def add(self, claim: Claim) -> Claim:
        """Add a claim.

        Args:
            claim: the claim (:meth:`Claim.of`).

        Returns:
            The claim.

        Raises:
            JudgmentRefusedError: not a Claim, ``claim_grade_without_proof``, or
                ``claim_id_duplicate``.
        """
        if not isinstance(claim, Claim):
            raise JudgmentRefusedError(f"a Result collects Claims (Claim.of(...)), not {type(claim).__name__}", rule="schema_type_mismatch", path="$.claims")
        _refuse_unbacked_grade(claim)
        if any(c.id == claim.id for c in self.claims):
            raise JudgmentRefusedError(f"claim id {claim.id!r} is already in this Result", rule="claim_id_duplicate", path="$.claims")
        if claim.tier == "recomputed":
            self.recomputed_attempted += 1
        self.claims.append(claim)
        return claim

    def withhold_recomputed(self) -> None:
        """A row attempted at tier ``recomputed`` whose code cannot be named: it
        leaves the population and is counted as a producer defect."""
        self.recomputed_attempted += 1
        self.withheld += 1

    def exclude_not_applicable(self, count: int = 1) -> None:
        """Requirements judged NOT_APPLICABLE: counted, never a claim.

        Args:
            count: how many.
        """
        self.excluded_not_applicable += count

    def build(self) -> EvidenceResult:
        """The Result: the claims, their coverage and buckets, and the withheld rows
        as producer defects.

        Returns:
            The Evidence Result.

        Raises:
            JudgmentRefusedError: a rule of the Result's shape (no claims at all
                is ``claims_empty``).
        """
        coverage: dict[str, Any] = {
            "evaluated_population": len(self.claims),
            "excluded_not_applicable": self.excluded_not_applicable,
            "unknown_count": sum(1 for c in self.claims if c.sufficiency == "UNKNOWN"),
        }
        if self.recomputed_attempted:
            coverage["producer_defects"] = ProducerDefects(count=self.withheld, denominator=self.recomputed_attempted, as_of=self.generated_at)
        buckets = Buckets(
            met=[c.id for c in self.claims if c.verdict == "met"],
            not_met=[c.id for c in self.claims if c.verdict == "not_met"],
            not_evaluable=[c.id for c in self.claims if c.verdict == "not_evaluable"],
        )
        fields: dict[str, Any] = {"generated_at": self.generated_at, "claims": self.claims, "aggregate": Aggregate(coverage=Coverage(**coverage), buckets=buckets)}
        if self.view is not None:
            fields["view"] = self.view
        return EvidenceResult(**fields)


# --------------------------------------------------------------------------- code identity


def git_blob_id(data: bytes) -> str:
    """The git (SHA-1) object id of a blob holding ``data``.

    Args:
        data: the blob's bytes.

    Returns:
        40 lowercase hex.
    """
    return hashlib.sha1(b"blob %d\x00" % len(data) + data, usedforsecurity=False).hexdigest()


def git_tree_id(files: dict[str, bytes]) -> str:
    """The git (SHA-1) id of a flat tree of regular files, as ``git write-tree``
    gives for a directory holding exactly those files.

    Args:
        files: file name → bytes.

    Returns:
        40 lowercase hex.

    Raises:
        ValueError: a name that is empty or holds ``/``.
    """
    entries = b""
    for name in sorted(files, key=lambda n: n.encode("utf-8")):
        if "/" in name or not name:
            raise ValueError(f"tree entry name {name!r} must be a plain file name")
        entries += b"100644 " + name.encode("utf-8") + b"\x00" + bytes.fromhex(git_blob_id(files[name]))
    return hashlib.sha1(b"tree %d\x00" % len(entries) + entries, usedforsecurity=False).hexdigest()


def _module_source(obj: Any) -> tuple[str, bytes] | None:
    while isinstance(obj, functools.partial):
        obj = obj.func
    obj = inspect.unwrap(obj) if callable(obj) and not inspect.isclass(obj) else obj
    module = obj if inspect.ismodule(obj) else inspect.getmodule(obj)
    if module is None:
        return None
    try:
        path = inspect.getsourcefile(module)
    except TypeError:
        return None
    if path is None or not Path(path).is_file():
        return None
    name = module.__name__
    if name == "__main__":
        name = Path(path).stem
    return f"{name}.py", Path(path).read_bytes()


def code_identity(*code: Any, name: str, captured_at: str, grade: str = "self-attested") -> Implementation | None:
    """The code identity of the modules defining ``code``, read from their source
    files *now*: at check time, never at install time (an editable tree can
    change with no version change).

    The value is the git-tree id of a flat tree holding each module's source
    under ``<module name>.py``; rows computed by the same code carry the same
    id (comparability). It is capseal's own hash of the source, so it is
    graded ``self-attested``: ``witnessed`` or ``countersigned`` needs a build
    attestation over the digest, which this function does not have.

    Args:
        *code: functions, classes or modules.
        name: the implementation's name.
        captured_at: when it is read (RFC 3339 UTC).
        grade: ``self-attested`` only.

    Returns:
        The identity, or None when any source cannot be read (the caller then
        withholds the row and counts it; it never relabels it ``judged``).

    Raises:
        JudgmentRefusedError: ``code_identity_overgraded`` for any other grade.
    """
    if grade != "self-attested":
        raise JudgmentRefusedError(
            f"code_identity computes capseal's own hash of the source, a self-attested identity (comparability only); "
            f"grade {grade!r} would claim checkability that no build attestation backs",
            rule="code_identity_overgraded", path="$.implementation.grade")
    files: dict[str, bytes] = {}
    for obj in code:
        found = _module_source(obj)
        if found is None:
            return None
        files[found[0]] = found[1]
    if not files:
        return None
    return Implementation(name=name, code_digest=CodeDigest(alg="git-tree", value=git_tree_id(files)), grade=grade, captured_at=captured_at)  # type: ignore[arg-type]

