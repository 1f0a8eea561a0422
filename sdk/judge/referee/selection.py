"""Choosing the referee (S1–S3): yes/no eligibility, two tiers, a uniform pick.

* S1 — a node is eligible iff it serves the twins' ``model_hash`` **and**
  ``weights_digest``; is not a twin, by node id **and** by signing key (a node
  announcing a twin's key under another id is that twin); announced a key (so
  it can sign); is not blocked; and is not barred for that model (``bar``).
* S2 — tier 1 holds the eligible nodes with a corroboration for the model
  (recorded after any lapsed bar); tier 2 holds the rest.
* S3 — the pick is uniform within the best non-empty tier (sorted by node id),
  drawn by default from the operating system's CSPRNG with rejection sampling,
  so no index is favoured. The clock and the random source are injected.

Nothing here orders nodes by merit, weighs them or makes a number of them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from capseal.errors import RefereeInputError

from .bar import Recorded, bar_until, corroborated, format_time
from .halves import announced_key, check_id

__all__ = ["Candidate", "Selection", "select", "why_not", "Draw", "UniformDraw", "ScriptedDraw"]

Draw = Callable[[int], int]


@dataclass(frozen=True)
class Candidate:
    """A node this node could ask, as it knows it (a roster entry)."""

    node_id: str
    model_hash: str | None
    weights_digest: str | None
    announced_key: Any = None  # a public key, or None when it announced none
    blocked: bool = False

    @property
    def kid(self) -> str | None:
        """The key id of the announced key, or None."""
        if self.announced_key is None:
            return None
        from capseal.keys import kid_for

        return kid_for(self.announced_key)

    @classmethod
    def from_json(cls, value: Any, path: str = "$") -> Candidate:
        """A roster entry ``{node_id, model_hash, weights_digest, announced_key, blocked}``.

        Args:
            value: the entry (JSON).
            path: where it is, for messages.

        Returns:
            The :class:`Candidate`.

        Raises:
            RefereeInputError: a member missing, unknown or of the wrong type.
        """
        if not isinstance(value, Mapping):
            raise RefereeInputError(f"a roster entry is an object, not {type(value).__name__}", path=path)
        known = {"node_id", "model_hash", "weights_digest", "announced_key", "blocked"}
        extra = sorted(set(map(str, value)) - known)
        if extra:
            raise RefereeInputError(f"unknown member {extra[0]!r} in a roster entry", path=f"{path}.{extra[0]}")
        node = check_id(value.get("node_id"), "node_id", f"{path}.node_id")
        for name in ("model_hash", "weights_digest"):
            if value.get(name) is not None:
                check_id(value.get(name), name, f"{path}.{name}", empty=True)
        blocked = value.get("blocked", False)
        if not isinstance(blocked, bool):
            raise RefereeInputError("blocked is true or false", path=f"{path}.blocked")
        key = value.get("announced_key")
        return cls(node, value.get("model_hash") or None, value.get("weights_digest") or None,
                   None if key is None else announced_key(key, f"{path}.announced_key"), blocked)


def why_not(candidate: Candidate, *, model_hash: str, weights_digest: str, twin_ids: Iterable[str],
            twin_kids: Iterable[str], history: Sequence[Recorded], now: datetime, days: int) -> str | None:
    """The first S1 rule ``candidate`` fails, or None when it is eligible.

    Args:
        candidate: the roster entry.
        model_hash: the twins' model hash.
        weights_digest: the twins' weights digest.
        twin_ids: the twins' node ids.
        twin_kids: the twins' key ids.
        history: this node's recorded verdicts.
        now: this node's clock.
        days: D.

    Returns:
        ``model_hash_differs``, ``weights_differ``, ``is_a_twin``,
        ``shares_a_twins_key``, ``no_announced_key``, ``blocked`` or
        ``barred until <t+D>``; None when eligible.
    """
    if candidate.model_hash != model_hash:
        return "model_hash_differs"
    if candidate.weights_digest != weights_digest:
        return "weights_differ"
    if candidate.node_id in set(twin_ids):
        return "is_a_twin"
    if candidate.announced_key is None:
        return "no_announced_key"
    if candidate.kid in set(twin_kids):
        return "shares_a_twins_key"
    if candidate.blocked:
        return "blocked"
    until = bar_until(candidate.node_id, model_hash, history, now, days)
    if until is not None:
        return f"barred until {format_time(until)}"
    return None


@dataclass(frozen=True)
class Selection:
    """Who may be asked about one pair: the best non-empty tier, sorted."""

    tier: int | None
    pool: tuple[str, ...]

    def pick(self, draw: Draw) -> str | None:
        """The pick (S3).

        Args:
            draw: the random source: ``draw(n)`` is an index in ``range(n)``.

        Returns:
            ``pool[draw(len(pool))]``; None for an empty pool.

        Raises:
            RefereeInputError: the draw is not an index into the pool.
        """
        if not self.pool:
            return None
        index = draw(len(self.pool))
        if type(index) is not int or not 0 <= index < len(self.pool):
            raise RefereeInputError(f"the random source drew {index!r:.20} for a pool of {len(self.pool)}", path="$.draws")
        return self.pool[index]


def select(*, now: datetime, days: int, model_hash: str, weights_digest: str, twin_ids: Iterable[str],
           twin_kids: Iterable[str], candidates: Iterable[Candidate], history: Sequence[Recorded]) -> Selection:
    """The pair's referee pool at ``now`` (S1, S2).

    Args:
        now: this node's clock.
        days: D of the bar.
        model_hash: the model the twins served.
        weights_digest: the weights they served.
        twin_ids: the twins' node ids.
        twin_kids: the key ids that signed the twins' halves (and any they announced).
        candidates: the roster.
        history: this node's recorded verdicts.

    Returns:
        The :class:`Selection` (tier None and an empty pool when nobody is eligible).
    """
    ids, kids = tuple(twin_ids), tuple(twin_kids)
    eligible = [c.node_id for c in candidates
                if why_not(c, model_hash=model_hash, weights_digest=weights_digest, twin_ids=ids, twin_kids=kids,
                           history=history, now=now, days=days) is None]
    tier1 = sorted({n for n in eligible if corroborated(n, model_hash, history, days)})
    tier2 = sorted(set(eligible) - set(tier1))
    if tier1:
        return Selection(1, tuple(tier1))
    if tier2:
        return Selection(2, tuple(tier2))
    return Selection(None, ())


class UniformDraw:
    """A uniform index in ``range(n)`` from a CSPRNG, by rejection sampling.

    Eight random bytes make ``x`` in ``[0, 2**64)``; values at or above the
    largest multiple of ``n`` are drawn again, so ``x % n`` favours no index.
    ``random_bytes`` is the source (``os.urandom`` unless a test injects one).

    Args:
        random_bytes: returns that many random bytes.

    Calling it with ``n`` raises RefereeInputError unless ``n`` is a positive int.
    """

    def __init__(self, random_bytes: Callable[[int], bytes] = os.urandom) -> None:
        self._bytes = random_bytes

    def __call__(self, n: int) -> int:
        if type(n) is not int or n <= 0:
            raise RefereeInputError(f"a draw is over a non-empty pool, not {n!r:.20}", path="$.draws")
        if n == 1:
            return 0
        zone = 2**64 - (2**64 % n)
        while True:
            x = int.from_bytes(self._bytes(8), "big")
            if x < zone:
                return x % n


class ScriptedDraw:
    """The picks a test's random source returns, in order (a case file's ``draws``).

    Args:
        picks: the indexes to return, one per draw.

    Raises:
        RefereeInputError: a pick that is not a non-negative int (and, when
            called, no pick left).
    """

    def __init__(self, picks: Sequence[int]) -> None:
        for i, p in enumerate(picks):
            if type(p) is not int or p < 0:
                raise RefereeInputError(f"a draw is a non-negative integer, not {p!r:.20}", path=f"$.draws[{i}]")
        self._picks = list(picks)

    def __call__(self, n: int) -> int:
        if not self._picks:
            raise RefereeInputError("the case's draws ran out: give one per referee selection", path="$.draws")
        return self._picks.pop(0)
