"""The comparing node: one call ties the rules together (:class:`Referee`).

``Referee.consider(pair)`` runs, in order: the book (P2: a pair whose call was
made returns its row with 0 calls; P3: ``no_eligible_referee`` is not retried
unless the operator re-asks), the gates (G1–G6), selection (S1–S3, the bar),
the row written **before** the call (P6), the call through the injected
transport, the referee's ruling (V1–V8) checked under its announced key and
the tier it was asked from (S4), and the final row. It returns the rules'
answer ``{"counts_against", "referee_calls", "row"}``.

A referee that does not answer is ``referee_unreachable``; one that answers
but has no seat here (it cannot sign), refuses, or signs a ruling that does not
verify under its announced key at the tier asked is ``referee_cannot_sign``.
Both spend the call.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from capseal.errors import CapsealError, RefereeInputError, RefereeUnreachableError

from .bar import Recorded, format_time, parse_time
from .book import Book, BookRow, CallClaimed, HeldHalf
from .check import RulingReport, verify_ruling
from .counting import Counted, StopRouting, counted_rulings
from .gates import Settings, before_asking
from .halves import Half
from .pairs import Pair
from .ruling import RefereeSeat, Refusal, Ruling
from .selection import Candidate, Draw, Selection, UniformDraw, select, why_not
from .transports import Transport, reanswer_request
from .vocab import adjudicated, counts_against, not_adjudicated

__all__ = ["Referee", "RuleAnswer", "utc_now"]


def utc_now() -> str:
    """This node's clock.

    Returns:
        Now as an RFC 3339 UTC timestamp, to the second.
    """
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass(frozen=True)
class RuleAnswer:
    """What the rules answer for one pair, and what led there."""

    row: dict[str, Any]
    referee_calls: int
    pair: Pair
    book_row: BookRow | None = None
    selection: Selection | None = None
    ruling: RulingReport | None = None
    #: why each roster node was not eligible (node id → rule), when selection ran
    ineligible: dict[str, str] = field(default_factory=dict)
    refusal: str | None = None

    @property
    def counts_against(self) -> str | None:
        """The node after ``contradicted:``, or None (P5)."""
        return counts_against(self.row)

    def to_json(self) -> dict[str, Any]:
        """The rules' answer.

        Returns:
            ``{"counts_against", "referee_calls", "row"}``.
        """
        return {"counts_against": self.counts_against, "referee_calls": self.referee_calls, "row": dict(self.row)}


class Referee:
    """The comparing node's referee machinery over its book.

    Args:
        book: the book of pairs (its ledger also keeps the halves and rulings).
        roster: the nodes this node knows (candidates, and the twins' announced keys).
        settings: the operator's settings (the switch is off unless set on).
        transport: fetches a referee's re-answer; None: every call is unreachable.
        seats: the referee seats that can sign here, by node id (or a lookup).
        history: verdicts this node recorded elsewhere (the book's own are added).
        clock: this node's clock (RFC 3339 UTC); injected so tests move time.
        draw: the random source of the pick (default: CSPRNG, rejection sampling).
        stop_routing: the opt-in stop-routing rule; a node it stops is not asked.
    """

    def __init__(self, book: Book, *, roster: Sequence[Candidate], settings: Settings | None = None,
                 transport: Transport | None = None,
                 seats: Mapping[str, RefereeSeat] | Callable[[str], RefereeSeat | None] | None = None,
                 history: Sequence[Recorded] = (), clock: Callable[[], str] = utc_now, draw: Draw | None = None,
                 stop_routing: StopRouting | None = None) -> None:
        if not isinstance(book, Book):
            raise RefereeInputError(f"book is a capseal.judge.referee.Book, not {type(book).__name__}", path="$.book")
        self.book = book
        self.roster = list(roster)
        ids = [c.node_id for c in self.roster]
        if len(ids) != len(set(ids)):
            raise RefereeInputError("the roster names a node twice", path="$.roster")
        self.settings = settings or Settings()
        self.transport = transport
        self._seats = seats or {}
        self.history = list(history)
        self.clock = clock
        self.draw = draw or UniformDraw()
        self.stop_routing = stop_routing
        self._checked: dict[tuple[str, str, str | None], Any] = {}  # rulings verified once (the ledger is append-only)

    def _seat(self, node_id: str) -> RefereeSeat | None:
        if callable(self._seats):
            return self._seats(node_id)
        return self._seats.get(node_id)

    def _now(self) -> str:
        """The clock's time, to the second (verdict times are recorded to the second)."""
        return format_time(parse_time(self.clock(), "$.now"))

    def counted(self) -> list[Counted]:
        """The verdicts this node counts.

        Returns:
            ``history`` (no referee named) and its book's rulings that verify
            under their referees' announced keys.

        Raises:
            LedgerCorruptError: a book row the book does not write.
        """
        return [Counted(r, None) for r in self.history] + counted_rulings(self.book, self.roster, self._checked)

    def hold(self, half: Half, *, twin_bracket_id: str | None) -> HeldHalf:
        """Keep a half whose twin is unavailable (an orphan: a defined state,
        never reported as tampering) until its twin comes.

        Args:
            half: the half (from ``load_half``).
            twin_bracket_id: the host's bracket id, or None.

        Returns:
            The :class:`HeldHalf`.

        Raises:
            RefereeInputError: a clock or bracket id the rules cannot use.
        """
        return self.book.hold(half, twin_bracket_id=twin_bracket_id, at=self._now())

    def consider(self, pair: Pair, *, reask: bool = False) -> RuleAnswer:
        """Apply the rules to ``pair`` and, when a referee is due, ask one.

        Args:
            pair: two checked halves (``make_pair``).
            reask: the operator asks again (selects again after ``no_eligible_referee``).

        Returns:
            The :class:`RuleAnswer`.

        Raises:
            RefereeInputError: a clock or draw the rules cannot use (nothing recorded).
            capseal.errors.LedgerError: the book could not be written.
        """
        if not isinstance(pair, Pair):
            raise RefereeInputError(f"consider() takes a Pair (make_pair), not {type(pair).__name__}", path="$.pair")
        key = pair.key
        spent = self.book.spent(key)
        if spent is not None:
            return RuleAnswer(spent.row, 0, pair, spent)
        latest = self.book.latest(key)
        if latest is not None and latest.row.get("reason") == "no_eligible_referee" and not reask:
            return RuleAnswer(latest.row, 0, pair, latest)
        now = self._now()
        gate = before_asking(self.settings, pair)
        if gate is not None:
            return RuleAnswer(gate, 0, pair, self._record(pair, latest, gate, now, force=False))
        selection, ineligible = self._select(pair, now)
        referee = selection.pick(self.draw)
        if referee is None or selection.tier is None:
            row = not_adjudicated("no_eligible_referee")
            return RuleAnswer(row, 0, pair, self._record(pair, latest, row, now, force=reask), selection, ineligible=ineligible)
        tier = selection.tier
        try:  # P6: the call is spent before it is made
            self.book.write(pair, not_adjudicated("referee_unreachable"), called=True, at=now,
                            in_flight={"referee": referee, "tier": tier}, claim=True)
        except CallClaimed:
            claimed = self.book.spent(key)
            assert claimed is not None
            return RuleAnswer(claimed.row, 0, pair, claimed)
        row, report, ruling, refusal = self._call(pair, referee, tier)
        try:
            recorded_at = self._now()
        except RefereeInputError:  # the outcome is recorded all the same, at the time the call was made
            recorded_at = now
        stored = self.book.write(pair, row, called=True, at=recorded_at,
                                 ruling_id=ruling.ruling_id if ruling is not None and report is not None and report.ok else None,
                                 statement_id=ruling.statement_id if ruling is not None and report is not None and report.ok else None)
        return RuleAnswer(row, 1, pair, stored, selection, report, ineligible, refusal)

    def _record(self, pair: Pair, latest: BookRow | None, row: dict[str, Any], now: str, *, force: bool) -> BookRow:
        """Write an outcome that made no call (the same row again is not repeated)."""
        if latest is not None and latest.row == row and not latest.called and not force:
            return latest
        return self.book.write(pair, row, called=False, at=now)

    def _select(self, pair: Pair, now: str) -> tuple[Selection, dict[str, str]]:
        a, b = pair.halves
        model, weights = a.host.model_hash or "", a.host.weights_digest or ""
        twin_ids = (a.node_id, b.node_id)
        twin_kids = {a.signer_kid, b.signer_kid} | {c.kid for c in self.roster if c.node_id in twin_ids and c.kid}
        moment = parse_time(now)
        counted = self.counted()
        history = [c.recorded for c in counted]
        candidates = [c if not (self.stop_routing and self.stop_routing.applies(c.node_id, counted, moment))
                      else Candidate(c.node_id, c.model_hash, c.weights_digest, c.announced_key, True)
                      for c in self.roster]
        args = dict(model_hash=model, weights_digest=weights, twin_ids=twin_ids, twin_kids=twin_kids,
                    history=history, now=moment, days=self.settings.bar_days)
        ineligible = {c.node_id: why for c in candidates if (why := why_not(c, **args)) is not None}  # type: ignore[arg-type]
        return select(candidates=candidates, **args), ineligible  # type: ignore[arg-type]

    def _call(self, pair: Pair, referee: str, tier: int) -> tuple[dict[str, Any], RulingReport | None, Ruling | None, str | None]:
        unreachable = not_adjudicated("referee_unreachable")
        cannot_sign = not_adjudicated("referee_cannot_sign")
        if self.transport is None:
            return unreachable, None, None, "no transport to reach referees"
        divergence = pair.comparison().divergence_index or 0
        try:
            reanswer = self.transport(referee, reanswer_request(pair.halves[0], divergence, pair.request))
        except RefereeUnreachableError as exc:
            return unreachable, None, None, str(exc)
        seat = self._seat(referee)
        if seat is None:
            return cannot_sign, None, None, f"{referee} answered but has no seat here that can sign"
        try:
            ruling = seat.rule(pair, tier=tier, reanswer=reanswer)
        except CapsealError as exc:  # its signer failed: it could not sign
            return cannot_sign, None, None, f"{referee} could not sign: {type(exc).__name__}"
        if isinstance(ruling, Refusal):
            return cannot_sign, None, None, f"{referee} refused: {ruling.reason}" + (f" ({ruling.detail})" if ruling.detail else "")
        candidate = next((c for c in self.roster if c.node_id == referee), None)
        report = verify_ruling(self.book.ledger, statement_id=ruling.statement_id, ruling_id=ruling.ruling_id,
                               referee_key=candidate.announced_key if candidate else None,
                               expect={"referee": referee, "tier": tier, "capsule_ids": pair.capsule_ids})
        if not report.ok:
            return cannot_sign, report, ruling, f"{referee}'s ruling does not verify: {', '.join(report.codes())}"
        if ruling.verdict == "not_comparable":
            return not_adjudicated("not_comparable", ruling.because or "weights_unknown"), report, ruling, None
        return adjudicated(ruling.verdict, referee, tier), report, ruling, None
