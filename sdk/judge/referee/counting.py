"""Counting rulings, locally (never a score).

* A ruling counts only if it verifies under the referee's announced key
  (:func:`~.check.verify_ruling`), and once per referee per pair.
* A contradiction of one twin is a corroboration of the other; a
  corroboration is one for both twins; ``inconclusive`` and every
  ``not_adjudicated`` row count for nobody.
* Each counted verdict is dated by *this* node's book row (``at``), the ``t``
  of a bar (B2).
* Stop routing is opt-in: after ``n`` contradictions of a node within ``days``
  days, each referee contributing at most ``n − 1`` (so no single referee can
  stop traffic to a node alone).

What comes out is counts per node and model (:class:`Tally`) and yes/no
answers; nothing here divides, weighs or ranks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from capseal.errors import RefereeInputError

from .bar import Recorded, parse_time
from .book import Book
from .check import verify_ruling
from .selection import Candidate
from .vocab import STATE_ADJUDICATED, VERDICT_CORROBORATED, counts_against

__all__ = ["Counted", "Tally", "counted_rulings", "tally", "StopRouting"]


@dataclass(frozen=True)
class Counted:
    """One counted verdict about a twin, with the referee that gave it."""

    recorded: Recorded
    referee: str | None


@dataclass(frozen=True)
class Tally:
    """How many counted corroborations and contradictions a node has for a model."""

    node_id: str
    model_hash: str | None
    corroborated: int
    contradicted: int

    def to_json(self) -> dict[str, Any]:
        """The counts as JSON.

        Returns:
            ``{node_id, model_hash, corroborated, contradicted}``.
        """
        return {"node_id": self.node_id, "model_hash": self.model_hash, "corroborated": self.corroborated,
                "contradicted": self.contradicted}


def counted_rulings(book: Book, roster: Iterable[Candidate],
                    checked: dict[tuple[str, str, str | None], Any] | None = None) -> list[Counted]:
    """The verdicts this node's book counts: one per referee per pair, each
    ruling verified under the referee's announced key in ``roster``.

    Args:
        book: this node's book (its ledger holds the rulings).
        roster: the nodes and their announced keys.
        checked: reports of rulings verified before, by (ruling, statement,
            referee key id); filled in as rulings are verified (the ledger is
            append-only, so a ruling verified once stays as it was).

    Returns:
        The counted verdicts, in book order.

    Raises:
        LedgerCorruptError: a book row the book does not write.
    """
    roster = list(roster)
    keys = {c.node_id: c.announced_key for c in roster}
    kids = {c.node_id: c.kid for c in roster}
    seen: set[tuple[str, Any]] = set()
    out: list[Counted] = []
    for row in book.rows():
        if row.row.get("state") != STATE_ADJUDICATED or row.ruling_id is None or row.statement_id is None:
            continue
        referee = str(row.row["referee"])
        if (referee, row.key) in seen or keys.get(referee) is None:
            continue
        memo = (row.ruling_id, row.statement_id, kids[referee])
        report = checked.get(memo) if checked is not None else None
        if report is None:
            report = verify_ruling(book.ledger, statement_id=row.statement_id, ruling_id=row.ruling_id,
                                   referee_key=keys[referee], expect={"referee": referee, "tier": row.row["tier"],
                                                                      "capsule_ids": list(row.capsule_ids)})
            if checked is not None:
                checked[memo] = report
        if not report.ok:
            continue
        seen.add((referee, row.key))
        at = parse_time(row.at)
        against = counts_against(row.row)
        twins = row.key[2]
        if against is not None:
            out.append(Counted(Recorded(against, report.model_hash, "contradicted", at), referee))
            out.extend(Counted(Recorded(t, report.model_hash, "corroborated", at), referee) for t in twins if t != against)
        elif row.row.get("verdict") == VERDICT_CORROBORATED:
            out.extend(Counted(Recorded(t, report.model_hash, "corroborated", at), referee) for t in twins)
    return out


def tally(records: Iterable[Recorded]) -> list[Tally]:
    """Counts per node and model (never a rate or a score).

    Args:
        records: counted verdicts.

    Returns:
        One :class:`Tally` per node and model, sorted by node id then model.
    """
    counts: dict[tuple[str, str | None], list[int]] = {}
    for r in records:
        slot = counts.setdefault((r.node_id, r.model_hash), [0, 0])
        slot[0 if r.bucket == "corroborated" else 1] += 1
    return [Tally(node, model, c, x) for (node, model), (c, x) in sorted(counts.items(), key=lambda kv: (kv[0][0], kv[0][1] or ""))]


@dataclass(frozen=True)
class StopRouting:
    """The opt-in rule: stop routing to a node after ``n`` contradictions in
    ``days`` days, at most ``n − 1`` of them from any one referee.

    Raises:
        RefereeInputError: ``n`` is not an integer ≥ 2 or ``days`` not a positive integer.
    """

    n: int
    days: int

    def __post_init__(self) -> None:
        if type(self.n) is not int or self.n < 2:
            raise RefereeInputError(f"stop routing takes n ≥ 2 contradictions (one referee gives at most n − 1), "
                                    f"not {self.n!r:.20}", path="$.stop_routing.n")
        if type(self.days) is not int or self.days <= 0:
            raise RefereeInputError(f"days is a positive integer, not {self.days!r:.20}", path="$.stop_routing.days")

    def applies(self, node_id: str, counted: Sequence[Counted], now: datetime, *, model_hash: str | None = None) -> bool:
        """Whether routing to ``node_id`` stops at ``now``.

        A contradiction counts when recorded in ``(now − days, now]``; a
        contradiction with no named referee counts under one shared bucket.

        Args:
            node_id: the node.
            counted: the counted verdicts (with their referees).
            now: this node's clock.
            model_hash: only this model's contradictions, when given.

        Returns:
            True when at least ``n`` contradictions count, each referee giving at most ``n − 1``.
        """
        since = now - timedelta(days=self.days)
        per_referee: dict[str | None, int] = {}
        for c in counted:
            r = c.recorded
            if r.node_id != node_id or r.bucket != "contradicted" or not since < r.recorded_at <= now:
                continue
            if model_hash is not None and r.model_hash != model_hash:
                continue
            per_referee[c.referee] = per_referee.get(c.referee, 0) + 1
        return sum(min(k, self.n - 1) for k in per_referee.values()) >= self.n

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> StopRouting:
        """The rule from its JSON form.

        Args:
            value: ``{"n", "days"}``.

        Returns:
            The rule.

        Raises:
            RefereeInputError: as the constructor refuses.
        """
        return cls(value.get("n"), value.get("days"))  # type: ignore[arg-type]

