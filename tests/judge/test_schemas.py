"""The shipped schemas: byte-equal to the vendored copies, three-way epistemic_type
parity, and capseal's schema interpreter agreeing with jsonschema (2020-12)."""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from capseal.judge.schema import SCHEMA_FILES, Validator, is_rfc3339, load_schema, parity, validator_for
from capseal.judge.vocab import EPISTEMIC_TYPES, SHAPES

from .conftest import DATA, JUDGE, JUDGMENT, RESULT, load

SHIPPED = Path(__file__).resolve().parents[2] / "sdk" / "judge" / "schemas"


@pytest.mark.parametrize("name", SCHEMA_FILES)
def test_runtime_schemas_equal_the_vendored_copies(name: str) -> None:
    assert (SHIPPED / name).read_bytes() == (DATA / "schemas" / name).read_bytes()
    assert load_schema(name) == json.loads((DATA / "schemas" / name).read_text())


@pytest.mark.parametrize("folder", [RESULT, JUDGMENT])
def test_vendored_vectors_match_their_sha256sums(folder: Path) -> None:
    checked = 0
    for line in (folder / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split()
        if (folder / name).exists():  # the sums list upstream files not copied here
            assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest, name
            checked += 1
    assert checked >= 3


def test_epistemic_type_parity_three_ways() -> None:
    assert parity() == []
    assert load_schema("vendor/epistemic-types.json")["values"] == list(EPISTEMIC_TYPES)
    for shape in SHAPES.values():
        schema = load_schema(shape.schema)
        root = schema["$ref"].rsplit("/", 1)[-1]
        assert schema["$defs"][root]["properties"]["epistemic_type"] == {"const": shape.epistemic_type}


def test_parity_notices_a_mutant(monkeypatch: pytest.MonkeyPatch) -> None:
    from capseal.judge import schema as schema_mod
    from capseal.judge.vocab import Shape

    mutant = dict(SHAPES)
    mutant["human-rating/v1"] = Shape("human-rating/v1", "observed_event", "judge/human-rating-v1.json", "rated_at")
    monkeypatch.setattr(schema_mod, "SHAPES", mutant)
    assert any("human-rating" in p for p in schema_mod.parity())


def test_interpreter_refuses_unknown_keywords() -> None:
    with pytest.raises(ValueError, match="not supported"):
        Validator({"type": "object", "dependentRequired": {"a": ["b"]}})


# --------------------------------------------------------------------------- agreement with jsonschema


def _schema_for(path: Path) -> str:
    if path.parent.parent == JUDGE:
        return next(s.schema for s in SHAPES.values() if s.name == path.parent.name)
    return "evidence-result-v0.json"


def _mutations(doc: Any, focus: str | None = None) -> Iterator[Any]:
    """Single-edit mutants: drop a member, add one, retype a scalar, empty a list,
    replace a string with an unknown token."""
    paths: list[tuple[Any, ...]] = []

    def walk(node: Any, path: tuple[Any, ...]) -> None:
        paths.append(path)
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, (*path, k))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, (*path, i))

    walk(doc, ())
    # Results repeat one claim shape three times: mutate the disclosed claim and
    # the withheld one (the two presentation branches), not the middle one.
    paths = [p for p in paths if p[:2] != ("claims", 1) and "proofs" not in p and (focus is None or focus in p)]

    def edit(path: tuple[Any, ...], fn: Any) -> Any:
        out = copy.deepcopy(doc)
        node = out
        for p in path[:-1]:
            node = node[p]
        fn(node, path[-1])
        return out

    for path in paths:
        if not path:
            continue
        yield edit(path, lambda n, k: n.pop(k) if isinstance(n, dict) else n.__setitem__(k, {}))
        yield edit(path, lambda n, k: n.__setitem__(k, "bogus-token"))
        yield edit(path, lambda n, k: n.__setitem__(k, 7))
        yield edit(path, lambda n, k: n.__setitem__(k, True))
        yield edit(path, lambda n, k: n.__setitem__(k, []))
        yield edit(path, lambda n, k: n.__setitem__(k, {"x": 1}))
    for path in paths:
        yield edit((*path, "x-extra"), lambda n, k: n.__setitem__(k, 1) if isinstance(n, dict) else None)


VECTOR_FILES = sorted(JUDGE.glob("*/*.json")) + sorted(RESULT.glob("*.json"))


@pytest.mark.parametrize("path", VECTOR_FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_interpreter_agrees_with_jsonschema(path: Path) -> None:
    name = _schema_for(path)
    ours = validator_for(name)
    theirs = jsonschema.Draft202012Validator(load_schema(name))
    doc = load(path)

    def ours_valid(d: Any) -> bool:
        # date-time is the one deliberate difference (enforced here, annotation there)
        return all(e.keyword == "format" for e in ours.errors(d))

    assert ours_valid(doc) == theirs.is_valid(doc)
    if path.parent == RESULT and not path.name.startswith("pos-"):
        return  # negatives of the result set differ from a positive by one edit: covered by its mutants
    focus = "implementation" if path.name == "pos-example-org-recomputed-code-identity-result.json" else None
    mutants = list(_mutations(doc, focus))
    disagreements = [m for m in mutants if ours_valid(m) != theirs.is_valid(m)]
    assert not disagreements, json.dumps(disagreements[0])[:400]
    assert sum(not theirs.is_valid(m) for m in mutants) > 10  # the mutants do exercise the schema


def test_date_time_is_enforced_where_jsonschema_only_annotates() -> None:
    doc = load(JUDGE / "human-rating" / "pos-example-org-human-rating.json")
    doc["rated_at"] = "yesterday"
    assert jsonschema.Draft202012Validator(load_schema("judge/human-rating-v1.json")).is_valid(doc)
    errors = validator_for("judge/human-rating-v1.json").errors(doc)
    assert [e.keyword for e in errors] == ["format"]


@pytest.mark.parametrize(
    "value, ok",
    [("2026-10-01T12:00:00Z", True), ("2026-10-01T12:00:00.123+02:00", True), ("2026-02-30T00:00:00Z", False),
     ("2026-10-01 12:00:00Z", False), ("2026-10-01T25:00:00Z", False), ("2026-10-01T12:00:00", False)],
)
def test_rfc3339(value: str, ok: bool) -> None:
    assert is_rfc3339(value) is ok
