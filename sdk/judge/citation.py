"""What a judgment cites, by digest computed from the cited bytes — never typed in.

A :class:`Target` is the only way a builder learns a digest: it is made *from*
the thing cited (raw bytes, a JSON value, a capsule, a sealed judgment record,
or a row of the store), so a citation can never point at a digest nobody
computed. Builders turn a Target into a :class:`Citation` and fix its
``judge_purpose`` from the field it goes in (family §0); a caller never writes
a purpose, and never ``citation_purpose`` (the retired name, rejected on read).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, StringConstraints, ValidationError

from capseal.canonical import canonical_bytes, capsule_id, raw_digest
from capseal.errors import JudgmentRefusedError

from .rules import SCORE_MEMBER

__all__ = ["Target", "Citation", "DigestRef", "Hex64", "NonEmpty", "JudgeModel", "JudgePart", "refusal_from", "jsonish"]

Hex64 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
NonEmpty = Annotated[str, StringConstraints(min_length=1)]

_SEAL = object()


class JudgeModel(BaseModel):
    """Strict, closed, frozen: no coercion, no unknown members, no setters.

    Optional members are typed without ``None`` and default to ``None`` (as in
    ``capseal.model``): an explicit ``null`` fails the strict check, and
    ``model_dump(exclude_none=True)`` leaves absent members absent.
    """

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, populate_by_name=True)

    def to_json(self) -> dict[str, Any]:
        """The JSON value, absent members left out, aliases used.

        Returns:
            The model as a JSON object.
        """
        return self.model_dump(mode="json", exclude_none=True, by_alias=True)


def jsonish(value: Any) -> Any:
    """A builder's arguments as the JSON they would become, models included,
    so the refusal engine can name the rule a refused value breaks.

    Args:
        value: any value a builder was given.

    Returns:
        ``value`` with models as their JSON and containers walked; a bare
        :class:`Target` (cited without a purpose) as a marker string that
        fails the schema.
    """
    if isinstance(value, JudgeModel):
        return value.to_json()
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_none=True, by_alias=True)
    if isinstance(value, Mapping):
        return {k: jsonish(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonish(v) for v in value]
    if isinstance(value, Target):
        return f"<Target {value.type} — cite it through a factory that sets judge_purpose>"
    return value


def refusal_from(exc: ValidationError, where: str) -> JudgmentRefusedError:
    """The first pydantic error as a named refusal.

    Args:
        exc: pydantic's error.
        where: what was being built (the message's start).

    Returns:
        A refusal named as the engine names it: the generic ``schema_*``
        names, ``sampling_float`` / ``float_in_record`` for a float,
        ``stored_rate_forbidden`` for a member that would store a rate.
    """
    err = exc.errors(include_url=False)[0]
    loc = [str(p) for p in err["loc"]]
    path = "$" + "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in loc)
    kind = err["type"]
    member = loc[-1] if loc else ""
    if kind == "missing":
        rule = "schema_required_member_missing"
    elif kind == "extra_forbidden":
        rule = "stored_rate_forbidden" if SCORE_MEMBER.search(member) else "legacy_citation_purpose" if member == "citation_purpose" else "schema_unknown_member"
    elif isinstance(err.get("input"), float):
        rule = "sampling_float" if "sampling" in loc or "sampling_params" in loc else "float_in_record"
    elif kind.startswith("literal") or kind.startswith("enum"):
        rule = "schema_enum_mismatch"
    elif kind in ("too_short", "string_too_short"):
        rule = "schema_too_short"
    elif kind in ("greater_than_equal", "less_than_equal"):
        rule = "schema_below_minimum" if kind == "greater_than_equal" else "schema_above_maximum"
    elif kind == "string_pattern_mismatch":
        rule = "digest_malformed" if "digest" in member else "schema_pattern_mismatch"
    else:
        rule = "schema_type_mismatch"
    return JudgmentRefusedError(f"{where}: {err['msg']}", rule=rule, path=path)


class JudgePart(JudgeModel):
    """A block of a record. Constructing one with a wrong value raises
    ``JudgmentRefusedError`` with a rule name, like everything else here."""

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise refusal_from(exc, type(self).__name__) from None


def _snapshot(value: Any) -> tuple[str, Any]:
    """The JSON digest of ``value`` and a copy parsed back from the bytes it
    covers: the copy cannot drift from the digest (a nested dict the caller
    keeps can)."""
    data = canonical_bytes(value)
    return raw_digest(data), json.loads(data)


def listed(items: Any, what: str) -> list[Any]:
    """``items`` as a list.

    Args:
        items: what a caller passed as a list.
        what: its parameter's name (for the refusal).

    Returns:
        A new list of the items.

    Raises:
        JudgmentRefusedError: ``argument_not_a_list`` for a str (a single
            digest, which iterates as its characters), a mapping, a lone
            Target or a non-iterable.
    """
    if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Iterable):
        raise JudgmentRefusedError(f"{what} is a list, not {type(items).__name__}", rule="argument_not_a_list", path=f"$.{what}")
    return list(items)


def computed(value: Any, what: str) -> Target:
    """``value``, if it is a Target: a digest is computed from the cited
    content, never typed in.

    Args:
        value: what a caller passed to cite.
        what: its parameter's name (for the refusal).

    Returns:
        The Target.

    Raises:
        JudgmentRefusedError: ``citation_not_computed`` for anything else.
    """
    if not isinstance(value, Target):
        raise JudgmentRefusedError(f"{what}: cite a Target computed from the cited content, not {type(value).__name__} "
                                   "(a digest is never typed in)", rule="citation_not_computed", path=f"$.{what}")
    return value


def as_mapping(value: Any, what: str) -> dict[str, Any]:
    """``value`` as a dict.

    Args:
        value: what a caller passed as an object.
        what: its parameter's name (for the refusal).

    Returns:
        A new dict of its members.

    Raises:
        JudgmentRefusedError: ``record_not_object`` when it is no mapping.
    """
    if not isinstance(value, Mapping):
        raise JudgmentRefusedError(f"{what} is an object, not {type(value).__name__}", rule="record_not_object", path=f"$.{what}")
    return dict(value)


def utf8_of(text: Any, what: str) -> bytes:
    """``text``'s UTF-8 bytes.

    Args:
        text: the text.
        what: what it is for (the refusal's start).

    Returns:
        Its UTF-8 encoding.

    Raises:
        JudgmentRefusedError: ``citation_content_type`` for a value that is
            not a str, or a str holding a lone surrogate.
    """
    if not isinstance(text, str):
        raise JudgmentRefusedError(f"{what} takes text (str), not {type(text).__name__}", rule="citation_content_type")
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise JudgmentRefusedError(f"{what}: the text is not valid Unicode ({exc.reason} at index {exc.start})",
                                   rule="citation_content_type") from None


class Target:
    """A cited thing's digest, computed here from its content.

    Build one with :meth:`of_json`, :meth:`of_bytes`, :meth:`of_text`,
    :meth:`of_capsule`, :meth:`of_record` or ``JudgmentStore.target``; the
    constructor is private (:meth:`recorded` is for digests a store or a
    sealed record already holds). ``content`` keeps the cited value (JSON, bytes or
    text) when the Target was made from it, so a store can keep it too.
    """

    __slots__ = ("type", "digest", "kind", "content")

    type: str
    digest: str
    kind: Literal["json", "bytes", "text", "capsule", "record"]
    content: Any

    def __init__(self, *, type: str, digest: str, kind: Any, content: Any = None, _seal: object = None) -> None:
        if _seal is not _SEAL:
            raise TypeError("a Target's digest is computed from the cited content: use Target.of_json/of_bytes/of_text/of_capsule/of_record")
        if not isinstance(type, str) or not type:
            raise JudgmentRefusedError("a cited target needs a non-empty type", rule="citation_type_missing")
        object.__setattr__(self, "type", type)
        object.__setattr__(self, "digest", digest)
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "content", content)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a Target is immutable")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Target) and (self.type, self.digest) == (other.type, other.digest)

    def __hash__(self) -> int:
        return hash((self.type, self.digest))

    def __repr__(self) -> str:
        return f"Target({self.type!r}, {self.digest[:16]}…)"

    @classmethod
    def of_json(cls, value: Any, *, type: str) -> Target:
        """A JSON value: digest = SHA-256 of its JCS bytes.

        ``content`` is a copy parsed back from those bytes: a caller changing its
        dict afterwards changes neither the Target nor what a store keeps.

        Args:
            value: the JSON value.
            type: what it is (``rubric``, ``refund-request`` …).

        Returns:
            The Target.

        Raises:
            CanonicalizationError: a value with no JCS form (a float, an unsafe
                integer, a non-JSON value).
            JudgmentRefusedError: ``citation_type_missing`` for an empty ``type``.
        """
        digest, content = _snapshot(value)
        return cls(type=type, digest=digest, kind="json", content=content, _seal=_SEAL)

    @classmethod
    def of_bytes(cls, data: bytes, *, type: str) -> Target:
        """Raw bytes (a prompt file, an axes file): digest = SHA-256 of the bytes.

        Args:
            data: the bytes.
            type: what they are.

        Returns:
            The Target.

        Raises:
            JudgmentRefusedError: ``citation_content_type`` for a value that is
                not bytes; ``citation_type_missing`` for an empty ``type``.
        """
        if not isinstance(data, (bytes, bytearray)):
            raise JudgmentRefusedError("of_bytes takes bytes; use of_text or of_json for other values", rule="citation_content_type")
        return cls(type=type, digest=raw_digest(bytes(data)), kind="bytes", content=bytes(data), _seal=_SEAL)

    @classmethod
    def of_text(cls, text: str, *, type: str) -> Target:
        """Text, digested as its UTF-8 bytes (what a file holding it would give).

        Args:
            text: the text.
            type: what it is.

        Returns:
            The Target.

        Raises:
            JudgmentRefusedError: ``citation_content_type`` for a value that is
                not a str or holds a lone surrogate; ``citation_type_missing`` for
        an empty ``type``.
        """
        return cls(type=type, digest=raw_digest(utf8_of(text, "of_text")), kind="text", content=text, _seal=_SEAL)

    @classmethod
    def of_capsule(cls, capsule: Any, *, type: str = "agent-action-capsule") -> Target:
        """A -05 capsule: digest = its recomputed capsule id, which must equal the
        one it carries.

        Args:
            capsule: a capsule dict or a ``SealedRecord``.
            type: what it is cited as.

        Returns:
            The Target.

        Raises:
            JudgmentRefusedError: ``citation_content_type`` for anything else;
                ``capsule_id_mismatch`` when the carried id is not the recomputed
                one.
            CanonicalizationError: a capsule with no JCS form.
        """
        body = getattr(capsule, "capsule", capsule)
        if not isinstance(body, Mapping):
            raise JudgmentRefusedError("of_capsule takes a capsule dict or a SealedRecord", rule="citation_content_type")
        _, content = _snapshot(body)  # the id and the content from one copy (see of_json)
        cid = capsule_id(content)
        carried = content.get("capsule_id")
        if carried is not None and carried != cid:
            raise JudgmentRefusedError(f"capsule carries id {carried!r} but its bytes give {cid}", rule="capsule_id_mismatch", path="$.capsule_id")
        return cls(type=type, digest=cid, kind="capsule", content=content, _seal=_SEAL)

    @classmethod
    def of_record(cls, record: Any, *, type: str | None = None) -> Target:
        """A judgment record: digest = SHA-256 of the body's JCS bytes.

        Args:
            record: a ``SealedJudgment``, a builder model, or a body dict.
            type: what it is cited as (default: its version's name, such as
                ``evaluation-report``).

        Returns:
            The Target.

        Raises:
            JudgmentRefusedError: ``citation_content_type`` for anything else.
            CanonicalizationError: a body with no JCS form.
        """
        body = record.body if hasattr(record, "body") and isinstance(record.body, Mapping) else record
        if hasattr(body, "body") and callable(body.body):
            body = body.body()
        if not isinstance(body, Mapping):
            raise JudgmentRefusedError("of_record takes a judgment record or its body", rule="citation_content_type")
        version = body.get("record_version") or body.get("result_version") or "record"
        name = type or str(version).split("/", 1)[0]
        digest, content = _snapshot(body)
        return cls(type=name, digest=digest, kind="record", content=content, _seal=_SEAL)

    @classmethod
    def recorded(cls, *, type: str, digest: str, kind: Any, content: Any) -> Target:
        """A Target for a digest already recorded, not computed here: one a
        store has just recomputed from its stored bytes
        (``JudgmentStore.target``), or one a sealed record cites that a
        re-run must cite again (``content`` None when no store holds it). A
        builder citing content uses the ``of_*`` constructors instead.

        Args:
            type: the target's type (non-empty).
            digest: the recorded digest.
            kind: ``json``, ``bytes``, ``text``, ``capsule`` or ``record``.
            content: the content the digest covers, or None.

        Returns:
            The Target.

        Raises:
            JudgmentRefusedError: ``type`` is empty or not a str.
        """
        return cls(type=type, digest=digest, kind=kind, content=content, _seal=_SEAL)

    def canonical(self) -> bytes:
        """The bytes the digest covers.

        Returns:
            For a JSON value, a capsule or a record, its JCS form; for text, its
            UTF-8; for bytes, the bytes.

        Raises:
            CanonicalizationError: JSON content with no JCS form.
        """
        if self.kind in ("json", "capsule", "record"):
            return canonical_bytes(self.content)
        if self.kind == "text":
            return str(self.content).encode("utf-8")
        return bytes(self.content)


class DigestRef(JudgePart):
    """``{digest_alg: "SHA-256", digest}`` — a digest with no purpose (a pin's
    prompt, axes or weights, a Close's head)."""

    digest_alg: Literal["SHA-256"]
    digest: Hex64

    @classmethod
    def of(cls, target: Target) -> DigestRef:
        """The digest of a Target, with no purpose.

        Args:
            target: the Target.

        Returns:
            ``{digest_alg: "SHA-256", digest}``.

        Raises:
            JudgmentRefusedError: ``citation_not_computed`` for anything but a Target.
        """
        return cls(digest_alg="SHA-256", digest=computed(target, "target").digest)

    @classmethod
    def of_bytes(cls, data: bytes) -> DigestRef:
        """The digest of raw bytes, with no purpose.

        Args:
            data: the bytes (``bytes``, ``bytearray`` or ``memoryview``).

        Returns:
            ``{digest_alg: "SHA-256", digest}``.

        Raises:
            JudgmentRefusedError: ``citation_content_type`` for anything else (an
                int would otherwise be that many zero bytes).
        """
        if not isinstance(data, (bytes, bytearray, memoryview)):  # bytes(3) would be three zero bytes
            raise JudgmentRefusedError(f"DigestRef.of_bytes takes bytes, not {type(data).__name__}",
                                       rule="citation_content_type")
        return cls(digest_alg="SHA-256", digest=raw_digest(bytes(data)))


class Citation(JudgePart):
    """``{type, digest_alg, digest, judge_purpose}`` (family §0), closed."""

    type: NonEmpty
    digest_alg: Literal["SHA-256"]
    digest: Hex64
    judge_purpose: NonEmpty

    @classmethod
    def to(cls, target: Target, purpose: str) -> Citation:
        """The citation of ``target`` for a field whose purpose is ``purpose``.

        Args:
            target: what is cited.
            purpose: the field's ``judge_purpose``.

        Returns:
            ``{type, digest_alg, digest, judge_purpose}``.

        Raises:
            JudgmentRefusedError: ``citation_not_computed`` for anything but a
                Target; a schema rule for an empty purpose.
        """
        target = computed(target, purpose)
        return cls(type=target.type, digest_alg="SHA-256", digest=target.digest, judge_purpose=purpose)
