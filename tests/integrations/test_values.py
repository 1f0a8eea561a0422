"""Tool arguments and results as exact JSON: which string a float becomes, and
what cannot be digested (recorded as absent, never raised into the agent)."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import uuid
from typing import Any

import pydantic
import pytest

from capseal.canonical import json_digest
from capseal.errors import NonJSONValueError
from capseal.integrations import exact_float, exact_json
from capseal.integrations.values import NotExactJSON, digest_of


@pytest.mark.parametrize(("value", "written"), [
    (0.1, "0.1"), (2.50, "2.5"), (1.0, "1.0"), (-0.0, "-0.0"), (1e21, "1e+21"), (1e-07, "1e-07"),
    (123456789.125, "123456789.125"), (0.1 + 0.2, "0.30000000000000004"), (5e-324, "5e-324"),
    (1.7976931348623157e308, "1.7976931348623157e+308"),
    (float("nan"), "nan"), (float("inf"), "inf"), (float("-inf"), "-inf"),
])
def test_a_float_is_written_as_its_shortest_round_trip_repr(value: float, written: str) -> None:
    assert exact_float(value) == written
    assert exact_json({"x": value}) == {"x": written}
    if written not in ("nan", "inf", "-inf"):
        assert float(written) == value  # it reads back as the same float


def test_a_float_subclass_is_written_by_the_same_rule_not_its_own_repr() -> None:
    class Float64(float):
        def __repr__(self) -> str:
            return f"np.float64({float(self)!r})"

    assert exact_json([Float64(0.1)]) == ["0.1"]


def test_unsafe_integers_tuples_and_integer_keys() -> None:
    big = 2**53
    assert exact_json({"n": big, "m": -big, "ok": 2**53 - 1, 7: (1, True, None)}) == {
        "n": "9007199254740992", "m": "-9007199254740992", "ok": 9007199254740991, "7": [1, True, None]}


def test_objects_through_their_json_form_with_floats_exact() -> None:
    class Colour(enum.Enum):
        RED = "red"

    @dataclasses.dataclass
    class Point:
        x: float
        y: int

    class Order(pydantic.BaseModel):
        amount: float
        when: datetime.date

    out = exact_json({"p": Point(0.5, 2), "o": Order(amount=12.375, when=datetime.date(2026, 10, 1)),
                      "c": Colour.RED, "u": uuid.UUID(int=1), "d": decimal.Decimal("1.10"), "b": b"ok"})
    assert out == {"p": {"x": "0.5", "y": 2}, "o": {"amount": "12.375", "when": "2026-10-01"}, "c": "red",
                   "u": "00000000-0000-0000-0000-000000000001", "d": "1.10", "b": "ok"}


def _cycle() -> Any:
    loop: list[Any] = []
    loop.append(loop)
    return loop


def _deep() -> Any:
    value: Any = "bottom"
    for _ in range(500):
        value = [value]
    return value


@pytest.mark.parametrize("value", [{1, 2}, _cycle(), b"\xff", {"k": object()}, {1: "a", "1": "b"}, _deep(),
                                   {(1, 2): "tuple key"}], ids=["set", "cycle", "bytes", "object", "keys", "deep",
                                                                "tuple-key"])
def test_what_cannot_be_written_exactly_is_refused_by_path(value: Any) -> None:
    with pytest.raises(NotExactJSON) as refused:
        exact_json(value)
    assert isinstance(refused.value, NonJSONValueError) and " at $" in str(refused.value)
    assert digest_of(value) == (None, "not_json")


def test_a_lone_surrogate_is_not_digested() -> None:
    assert digest_of({"s": "\ud800"}) == (None, "not_json")


def test_the_digest_is_over_the_exact_form() -> None:
    assert digest_of({"amount": 12.375, "n": 2**60}) == (json_digest({"amount": "12.375", "n": str(2**60)}), None)
