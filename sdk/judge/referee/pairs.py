"""Two halves of one request, marked as one pair by the host (P1).

A pair's key is ``(twin_bracket_id, request_digest, the two node ids sorted)``:
capsule ids are not part of it, so re-sealed halves of one exchange are the same
pair. Without a bracket id there is still a key (the gate G2 then answers
``host_does_not_mark_twins``), but a pair is never guessed from timing: only
halves the host marked with one bracket id are put together.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from capseal.canonical import is_hex64, json_digest
from capseal.errors import CanonicalizationError, PairRefusedError, RefereeInputError

from .comparison import Comparison, compare
from .halves import Half, check_id

__all__ = ["PairKey", "Pair", "make_pair", "pair_key_json", "pair_id_of"]

PairKey = tuple[str | None, str, tuple[str, str]]


def pair_key_json(key: PairKey) -> dict[str, Any]:
    """A pair key as the book writes it.

    Args:
        key: the pair key.

    Returns:
        ``{twin_bracket_id, request_digest, node_ids}``.
    """
    bracket, request_digest, nodes = key
    return {"twin_bracket_id": bracket, "request_digest": request_digest, "node_ids": list(nodes)}


def pair_id_of(key: PairKey) -> str:
    """The pair's id (what ``book show`` prints).

    Args:
        key: the pair key.

    Returns:
        The JSON digest of the key's JSON form.
    """
    return json_digest(pair_key_json(key))


@dataclass(frozen=True)
class Pair:
    """Two checked halves of one request. ``halves[0]`` is "half A"."""

    twin_bracket_id: str | None
    request_digest: str
    halves: tuple[Half, Half]
    #: the request both answered, when disclosed (its digest is ``request_digest``)
    request: Any = None

    @property
    def key(self) -> PairKey:
        """P1: ``(twin_bracket_id, request_digest, the two node ids sorted)``."""
        a, b = sorted((self.halves[0].node_id, self.halves[1].node_id))
        return (self.twin_bracket_id, self.request_digest, (a, b))

    @property
    def pair_id(self) -> str:
        """The digest of the key."""
        return pair_id_of(self.key)

    @property
    def capsule_ids(self) -> list[str]:
        """The halves' capsule ids, half A first."""
        return [h.capsule_id for h in self.halves]

    def comparison(self) -> Comparison:
        """The halves' answers compared (C1–C4).

        Returns:
            The :class:`Comparison`.
        """
        return compare(self.halves[0].text, self.halves[1].text)

    @property
    def state(self) -> str:
        """``halves_agree`` or ``halves_disagree`` (both halves are present)."""
        return "halves_agree" if self.comparison().same else "halves_disagree"


def make_pair(twin_bracket_id: Any, request_digest: Any, halves: Sequence[Half], *, request: Any = None) -> Pair:
    """Put two checked halves together as one pair.

    Args:
        twin_bracket_id: the host's bracket id (a str), or None when it marks none.
        request_digest: the digest of the request both halves answered.
        halves: exactly two halves (from :func:`~capseal.judge.referee.halves.load_half`).
        request: the request body, when disclosed.

    Returns:
        The :class:`Pair`.

    Raises:
        PairRefusedError: rule P1 — ``not_a_pair`` (not exactly two halves, or one
            half twice), ``twins_differ_in_request`` (a half answered another
            request), ``request_not_disclosed_as_signed`` (the request given is
            not the one the digest names); or a malformed bracket or digest.
    """
    if twin_bracket_id is not None:
        try:
            check_id(twin_bracket_id, "twin_bracket_id", "$.pair.twin_bracket_id", empty=True)
        except RefereeInputError as exc:
            raise PairRefusedError(str(exc).rsplit(" (at ", 1)[0], rule="P1", reason="not_a_pair", path=exc.path) from None
    if not (isinstance(request_digest, str) and is_hex64(request_digest) and request_digest == request_digest.lower()):
        raise PairRefusedError("request_digest is a 64-hex lowercase digest", rule="P1", reason="not_a_pair",
                               path="$.pair.request_digest")
    if isinstance(halves, (str, bytes, Mapping)) or len(halves) != 2:
        n = len(halves) if isinstance(halves, Sequence) else 0
        what = "one half: an orphan, not a pair (keep it with Referee.hold until its twin comes)" if n == 1 else \
            f"{n} halves"
        raise PairRefusedError(f"a pair has exactly two halves, this has {what}", rule="P1", reason="not_a_pair",
                               path="$.pair.halves")
    a, b = halves
    if not (isinstance(a, Half) and isinstance(b, Half)):
        raise PairRefusedError("a pair's halves come from load_half (checked against their servers' keys)",
                               rule="V1", reason="half_unverified", path="$.pair.halves")
    if a.capsule_id == b.capsule_id:
        raise PairRefusedError("both halves are the same record", rule="P1", reason="not_a_pair",
                               path="$.pair.halves[1]")
    for i, half in enumerate(halves):
        if half.request_digest != request_digest:
            raise PairRefusedError(f"half {i} ({half.node_id}) answered request {str(half.request_digest)[:16]}…, "
                                   f"not {request_digest[:16]}…: halves of different requests are no pair",
                                   rule="P1", reason="twins_differ_in_request", path=f"$.pair.halves[{i}]")
    if request is not None:
        try:
            given = json_digest(request)
        except CanonicalizationError as exc:
            raise PairRefusedError(f"the request cannot be digested ({exc})", rule="P1",
                                   reason="request_not_disclosed_as_signed", path="$.pair.request") from None
        if given != request_digest:
            raise PairRefusedError("the request given is not the one the halves answered (its digest differs)",
                                   rule="P1", reason="request_not_disclosed_as_signed", path="$.pair.request")
    return Pair(twin_bracket_id=twin_bracket_id, request_digest=request_digest, halves=(a, b), request=request)
