"""Reading referee book rows, by their JSON shape alone.

A row is ``{"state": "adjudicated", "verdict", "referee", "tier"}`` or
``{"state": "not_adjudicated", "reason"[, "because"]}``; a book entry wraps it:
``{"book_version": "capseal-referee-book/1", "pair": {..., "node_ids": [a, b]},
"capsule_ids", "row", "called", "at", …}``.

* adjudicated ``corroborated`` / ``inconclusive`` / ``contradicted:<node>`` /
  ``not_comparable``: read like ``adjudication/v1`` (ACCEPTED, UNDECIDED,
  REJECTED for the node and ACCEPTED for its twin, NOT_APPLICABLE), one part
  per node of the pair;
* not_adjudicated ``referee_unreachable`` or ``referee_cannot_sign``: the call
  was spent and reached no ruling, an instrument outcome: NOT_ASSESSED;
* every other not_adjudicated reason (``off``, ``host_does_not_mark_twins``,
  ``twins_agree``, ``no_eligible_referee``, ``not_comparable`` with its
  ``because``): nobody ruled. No reading, and no item: it is never tallied.

A book entry naming the ``adjudication/v1`` sealed for its ruling
(``ruling_id``) reads as above but gives no items of its own: that sealed
ruling is the verdict a consumer counts, and one ruling is counted once.
"""

from __future__ import annotations

from typing import Any

from .defects import Findings
from .model import Check, JudgeSeat, Stage
from .parts import ROOT, Part, RecordReading, record_reading, text, token
from .reading import token_reading
from .values import brief

__all__ = ["read_book_row", "BOOK_VERSION", "is_book_row"]

BOOK_VERSION = "capseal-referee-book/1"
_STATES = ("adjudicated", "not_adjudicated")
_REASONS = ("off", "host_does_not_mark_twins", "not_comparable", "twins_agree", "no_eligible_referee",
            "referee_unreachable", "referee_cannot_sign")
_SPENT = ("referee_unreachable", "referee_cannot_sign")
_BECAUSE = ("sampled", "model_hash_unknown", "model_hash_differs", "weights_unknown", "weights_differ")
_VERDICTS = ("corroborated", "inconclusive", "not_comparable")


def is_book_row(value: Any) -> bool:
    """Is ``value`` a book entry (``book_version`` and ``row``) or a bare row (``state``)?

    Args:
        value: any value.

    Returns:
        True for a book entry or a bare row.
    """
    if not isinstance(value, dict):
        return False
    return "book_version" in value and "row" in value or value.get("state") in _STATES


def _nodes(entry: dict[str, Any] | None, found: Findings) -> list[str | None]:
    pair = entry.get("pair") if entry is not None else None
    nodes = pair.get("node_ids") if isinstance(pair, dict) else None
    if isinstance(nodes, list) and len(nodes) == 2 and all(isinstance(n, str) for n in nodes):
        return list(nodes)
    if entry is not None:
        found.absent(f"{ROOT}.pair", "node_ids", "the book entry does not name the pair's two nodes")
    return []


def _adjudicated(row: dict[str, Any], at: str, nodes: list[str | None], found: Findings) -> tuple[Stage, list[Stage], str | None]:
    raw = row.get("verdict")
    node: str | None = None
    if isinstance(raw, str) and raw.startswith("contradicted:"):
        verdict: str | None = "contradicted"
        node = raw[len("contradicted:"):] or None
        if node is None:
            found.unparseable(at, "verdict", "a contradiction names the node it counts against")
            found.undetermined()
    else:
        verdict = token(raw, at, "verdict", _VERDICTS, found)
    referee = text(row.get("referee"))
    if referee is None:
        found.absent(at, "referee", "an adjudicated row names its referee")
    tier = row.get("tier")
    if not (type(tier) is int and tier in (1, 2)):
        found.unparseable(at, "tier", f"the tier a referee was asked from is 1 or 2, not {brief(tier)}")
    if node is not None and nodes and node not in nodes:
        found.inconsistent(at, "verdict", f"the row counts against {brief(node)}, which is neither node of the pair")
    if node is not None and not nodes:
        found.undetermined()  # the twin that is corroborated is not named
    checks = (Check("tier", type(tier) is int and tier in (1, 2), f"tier {brief(tier)}"),)
    stages: list[Stage] = []
    party_nodes = nodes or ([node] if node is not None else [])
    for n in party_nodes:
        if verdict == "contradicted":
            status = None if node is None or (nodes and node not in nodes) else "contradicted" if n == node else "corroborated"
        else:
            status = verdict if verdict in _VERDICTS else None
        stages.append(Stage(stage=n, path=(n,) if n else (), status=status,
                            judges=(JudgeSeat(0, referee or "", status=status, checks=checks),)))
    root = Stage(status=verdict, judges=(JudgeSeat(0, referee or "", status=verdict, checks=checks),))
    return root, stages, token_reading(verdict)


def read_book_row(value: dict[str, Any]) -> RecordReading:
    """A book entry or a bare row.

    Args:
        value: a book entry or a bare row.

    Returns:
        The row's RecordReading.
    """
    found = Findings()
    entry = value if "row" in value and "state" not in value else None
    source = 0
    if entry is not None:
        version = entry.get("book_version")
        if version == BOOK_VERSION:
            source = 1
        else:
            found.unknown(ROOT, "book_version", f"book_version {brief(version)} is not {BOOK_VERSION}")
    row = entry.get("row") if entry is not None else value
    at = f"{ROOT}.row" if entry is not None else ROOT
    form = BOOK_VERSION if entry is not None else "referee-book-row"
    if not isinstance(row, dict):
        found.absent(ROOT, "row", "the book entry holds no row")
        found.undetermined()
        return record_reading(form=form, source_version=source, root=Stage(), reading=None, found=found)
    state = token(row.get("state"), at, "state", _STATES, found)
    nodes = _nodes(entry, found)
    called = entry.get("called") if entry is not None else None
    if state == "adjudicated":
        root, stages, reading = _adjudicated(row, at, nodes, found)
        if entry is not None and called is not True:
            found.inconsistent(ROOT, "called", "an adjudicated pair was ruled on by a referee it called; the entry says called: "
                               f"{brief(called)}")
        ruled_elsewhere = entry is not None and isinstance(entry.get("ruling_id"), str)
        parts = () if ruled_elsewhere else tuple(Part(f"node {s.stage}", j, s, token_reading(s.status)) for j, s in enumerate(stages))
        return record_reading(form=form, source_version=source, root=root, stages=tuple(stages), parts=parts,
                              reading=reading, found=found)
    reason = token(row.get("reason"), at, "reason", _REASONS, found) if state == "not_adjudicated" else None
    because = None
    if reason == "not_comparable":
        because = token(row.get("because"), at, "because", _BECAUSE, found, required=False)
        if row.get("because") is None:
            found.absent(at, "because", "a not_comparable row says why the twins cannot be compared")
    spent = reason in _SPENT
    if entry is not None and reason in _REASONS and called is not None and called is not spent:
        found.inconsistent(ROOT, "called", f"a {reason} row {'spent' if spent else 'makes'} "
                           f"{'its' if spent else 'no'} call; the entry says called: {brief(called)}")
    reasoning = f"because {because}" if because is not None else None
    root = Stage(status=state, reason_code=reason, reasoning=reasoning)  # no referee sat
    reading = "NOT_ASSESSED" if spent else None
    parts = (Part("ruling", 0, root, reading),) if spent else ()
    return record_reading(form=form, source_version=source, root=root, parts=parts, reading=reading, found=found)
