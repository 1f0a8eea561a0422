"""The closed vocabularies of judgment records, in one place.

Why one module: every rule in ``capseal.judge`` (refusals, links, the store header,
the verifier) reads the same tables, and ``schemas.parity()`` checks that the
shape table below agrees with the shipped schemas' ``const`` values and with the
vendored Evidence Layer set. A second hand-typed copy anywhere would drift.

Sources: judge-record-family-v1 (the eight shapes), evidence-result-v0, the
Evidence Layer draft -00 §4.1 (epistemic types) and §5 (typed links).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

__all__ = [
    "EPISTEMIC_TYPES",
    "EpistemicType",
    "LINK_TYPES",
    "LinkType",
    "Shape",
    "SHAPES",
    "RESULT_VERSION",
    "RESULT_RECORD_TYPE",
    "ARTIFACT_VERSION",
    "ARTIFACT_RECORD_TYPE",
    "JUDGMENT_STORE_VERSION",
    "RECORD_TYPE_PREFIX",
    "CASE_VERDICTS",
    "ADJUDICATION_VERDICTS",
    "SUFFICIENCY",
    "TIERS",
    "GRADES",
    "record_type_for",
    "shape_for_record_type",
]

#: EL -00 §4.1 (REGISTRY §17): the closed set, lowercase, in the vendored order.
EpistemicType = Literal[
    "observed_event",
    "system_of_record_fact",
    "producer_claim",
    "human_report",
    "semantic_judgment",
    "derived_metric",
    "adjudication",
    "obligation_reference",
]
EPISTEMIC_TYPES: tuple[str, ...] = get_args(EpistemicType)

#: EL -00 §5 (REGISTRY §18): the six typed links. Tokens are never overloaded.
LINK_TYPES: tuple[str, ...] = ("cites", "adjudicates", "supersedes", "acknowledges", "rebuts", "closes")
LinkType = Literal["cites", "adjudicates", "supersedes", "acknowledges", "rebuts", "closes"]

RECORD_TYPE_PREFIX = "judge:"
JUDGMENT_STORE_VERSION = "capseal-judgment/1"


@dataclass(frozen=True)
class Shape:
    """One judge-family record shape: its version string, the epistemic type the
    schema fixes as a ``const``, and the schema file that describes it."""

    record_version: str
    epistemic_type: str
    schema: str
    timestamp: str  # the member that dates the record

    @property
    def record_type(self) -> str:
        """The store header's ``record_type`` for this shape (``judge:<shape>``)."""
        return RECORD_TYPE_PREFIX + self.record_version

    @property
    def name(self) -> str:
        return self.record_version.split("/", 1)[0]


#: judge-record-family-v1 §1–§8. The epistemic type is a property of the shape.
SHAPES: dict[str, Shape] = {
    s.record_version: s
    for s in (
        Shape("contract-compile/v1", "producer_claim", "judge/contract-compile-v1.json", "compiled_at"),
        Shape("evaluation-report/v1", "semantic_judgment", "judge/evaluation-report-v1.json", "generated_at"),
        Shape("close/v1", "producer_claim", "judge/close-v1.json", "closed_at"),
        Shape("sample-manifest/v1", "producer_claim", "judge/sample-manifest-v1.json", "generated_at"),
        Shape("human-rating/v1", "human_report", "judge/human-rating-v1.json", "rated_at"),
        Shape("adjudication/v1", "adjudication", "judge/adjudication-v1.json", "adjudicated_at"),
        Shape("adjudication-response/v1", "producer_claim", "judge/adjudication-response-v1.json", "responded_at"),
        Shape("calibration-summary/v1", "derived_metric", "judge/calibration-summary-v1.json", "computed_at"),
    )
}

#: Evidence Result v0: not a judge-family shape (no epistemic_type member); its
#: store type is derived from its claims' tiers (see ``rules.epistemic_type_of``).
RESULT_VERSION = "evidence-result-v0"
RESULT_RECORD_TYPE = RECORD_TYPE_PREFIX + "evidence-result/v0"
RESULT_SCHEMA = "evidence-result-v0.json"

#: Content-addressed bytes a judgment cites (a rubric, a prompt, a payload, a
#: blind packet) kept in the same store so every cited digest can resolve.
ARTIFACT_VERSION = "capseal-artifact/1"
ARTIFACT_RECORD_TYPE = RECORD_TYPE_PREFIX + "artifact/v1"

CASE_VERDICTS = ("met", "not_met", "not_evaluable")
ADJUDICATION_VERDICTS = ("corroborated", "inconclusive", "contradicted")
SUFFICIENCY = ("SATISFIED", "GAP", "INSUFFICIENT", "UNKNOWN")
TIERS = ("recomputed", "judged")
GRADES = ("self-attested", "witnessed", "countersigned")


def record_type_for(record_version: str) -> str:
    """The store ``record_type`` for a body's version.

    Args:
        record_version: a body's ``record_version`` or ``result_version``.

    Returns:
        ``judge:<version>``.

    Raises:
        KeyError: no shape has that version.
    """
    if record_version == RESULT_VERSION:
        return RESULT_RECORD_TYPE
    shape = SHAPES.get(record_version)
    if shape is None:
        raise KeyError(record_version)
    return shape.record_type


def shape_for_record_type(record_type: str) -> Shape | None:
    """The judge-family shape a store ``record_type`` names.

    Args:
        record_type: a store header's record type.

    Returns:
        The shape, or None for any other record type.
    """
    if not record_type.startswith(RECORD_TYPE_PREFIX):
        return None
    return SHAPES.get(record_type[len(RECORD_TYPE_PREFIX):])
