"""The ruling two halves and a referee's re-answer give (V1–V8). Pure functions.

Checked in this order:

* V1 — a forged half (its record fails its own checks), or an answer that is not
  the body its record signs → refused (``PairRefusedError``); no ruling.
* V2 — a provider's half that holds no answer → no verdict (``no_requester_transcript``).
* V3 — the twins sampled (the ruling path's reading), or their weights are
  unknown → ``not_comparable``; their weights differ → ``weights_mismatch``.
* V4 — no serving node named → ``owner_absent``; both from one node → ``same_owner_twin``.
* V5 — the words are the same → **corroborated**, without a referee.
* V6 — the words differ and there is no referee → **inconclusive**, never a contradiction.
* V7 — the referee is one of the twins → ``referee_not_independent``; it does not
  answer → ``referee_unreachable``.
* V8 — with ``at`` the divergence index: when half A's request carries messages,
  the referee's first ``at`` words must repeat the agreed words and its word at
  ``at`` decides; with no disclosed request its first word decides. If exactly one
  twin has that word at ``at``, **the other** is ``contradicted:<node>``; otherwise
  inconclusive (an empty re-answer is inconclusive).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from capseal.canonical import capsule_id
from capseal.errors import PairRefusedError

from .comparison import Comparison, compare, token_at, words
from .halves import Half, answer_problem, sampled_on_ruling
from .vocab import VERDICT_CORROBORATED, VERDICT_INCONCLUSIVE, contradicted

__all__ = ["Outcome", "adjudicate", "referee_verdict", "request_has_messages", "STATUS_FOR_VERDICT", "status_for_verdict"]

#: the mesh's status beside a verdict
STATUS_FOR_VERDICT = {"corroborated": "SATISFIED", "inconclusive": "UNKNOWN", "not_comparable": "UNKNOWN"}


def status_for_verdict(verdict: str) -> str | None:
    """The mesh's status beside a verdict.

    Args:
        verdict: a verdict token.

    Returns:
        SATISFIED, UNKNOWN or CONTRADICTED for a known verdict; None for any
        other (never rounded to a known one).
    """
    if verdict.startswith("contradicted:") and len(verdict) > len("contradicted:"):
        return "CONTRADICTED"
    return STATUS_FOR_VERDICT.get(verdict)


@dataclass(frozen=True)
class Outcome:
    """A ruling, or why there is none — never both."""

    verdict: str | None
    no_verdict_reason: str | None
    divergence_index: int | None = None
    prefix_digest: str | None = None
    twin_owner_distinct: bool | None = None
    #: the weights both halves name; None unless both name the same
    weights_digest: str | None = None
    referee_called: bool = False


def request_has_messages(request: Any) -> bool:
    """Whether a request carried chat messages (a re-answer of it repeats the agreed words).

    Args:
        request: the disclosed request body, or None.

    Returns:
        True for a non-empty ``messages`` member.
    """
    messages = request.get("messages") if isinstance(request, Mapping) else None
    if isinstance(messages, bool):
        return messages
    if isinstance(messages, (list, dict, str)):
        return len(messages) > 0
    if isinstance(messages, (int, Decimal)):
        return messages != 0
    return False


def referee_verdict(a: Half, b: Half, comparison: Comparison, referee_text: str) -> str:
    """V8: the verdict a re-answer gives on two twins that differ.

    Args:
        a: half A (its request decides whether the agreed words must be repeated).
        b: half B.
        comparison: ``compare(a.text, b.text)``.
        referee_text: the referee's re-answer.

    Returns:
        ``contradicted:<node>`` naming the twin the referee did **not** agree
        with, or ``inconclusive``.
    """
    at = comparison.divergence_index or 0
    if request_has_messages(a.request):
        agreed = words(a.text)[:at]
        theirs = words(referee_text)
        token = token_at(referee_text, at) if theirs[:at] == agreed else None
    else:
        token = token_at(referee_text, 0)
    matches_a = token is not None and token == token_at(a.text, at)
    matches_b = token is not None and token == token_at(b.text, at)
    if matches_a == matches_b:
        return VERDICT_INCONCLUSIVE
    other = b if matches_a else a
    node = other.facts.get("node_id")
    return contradicted(node) if isinstance(node, str) and node else VERDICT_INCONCLUSIVE


def _check_record(half: Half, i: int) -> None:
    try:
        intact = capsule_id(half.capsule) == half.capsule.get("capsule_id")
    except Exception:  # a record that cannot be canonicalized is not intact
        intact = False
    if not intact:
        raise PairRefusedError(f"half {i}'s record fails its own checks (it changed after sealing)", rule="V1",
                               reason="half_forged", path=f"$.halves[{i}]")


def adjudicate(
    a: Half,
    b: Half,
    referee: Callable[[], str | None] | None = None,
    referee_node_id: str | None = None,
    *,
    unknown_weights: str = "not_comparable",
) -> Outcome:
    """Compare two halves and, when they differ, read a referee's re-answer (V1–V8).

    Args:
        a: half A.
        b: half B.
        referee: called (once) only when the words differ; returns the re-answer
            text, or None when the referee did not answer. None: no referee.
        referee_node_id: who the referee is (V7).
        unknown_weights: ``not_comparable`` (the rule) or ``compare`` (the
            referee's own door, which states the reason itself).

    Returns:
        The :class:`Outcome`.

    Raises:
        PairRefusedError: V1 — a forged half or an answer that is not its signed body.
    """
    for i, half in enumerate((a, b)):
        _check_record(half, i)
    problems = [answer_problem(h.capsule, h.body, h.text) for h in (a, b)]
    if "no_requester_transcript" in problems:
        return Outcome(None, "no_requester_transcript")
    for i, problem in enumerate(problems):
        if problem is not None:
            raise PairRefusedError(f"half {i}'s answer is not the body its record signs", rule="V1",
                                   reason="answer_not_the_signed_body", path=f"$.halves[{i}]")
    if sampled_on_ruling(a) or sampled_on_ruling(b):
        return Outcome(None, "not_comparable")
    wa, wb = a.facts.get("weights_digest"), b.facts.get("weights_digest")
    if unknown_weights == "not_comparable" and not (wa and wb):
        return Outcome(None, "not_comparable")
    if wa and wb and wa != wb:
        return Outcome(None, "weights_mismatch")
    shared = wa if wa and wb else None
    owner_a, owner_b = a.facts.get("node_id"), b.facts.get("node_id")
    if not owner_a or not owner_b:
        return Outcome(None, "owner_absent", weights_digest=shared)
    if owner_a == owner_b:
        return Outcome(None, "same_owner_twin", twin_owner_distinct=False, weights_digest=shared)
    comparison = compare(a.text, b.text)

    def compared(verdict: str | None, reason: str | None, called: bool = False) -> Outcome:
        """The outcome with the comparison's facts."""
        return Outcome(verdict, reason, comparison.divergence_index, comparison.prefix_digest, True, shared, called)

    if comparison.same:
        return compared(VERDICT_CORROBORATED, None)
    if referee is None:
        return compared(VERDICT_INCONCLUSIVE, None)
    if referee_node_id is not None and referee_node_id in (owner_a, owner_b):
        return compared(None, "referee_not_independent")
    text = referee()
    if text is None:
        return compared(None, "referee_unreachable")
    return compared(referee_verdict(a, b, comparison, text), None, True)
