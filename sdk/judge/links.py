"""Evidence Layer typed links (EL -00 §5): ``{type, target}``, six closed types.

A link is part of the record that carries it and never changes its target:
there is no call here (or anywhere in capseal) that edits, re-points or deletes
a link, and the store appends only. A correction is a *new* record carrying a
``supersedes`` link (see ``JudgmentStore.supersede``).

Where links live: in the store header's ``links`` of the record (every judge
record), and for ``close/v1`` also in its body member ``x-evidence-links``
(family §0a) — the only judge body that declares it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from capseal.canonical import is_hex64
from capseal.errors import JudgmentRefusedError

from .citation import Hex64, JudgePart, Target, listed
from .rules import check_links, raise_first
from .vocab import LinkType

__all__ = ["Link", "link", "validate_links"]


class Link(JudgePart):
    """One typed link. Frozen: its target cannot be changed after it exists."""

    type: LinkType
    target: Hex64

    @classmethod
    def to(cls, type: str, target: Any) -> Link:
        """A link of ``type`` to ``target``.

        Args:
            type: one of the six link types.
            target: a Target, a sealed judgment, a ``SealedRecord`` (capsule), a
                stored entry, or a 64-hex digest read from the store header of
                the record linked to.

        Returns:
            The link.

        Raises:
            JudgmentRefusedError: ``link_type_unknown`` or
                ``link_target_malformed``.
        """
        digest = digest_of(target)
        raise_first(check_links("adjudication", [{"type": type, "target": digest}]))
        return cls(type=type, target=digest)  # type: ignore[arg-type]

    def header(self) -> dict[str, str]:
        """The link as a store header holds it.

        Returns:
            ``{type, target}``.
        """
        return {"type": self.type, "target": self.target}


def link(type: str, target: Any) -> Link:
    """Shorthand for :meth:`Link.to`.

    Args:
        type: one of the six link types.
        target: what :meth:`Link.to` takes.

    Returns:
        The link.

    Raises:
        JudgmentRefusedError: as :meth:`Link.to`.
    """
    return Link.to(type, target)


def digest_of(target: Any) -> str:
    """The digest a link to ``target`` points at.

    Args:
        target: a Target, anything with a 64-hex ``digest``, ``capsule_id``
            or ``record_id``, or a 64-hex digest.

    Returns:
        The digest.

    Raises:
        JudgmentRefusedError: ``link_target_malformed`` for anything else.
    """
    if isinstance(target, Target):
        return target.digest
    for attr in ("digest", "capsule_id", "record_id"):
        value = getattr(target, attr, None)
        if isinstance(value, str) and is_hex64(value):
            return value
    if isinstance(target, str) and is_hex64(target):
        return target
    raise JudgmentRefusedError(f"a link target is a record or a 64-hex digest, not {type(target).__name__}", rule="link_target_malformed")


def link_header(item: Any, path: str) -> dict[str, Any]:
    """The header form ``{type, target}`` of a Link or a link dict (checked by
    :func:`check_links` after).

    Args:
        item: a Link or a ``{type, target}`` mapping.
        path: where it is (for the refusal).

    Returns:
        A new dict.

    Raises:
        JudgmentRefusedError: ``link_target_malformed`` for anything else.
    """
    if isinstance(item, Link):
        return item.header()
    if isinstance(item, Mapping):
        return dict(item)
    raise JudgmentRefusedError(f"a link is a Link or a {{type, target}} object, not {type(item).__name__}",
                               rule="link_target_malformed", path=path)


def validate_links(epistemic_type: str, links: Iterable[Link | dict[str, Any]],
                   body: Mapping[str, Any] | None = None) -> tuple[dict[str, str], ...]:
    """The header form of ``links`` for a record of ``epistemic_type``.

    Args:
        epistemic_type: the record's epistemic type.
        links: Links or ``{type, target}`` dicts.
        body: the record's body, when known (an ``adjudicates`` link must
            point at one of its parties).

    Returns:
        The links' header forms, in order.

    Raises:
        JudgmentRefusedError: a link of an unknown type, a malformed target,
            a duplicate, or ``adjudicates`` on anything but an adjudication
            record or to anything but one of its parties (EL -00 §5).
    """
    out = [link_header(item, f"$.links[{i}]") for i, item in enumerate(listed(links, "links"))]
    raise_first(check_links(epistemic_type, out, body))
    seen: set[tuple[str, str]] = set()
    for i, item in enumerate(out):
        key = (item["type"], item["target"])
        if key in seen:
            raise JudgmentRefusedError(f"link {key[0]} → {key[1][:16]}… is given twice", rule="link_duplicate", path=f"$.links[{i}]")
        seen.add(key)
    return tuple(out)
