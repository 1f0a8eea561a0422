"""The closed words of the twin comparison: row states, reasons, verdicts, record types.

A *row* is what the rules say of one pair, exactly as they write it:

* ``{"state": "adjudicated", "referee": <node>, "tier": 1 | 2, "verdict": <verdict>}``
* ``{"state": "not_adjudicated", "reason": <reason>}``, and for ``not_comparable``
  also ``"because": <why>``.

Every case without a ruling gets a ``not_adjudicated`` row naming its reason,
and none of them counts against anyone. :func:`counts_against` is the only
reading of a row that names a node: the one after ``contradicted:``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "STATE_ADJUDICATED", "STATE_NOT_ADJUDICATED", "REASONS", "BECAUSE", "CALL_REASONS",
    "VERDICT_CORROBORATED", "VERDICT_INCONCLUSIVE", "VERDICT_NOT_COMPARABLE", "CONTRADICTED_PREFIX",
    "TIERS", "PAIR_STATES", "BOOK_VERSION", "BOOK_ROW_TYPE", "HELD_HALF_TYPE", "RECORD_TYPE_PREFIX",
    "STATEMENT_VERSION", "STATEMENT_TYPE", "SERVING_MEMBER", "ROLE_PROVIDER", "ROLE_REFEREE",
    "CAPTURE_REPLAY", "CAPTURE_HTTP", "not_adjudicated", "adjudicated", "contradicted", "counts_against",
    "row_problem",
]

STATE_ADJUDICATED = "adjudicated"
STATE_NOT_ADJUDICATED = "not_adjudicated"

#: why a pair has no ruling (each makes 0 referee calls unless marked in CALL_REASONS)
REASONS = (
    "off", "host_does_not_mark_twins", "not_comparable", "twins_agree",
    "no_eligible_referee", "referee_unreachable", "referee_cannot_sign",
)
#: the reasons of a pair whose one call was made (spent)
CALL_REASONS = ("referee_unreachable", "referee_cannot_sign")
#: ``because`` of a ``not_comparable`` row
BECAUSE = ("sampled", "model_hash_unknown", "model_hash_differs", "weights_unknown", "weights_differ")

VERDICT_CORROBORATED = "corroborated"
VERDICT_INCONCLUSIVE = "inconclusive"
VERDICT_NOT_COMPARABLE = "not_comparable"
CONTRADICTED_PREFIX = "contradicted:"

#: a referee is asked from tier 1 (a corroboration for the model) or tier 2 (none yet)
TIERS = (1, 2)

#: the three states of a pair (bilateral attestation): both present and agreeing,
#: both present and disagreeing, and one half unavailable (an orphan: a defined
#: state, never tampering)
PAIR_STATES = ("halves_agree", "halves_disagree", "one_half_unavailable")

BOOK_VERSION = "capseal-referee-book/1"
RECORD_TYPE_PREFIX = "referee:"
BOOK_ROW_TYPE = "referee:book-row"
HELD_HALF_TYPE = "referee:held-half"

#: the referee's signed statement of its ruling (cited by the adjudication/v1 as its ``referee``)
STATEMENT_VERSION = "capseal-referee-statement/1"
STATEMENT_TYPE = "referee-statement"

#: the member of ``model_attestation.compute_attestation`` where a serving node
#: signs who served, in which role, on which model and weights
SERVING_MEMBER = "x-twin-serving-v1"
ROLE_PROVIDER = "provider"
ROLE_REFEREE = "referee"

CAPTURE_REPLAY = "deterministic_replay"
CAPTURE_HTTP = "http_chat_completion"


def not_adjudicated(reason: str, because: str | None = None) -> dict[str, str]:
    """The row of a pair without a ruling.

    Args:
        reason: one of :data:`REASONS`.
        because: for ``not_comparable`` only, one of :data:`BECAUSE`.

    Returns:
        ``{"state": "not_adjudicated", "reason": …[, "because": …]}``.

    Raises:
        ValueError: an unknown reason or ``because``, or ``because`` on another reason.
    """
    if reason not in REASONS:
        raise ValueError(f"{reason!r} is not a not_adjudicated reason")
    if (because is not None) != (reason == "not_comparable") or (because is not None and because not in BECAUSE):
        raise ValueError(f"because={because!r} does not go with reason {reason!r}")
    row = {"state": STATE_NOT_ADJUDICATED, "reason": reason}
    if because is not None:
        row["because"] = because
    return row


def contradicted(node_id: str) -> str:
    """The verdict naming the twin the referee did not agree with.

    Args:
        node_id: that twin's node id.

    Returns:
        ``contradicted:<node_id>``.
    """
    return CONTRADICTED_PREFIX + node_id


def adjudicated(verdict: str, referee: str, tier: int) -> dict[str, Any]:
    """The row of a pair a referee ruled on.

    Args:
        verdict: ``corroborated``, ``inconclusive`` or ``contradicted:<node>``.
        referee: the referee's node id.
        tier: the tier it was asked from (1 or 2).

    Returns:
        ``{"state": "adjudicated", "referee": …, "tier": …, "verdict": …}``.

    Raises:
        ValueError: a verdict, referee or tier the rules do not write.
    """
    if verdict not in (VERDICT_CORROBORATED, VERDICT_INCONCLUSIVE) and not (
            verdict.startswith(CONTRADICTED_PREFIX) and len(verdict) > len(CONTRADICTED_PREFIX)):
        raise ValueError(f"{verdict!r} is not a ruling verdict")
    if not isinstance(referee, str) or not referee or type(tier) is not int or tier not in TIERS:
        raise ValueError("an adjudicated row names its referee and the tier (1 or 2) it was asked from")
    return {"state": STATE_ADJUDICATED, "referee": referee, "tier": tier, "verdict": verdict}


def counts_against(row: Mapping[str, Any] | None) -> str | None:
    """P5: the node a row counts against.

    Args:
        row: a row, or None.

    Returns:
        The node after ``contradicted:`` in an adjudicated row, else None.
    """
    if not isinstance(row, Mapping) or row.get("state") != STATE_ADJUDICATED:
        return None
    verdict = row.get("verdict")
    if isinstance(verdict, str) and verdict.startswith(CONTRADICTED_PREFIX) and len(verdict) > len(CONTRADICTED_PREFIX):
        return verdict[len(CONTRADICTED_PREFIX):]
    return None


def row_problem(row: Any) -> str | None:
    """Whether ``row`` is a row the rules write.

    Args:
        row: the value.

    Returns:
        Why it is not one, or None when it is.
    """
    if not isinstance(row, Mapping):
        return "a row is an object"
    state = row.get("state")
    if state == STATE_ADJUDICATED:
        if set(row) != {"state", "referee", "tier", "verdict"}:
            return "an adjudicated row holds exactly state, referee, tier and verdict"
        try:
            adjudicated(row["verdict"], row["referee"], row["tier"])
        except (ValueError, AttributeError) as exc:
            return str(exc)
        return None
    if state == STATE_NOT_ADJUDICATED:
        extra = set(row) - {"state", "reason", "because"}
        if extra:
            return f"a not_adjudicated row carries no {sorted(extra)}"
        try:
            not_adjudicated(row.get("reason"), row.get("because"))  # type: ignore[arg-type]
        except (ValueError, TypeError) as exc:
            return str(exc)
        return None
    return f"state {state!r} is neither adjudicated nor not_adjudicated"
