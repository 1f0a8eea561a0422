"""The base of the eight judge-family shapes (:class:`JudgeRecord`).

:mod:`capseal.judge.shapes` exports it with the shapes; see there for what a
shape guarantees.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, TypeVar

from pydantic import Field, ValidationError

from capseal.errors import JudgmentRefusedError

from .citation import JudgeModel, NonEmpty, Target, jsonish, refusal_from
from .rules import check_body, raise_first
from .vocab import SHAPES, Shape

__all__ = ["Count", "JudgeRecord"]

Count = Annotated[int, Field(ge=0, le=2**53 - 1)]
R = TypeVar("R", bound="JudgeRecord")



class JudgeRecord(JudgeModel):
    """Base of the eight shapes: ``record_id`` plus class-fixed version and type."""

    RECORD_VERSION: ClassVar[str] = ""
    FIXED: ClassVar[dict[str, Any]] = {}

    record_id: NonEmpty

    def __init__(self, **data: Any) -> None:
        for member, rule in (("record_version", "record_version_fixed_by_shape"), ("epistemic_type", "epistemic_type_fixed_by_shape")):
            if member in data:
                raise JudgmentRefusedError(
                    f"{member} comes from the shape ({self.shape().record_version}: {getattr(self.shape(), member)}); it is never set by a caller",
                    rule=rule,
                    path=f"$.{member}",
                )
        for member, value in self.FIXED.items():
            if member in data:
                if data[member] is not value:
                    raise JudgmentRefusedError(f"{member} is fixed to {value!r} in {self.RECORD_VERSION}", rule="rating_not_blind" if member == "blind" else "schema_const_mismatch", path=f"$.{member}")
                data = {k: v for k, v in data.items() if k != member}
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raw = {"record_version": self.RECORD_VERSION, "epistemic_type": self.shape().epistemic_type, **self.FIXED, **jsonish(data)}
            raise_first(check_body(raw), self.RECORD_VERSION)
            raise refusal_from(exc, self.RECORD_VERSION) from None
        raise_first(check_body(self.body()), self.RECORD_VERSION)

    @classmethod
    def shape(cls) -> Shape:
        """The shape this class builds.

        Returns:
            Its entry in ``SHAPES`` (version, record type, epistemic type, schema).
        """
        return SHAPES[cls.RECORD_VERSION]

    @property
    def epistemic_type(self) -> str:
        """Fixed by the shape at commit; there is no setter."""
        return self.shape().epistemic_type

    @property
    def record_version(self) -> str:
        return self.RECORD_VERSION

    def body(self) -> dict[str, Any]:
        """The record body as sealed (JSON), ``record_version``/``epistemic_type``
        included.

        Returns:
            The body.
        """
        return {"record_version": self.RECORD_VERSION, "epistemic_type": self.shape().epistemic_type, **self.FIXED, **self.to_json()}

    def target(self) -> Target:
        """This record as something another record can cite or link to.

        Returns:
            Its Target.
        """
        return Target.of_record(self.body(), type=self.shape().name)

    @classmethod
    def from_body(cls: type[R], body: Mapping[str, Any]) -> R:
        """Read a body: the refusal engine first (named rules), then the model.

        Args:
            body: the body, ``record_version`` and ``epistemic_type`` included.

        Returns:
            The record.

        Raises:
            JudgmentRefusedError: the first rule it breaks, or
                ``record_version_mismatch`` for another shape's body.
        """
        raise_first(check_body(body), cls.RECORD_VERSION or "judgment record")
        if body.get("record_version") != cls.RECORD_VERSION:
            raise JudgmentRefusedError(f"{body.get('record_version')!r} is not {cls.RECORD_VERSION}", rule="record_version_mismatch", path="$.record_version")
        fields = {k: v for k, v in body.items() if k not in ("record_version", "epistemic_type", *cls.FIXED)}
        return cls(**fields)
