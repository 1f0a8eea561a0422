"""The bar after a contradiction (B1–B5) and this node's record of verdicts.

* B1 — a contradiction bars the node for that model only, over the half-open
  window ``[t, t+D)``, exact to the second: barred at ``t+D−1 s``, eligible at
  ``t+D``. A contradiction naming no model hash bars nothing.
* B2 — ``t`` is when *this* node recorded the verdict, never a time the
  referee wrote, so a referee cannot backdate a bar away.
* B3 — ``D`` is ``referee_bar_days``, a positive integer, 30 unless set.
* B4 — only contradictions bar; a later corroboration does not end a bar early.
* B5 — after a bar lapses the node is in tier 2 until it has a corroboration
  for that model recorded *strictly after* the lapse, the lapse being the
  latest contradiction's ``t+D``.

Times are RFC 3339 UTC strings; they are read to the second.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from capseal.errors import RefereeInputError
from capseal.model import check_timestamp

__all__ = ["BUCKETS", "Recorded", "parse_time", "format_time", "bar_until", "barred", "corroborated"]

BUCKETS = ("corroborated", "contradicted")


def parse_time(value: Any, path: str = "$") -> datetime:
    """An RFC 3339 UTC timestamp (``…Z``) as an aware datetime, to the second.

    Args:
        value: the timestamp.
        path: where it is, for messages.

    Returns:
        The UTC datetime (fractions of a second dropped; a leap second read as :59).

    Raises:
        RefereeInputError: not such a timestamp.
    """
    if not isinstance(value, str):
        raise RefereeInputError(f"a time is an RFC 3339 UTC timestamp string, not {type(value).__name__}", path=path)
    try:
        check_timestamp(value)
    except ValueError as exc:
        raise RefereeInputError(f"{value[:40]!r} {exc}", path=path) from None
    second = value[:19]
    if second[17:19] == "60":  # a leap second is read as the last second of the day
        second = second[:17] + "59"
    return datetime.fromisoformat(second).replace(tzinfo=timezone.utc)


def format_time(moment: datetime) -> str:
    """``moment`` as ``YYYY-MM-DDTHH:MM:SSZ`` (UTC, to the second).

    Args:
        moment: an aware datetime.

    Returns:
        The RFC 3339 UTC timestamp.
    """
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Recorded:
    """One counted verdict about a node (as a twin), for one model, as this
    node recorded it (``recorded_at``: this node's clock)."""

    node_id: str
    model_hash: str | None
    bucket: str
    recorded_at: datetime

    @classmethod
    def from_json(cls, value: Any, path: str = "$") -> Recorded:
        """A history entry ``{node_id, model_hash, bucket, recorded_at}``.

        Args:
            value: the entry (JSON).
            path: where it is, for messages.

        Returns:
            The :class:`Recorded`.

        Raises:
            RefereeInputError: a member missing, unknown or of the wrong type.
        """
        if not isinstance(value, Mapping):
            raise RefereeInputError(f"a history entry is an object, not {type(value).__name__}", path=path)
        extra = sorted(set(map(str, value)) - {"node_id", "model_hash", "bucket", "recorded_at"})
        if extra:
            raise RefereeInputError(f"unknown member {extra[0]!r} in a history entry", path=f"{path}.{extra[0]}")
        from .halves import check_id

        model, bucket = value.get("model_hash"), value.get("bucket")
        node = check_id(value.get("node_id"), "node_id", f"{path}.node_id")
        if model is not None:
            check_id(model, "model_hash", f"{path}.model_hash", empty=True)
        if bucket not in BUCKETS:
            raise RefereeInputError(f"bucket is one of {', '.join(BUCKETS)}, not {bucket!r:.40}", path=f"{path}.bucket")
        return cls(node, model or None, bucket, parse_time(value.get("recorded_at"), f"{path}.recorded_at"))


_END_OF_TIME = datetime.max.replace(tzinfo=timezone.utc)


def window_end(at: datetime, days: int) -> datetime:
    """The end of a bar's window.

    Args:
        at: when the contradiction was recorded.
        days: D.

    Returns:
        ``at + days``, or the end of representable time when that is past it
        (a bar recorded near year 9999 lasts to the end).
    """
    try:
        return at + timedelta(days=days)
    except OverflowError:
        return _END_OF_TIME


def _about(history: Iterable[Recorded], node: str, model: str) -> list[Recorded]:
    return [r for r in history if r.node_id == node and r.model_hash is not None and r.model_hash == model]


def bar_until(node: str, model: str, history: Iterable[Recorded], now: datetime, days: int) -> datetime | None:
    """The end of the bar that covers ``now`` for ``node`` on ``model`` (B1, B4),
    or None when it is not barred.

    Args:
        node: the candidate's node id.
        model: the twins' model hash.
        history: this node's recorded verdicts.
        now: this node's clock.
        days: D, a positive integer.

    Returns:
        The latest ``t+D`` of a contradiction with ``t <= now < t+D``, or None.
    """
    ends = [window_end(r.recorded_at, days) for r in _about(history, node, model)
            if r.bucket == "contradicted" and r.recorded_at <= now < window_end(r.recorded_at, days)]
    return max(ends) if ends else None


def barred(node: str, model: str, history: Iterable[Recorded], now: datetime, days: int) -> bool:
    """B1: whether ``node`` has a contradiction for ``model`` whose window covers ``now``.

    Args:
        node: the candidate's node id.
        model: the twins' model hash.
        history: this node's recorded verdicts.
        now: this node's clock.
        days: D.

    Returns:
        True when barred.
    """
    return bar_until(node, model, history, now, days) is not None


def corroborated(node: str, model: str, history: Iterable[Recorded], days: int) -> bool:
    """S2/B5: whether ``node`` has a corroboration for ``model`` that counts toward
    tier 1: any, when it was never contradicted on that model; else one recorded
    strictly after the latest contradiction's ``t+D``.

    Args:
        node: the candidate's node id.
        model: the twins' model hash.
        history: this node's recorded verdicts.
        days: D.

    Returns:
        True for tier 1.
    """
    about = _about(history, node, model)
    lapses = [window_end(r.recorded_at, days) for r in about if r.bucket == "contradicted"]
    lapse = max(lapses) if lapses else None
    return any(r.bucket == "corroborated" and (lapse is None or r.recorded_at > lapse) for r in about)
