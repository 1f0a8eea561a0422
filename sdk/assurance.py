"""Assurance derived from a capsule's own bytes (-05 §5.4), never accepted.

The same functions serve the producer (which writes the derived block and refuses
a caller's higher claim) and the verifier (which rederives and reports overclaims),
so the two cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .canonical import is_hex64
from .errors import AssuranceMismatchError, AssuranceOverclaimError
from .vocab import (
    ATTESTATION_RANK,
    CROSS_PARTY_RANK,
    EFFECT_MODE_RANK,
    LEDGER_MODE_RANK,
)

__all__ = [
    "derive_effect_mode",
    "derive_cross_party_rung",
    "derive_assurance",
    "enforce_claim",
]

_RANKS: dict[str, dict[str, int]] = {
    "effect_mode": EFFECT_MODE_RANK,
    "attestation_mode": ATTESTATION_RANK,
    "ledger_mode": LEDGER_MODE_RANK,
    "cross_party_rung": CROSS_PARTY_RANK,
}


def derive_effect_mode(effect: Any) -> str:
    """§5.3/§5.4: no effect or ``planned`` → not_applicable; ``confirmed`` with a
    64-hex response_digest → confirmed; anything else → dispatched_unconfirmed.

    Args:
        effect: the capsule's ``effect`` block (any value is accepted).

    Returns:
        ``not_applicable``, ``confirmed`` or ``dispatched_unconfirmed``.
    """
    if type(effect) is not dict and (effect is None or not isinstance(effect, Mapping)):  # the ABC check last: it costs most
        return "not_applicable"
    status = effect.get("status")
    if status == "planned":
        return "not_applicable"
    if status == "confirmed" and is_hex64(effect.get("response_digest")):
        return "confirmed"
    return "dispatched_unconfirmed"


def derive_cross_party_rung(cross_party: Any) -> str | None:
    """§5.4.1, from the block's own bytes alone (never dereferencing digests).

    Args:
        cross_party: the capsule's ``cross_party`` block (any value is accepted).

    Returns:
        ``full_bilateral``, ``acknowledged_receipt`` or ``unilateral_fallback``;
        None when there is no block.
    """
    if type(cross_party) is not dict and (cross_party is None or not isinstance(cross_party, Mapping)):
        return None
    correlator = cross_party.get("correlator")
    if not is_hex64(cross_party.get("counterparty_ref")) or not (
        isinstance(correlator, str) and correlator
    ):
        return "unilateral_fallback"
    if cross_party.get("substantive") is True:
        return "full_bilateral"
    return "acknowledged_receipt"


def derive_assurance(capsule: Mapping[str, Any]) -> dict[str, str]:
    """The assurance block an honest producer writes for ``capsule``.

    ``attestation_mode`` is always ``self_attested`` at seal time: a Receipt is
    issued over the capsule id, so a fresh capsule cannot already be anchored.

    Args:
        capsule: the capsule (its effect, chain and cross_party blocks are read).

    Returns:
        The assurance block: attestation_mode, effect_mode, ledger_mode and,
        with a cross_party block, cross_party_rung.
    """
    chain = capsule.get("chain")
    out = {
        "attestation_mode": "self_attested",
        "effect_mode": derive_effect_mode(capsule.get("effect")),
        "ledger_mode": "chained" if type(chain) is dict or (chain is not None and isinstance(chain, Mapping))
        else "standalone",
    }
    cross_party = capsule.get("cross_party")
    if cross_party is not None:
        rung = derive_cross_party_rung(cross_party)
        if rung is not None:
            out["cross_party_rung"] = rung
    return out


def enforce_claim(claimed: Any, derived: Mapping[str, str]) -> None:
    """Refuse a caller-supplied assurance block that is not exactly ``derived``.

    A higher value on any axis is an overclaim (AssuranceOverclaimError); an
    unknown, lower-but-different or extra value is AssuranceMismatchError. The
    caller's safest move is always to leave ``assurance`` out.

    Args:
        claimed: the caller's ``assurance`` block (None: none given, nothing to check).
        derived: the block :func:`derive_assurance` gives.

    Raises:
        AssuranceOverclaimError: a value higher than the derived one.
        AssuranceMismatchError: not an object, an axis that cannot be claimed,
            or an unknown or different value.
    """
    if claimed is None:
        return
    if not isinstance(claimed, Mapping):
        raise AssuranceMismatchError(
            "assurance must be an object (or, better, left out)",
            field="assurance", claimed=claimed, derived=dict(derived),
        )
    for name, value in claimed.items():
        ranks = _RANKS.get(name)
        want = derived.get(name)
        if ranks is None or want is None:
            raise AssuranceMismatchError(
                f"assurance.{name} cannot be claimed here (derived block has "
                f"{sorted(derived)})",
                field=f"assurance.{name}", claimed=value, derived=want,
            )
        if value == want:
            continue
        if isinstance(value, str) and value in ranks and ranks[value] > ranks[want]:
            raise AssuranceOverclaimError(
                f"assurance.{name}={value!r} overclaims: the evidence gives {want!r}",
                field=f"assurance.{name}", claimed=value, derived=want,
            )
        raise AssuranceMismatchError(
            f"assurance.{name}={value!r} differs from the derived {want!r}",
            field=f"assurance.{name}", claimed=value, derived=want,
        )
    missing = set(derived) - set(claimed)
    if missing:
        raise AssuranceMismatchError(
            f"assurance is missing {sorted(missing)}; leave the block out",
            field="assurance", claimed=dict(claimed), derived=dict(derived),
        )
