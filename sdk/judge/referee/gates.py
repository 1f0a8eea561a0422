"""Whether to ask a referee at all (G1–G7) and the operator's settings.

Each gate that answers gives a ``not_adjudicated`` row with its reason, makes
no call and counts against nobody; they run in this order:

* G1 — the switch ``adjudicate_differing_twins`` is off → ``off``. It is **off
  by default**: unset is off, and only an explicit on turns it on (asking a
  referee sends the prompt to a third node).
* G2 — no bracket id → ``host_does_not_mark_twins`` (pairs are never guessed).
* G3 — either twin sampled (the host's temperature is a number above 0) →
  ``not_comparable`` because ``sampled``.
* a missing or empty model hash → ``not_comparable`` because ``model_hash_unknown``;
  G4 — the model hashes differ → because ``model_hash_differs``.
* G5 — a weights digest unknown → because ``weights_unknown``; they differ →
  because ``weights_differ``.
* G6 — the words are the same → ``twins_agree``.
* G7 — otherwise ``None``: select a referee and call it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from capseal.errors import RefereeInputError

from .halves import sampled_on_request
from .pairs import Pair
from .vocab import not_adjudicated

__all__ = ["Settings", "DEFAULT_BAR_DAYS", "ENV_SWITCH", "ENV_BAR_DAYS", "before_asking"]

DEFAULT_BAR_DAYS = 30
#: the largest D a bar can run for (a day count time arithmetic can hold)
MAX_BAR_DAYS = 999_999_999
ENV_SWITCH = "CAPSEAL_REFEREE_ADJUDICATE_DIFFERING_TWINS"
ENV_BAR_DAYS = "CAPSEAL_REFEREE_BAR_DAYS"
_ON = ("1", "on", "true", "yes")
_KNOWN = ("adjudicate_differing_twins", "referee_bar_days")


@dataclass(frozen=True)
class Settings:
    """The operator's two settings.

    ``adjudicate_differing_twins``: True asks referees; False or None (unset)
    does not. ``referee_bar_days``: D of the bar after a contradiction, a
    positive integer; None is the default, 30."""

    adjudicate_differing_twins: bool | None = None
    referee_bar_days: int | None = None

    def __post_init__(self) -> None:
        switch, days = self.adjudicate_differing_twins, self.referee_bar_days
        if switch is not None and not isinstance(switch, bool):
            raise RefereeInputError(f"adjudicate_differing_twins is true, false or null, not {switch!r:.40}",
                                    path="$.settings.adjudicate_differing_twins")
        if days is not None and (type(days) is not int or not 0 < days <= MAX_BAR_DAYS):
            raise RefereeInputError(f"referee_bar_days is a positive integer of days (at most {MAX_BAR_DAYS}) or null, "
                                    f"not {str(days)[:40]!r}", path="$.settings.referee_bar_days")

    @property
    def on(self) -> bool:
        """G1: only an explicit True is on.

        Returns:
            Whether referees are asked.
        """
        return self.adjudicate_differing_twins is True

    @property
    def bar_days(self) -> int:
        """D (30 unless set)."""
        return DEFAULT_BAR_DAYS if self.referee_bar_days is None else self.referee_bar_days

    @classmethod
    def from_json(cls, value: Any) -> Settings:
        """Settings from a case file's ``settings`` object.

        Args:
            value: the object, or None (all unset).

        Returns:
            The :class:`Settings`.

        Raises:
            RefereeInputError: not an object, an unknown setting, or a bad value.
        """
        if value is None:
            return cls()
        if not isinstance(value, Mapping):
            raise RefereeInputError(f"settings is an object, not {type(value).__name__}", path="$.settings")
        unknown = sorted(str(k) for k in value if k not in _KNOWN)
        if unknown:
            raise RefereeInputError(f"unknown setting {unknown[0]!r} (known: {', '.join(_KNOWN)})",
                                    path=f"$.settings.{unknown[0]}")
        return cls(value.get("adjudicate_differing_twins"), value.get("referee_bar_days"))

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Settings:
        """Settings from the environment: the switch is on only for
        ``1``, ``on``, ``true`` or ``yes`` (any case); anything else, or unset, is
        off. ``CAPSEAL_REFEREE_BAR_DAYS`` is a positive integer when set.

        Args:
            environ: the environment (``os.environ``).

        Returns:
            The :class:`Settings`.

        Raises:
            RefereeInputError: a bar-days value that is not a positive integer.
        """
        raw = environ.get(ENV_SWITCH)
        switch = raw is not None and raw.strip().lower() in _ON
        days_raw = environ.get(ENV_BAR_DAYS)
        days: int | None = None
        if days_raw is not None:
            text = days_raw.strip()
            if not (text.isascii() and text.isdigit()) or len(text) > 12 or not 0 < int(text) <= MAX_BAR_DAYS:
                raise RefereeInputError(f"{ENV_BAR_DAYS} is a positive whole number of days, not {days_raw!r:.40}",
                                        path=f"${ENV_BAR_DAYS}")
            days = int(text)
        return cls(switch, days)


def before_asking(settings: Settings, pair: Pair) -> dict[str, str] | None:
    """The row a pair gets before anyone is asked (G1–G6), or None (G7: ask).

    Args:
        settings: the operator's settings.
        pair: the pair, both halves checked.

    Returns:
        A ``not_adjudicated`` row, or None when a referee is to be selected.
    """
    if not settings.on:
        return not_adjudicated("off")
    if not pair.twin_bracket_id:
        return not_adjudicated("host_does_not_mark_twins")
    a, b = (h.host for h in pair.halves)
    if sampled_on_request(a.temperature) or sampled_on_request(b.temperature):
        return not_adjudicated("not_comparable", "sampled")
    if not a.model_hash or not b.model_hash:
        return not_adjudicated("not_comparable", "model_hash_unknown")
    if a.model_hash != b.model_hash:
        return not_adjudicated("not_comparable", "model_hash_differs")
    if not a.weights_digest or not b.weights_digest:
        return not_adjudicated("not_comparable", "weights_unknown")
    if a.weights_digest != b.weights_digest:
        return not_adjudicated("not_comparable", "weights_differ")
    if pair.comparison().same:
        return not_adjudicated("twins_agree")
    return None
