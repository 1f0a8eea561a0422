"""The shipped JSON Schemas, read at run time by a small 2020-12 interpreter.

Why interpret the schemas instead of re-typing them: the refusal engine must
refuse "everything the shipped schemas require", and the surest way not to drift
from a schema is to run it. The interpreter covers exactly the keywords the
shipped judge, result and judgment-extension schemas use (``$ref`` to local
``$defs``, type, const, enum, pattern, min/maxLength, minimum/maximum, required,
properties, additionalProperties, minProperties, items, min/maxItems, contains
with min/maxContains, allOf, anyOf, oneOf, not, if/then/else, and
``format: date-time``). An unknown keyword raises at load time, so a re-vendored
schema that needs more is noticed, not silently half-checked.

Two deliberate differences from a stock validator:

* ``format: date-time`` is *enforced* (RFC 3339): the schemas cannot
  enforce it, and a record's times must be real times;
* every error carries the *schema path* of the failing keyword, which is how
  ``rules.py`` names the rule a record breaks.

Nothing here raises on bad instances: ``errors()`` returns a list.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from typing import Any

from .vocab import EPISTEMIC_TYPES, RESULT_SCHEMA, SHAPES

__all__ = [
    "SchemaError",
    "Validator",
    "load_schema",
    "validator_for",
    "render_path",
    "render_pointer",
    "is_rfc3339",
    "parity",
    "SCHEMA_FILES",
]

#: Every schema file the runtime ships (package data of ``capseal.judge``).
SCHEMA_FILES: tuple[str, ...] = (
    *(s.schema for s in SHAPES.values()),
    RESULT_SCHEMA,
    "judgment/judgment-extension-v1.json",
    "vendor/epistemic-types.json",
)

_ANNOTATIONS = frozenset({"$schema", "$id", "$comment", "title", "description", "$defs", "examples", "default"})
_KEYWORDS = frozenset({
    "$ref", "type", "const", "enum", "pattern", "minLength", "maxLength", "minimum", "maximum",
    "required", "properties", "additionalProperties", "minProperties", "items", "minItems", "maxItems",
    "contains", "minContains", "maxContains", "allOf", "anyOf", "oneOf", "not", "if", "then", "else", "format",
})

Path = tuple[str | int, ...]


@dataclass(frozen=True)
class SchemaError:
    """One failed schema keyword.

    ``path`` locates the instance value (object members as str, array indices as
    int); ``schema_path`` is the JSON pointer of the failing keyword inside the
    schema (``#/$defs/Case/required``); ``member`` names the missing or unknown
    member for ``required``/``additionalProperties``/``not``.
    """

    keyword: str
    path: Path
    schema_path: str
    message: str
    member: str | None = None


def render_path(path: Path) -> str:
    """A path as a JSONPath, odd member names in brackets.

    Args:
        path: member names and indexes.

    Returns:
        ``$.cases[0].method``, or ``$["x-evidence-links"]`` for a name that is
        not an identifier.
    """
    out = "$"
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.isidentifier():
            out += f".{part}"
        else:
            out += f"[{json.dumps(part, ensure_ascii=False)}]"
    return out


def render_pointer(path: Path) -> str:
    """A path as an RFC 6901 JSON pointer.

    Args:
        path: member names and indexes.

    Returns:
        ``/cases/0/method``.
    """
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


_RFC3339 = re.compile(
    # [0-9], not \d: in Python \d also matches other scripts' digits ("００")
    r"^([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})\Z"
)


# ECMA-262's WhiteSpace and LineTerminator: what "\s" matches there. Python's
# "\s" also takes U+001C–U+001F and U+0085 and leaves out U+FEFF.
_ECMA_SPACE = "\t\n\x0b\x0c\r \xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"


def _complement(members: str) -> str:
    """Class members (``\\U`` escapes) for every code point not in ``members``
    (single characters and ``a-b`` ranges). Why: a class cannot hold a
    negated class, so ``[a\\S]`` needs ECMA's non-space spelled out."""
    points: set[int] = set()
    i = 0
    while i < len(members):
        if i + 2 < len(members) and members[i + 1] == "-":
            points.update(range(ord(members[i]), ord(members[i + 2]) + 1))
            i += 3
        else:
            points.add(ord(members[i]))
            i += 1
    out, start = [], 0
    for cp in sorted(points) + [0x110000]:
        if cp > start:
            out.append(f"\\U{start:08x}-\\U{cp - 1:08x}")
        start = cp + 1
    return "".join(out)


# what an escape means in ECMA-262 (u flag), inside a class and outside one;
# \D and \W inside a class are right already under re.ASCII
_ECMA_CLASS = {"s": _ECMA_SPACE, "d": "0-9", "w": "A-Za-z0-9_"}
_ECMA_IN_CLASS = {**_ECMA_CLASS, "S": _complement(_ECMA_SPACE)}


@functools.lru_cache(maxsize=256)
def _ecma_pattern(pattern: str) -> re.Pattern[str]:
    r"""A JSON Schema (ECMA-262) pattern compiled for Python. Why not as is:
    in Python ``$`` also matches before a final newline, so ``^[0-9a-f]{64}$``
    let a 65-character "digest" ending in ``\n`` through (in ECMA-262 it
    matches only at the end), and ``\s``, ``\d`` and ``\w`` take other
    characters than in ECMA-262. So each unescaped ``$`` outside a class
    becomes ``\Z``, ``\s``/``\d``/``\w`` (and, outside a class, their
    negations) become ECMA's sets, and the pattern compiles with ``re.ASCII``
    so that ``\D``, ``\W`` and ``\b`` inside a class are ECMA's too;
    ``\S`` inside a class becomes the code points outside ECMA's spaces."""
    out: list[str] = []
    escaped, in_class = False, False
    for ch in pattern:
        if escaped:
            escaped = False
            if in_class and ch in _ECMA_IN_CLASS:
                out[-1] = _ECMA_IN_CLASS[ch]
                continue
            if not in_class and ch.lower() in _ECMA_CLASS:
                out[-1] = f"[{'^' if ch.isupper() else ''}{_ECMA_CLASS[ch.lower()]}]"
                continue
        elif ch == "\\":
            escaped = True
        elif ch == "[":
            in_class = True
        elif ch == "]":
            in_class = False
        elif ch == "$" and not in_class:
            out.append("\\Z")
            continue
        out.append(ch)
    return re.compile("".join(out), re.ASCII)


def is_rfc3339(value: str) -> bool:
    """Is ``value`` an RFC 3339 ``date-time`` (what JSON Schema's
    ``format: date-time`` means)?

    Args:
        value: the text.

    Returns:
        True for a real calendar date and time with a ``Z`` or numeric
        offset (a leap second allowed).
    """
    m = _RFC3339.match(value)
    if m is None:
        return False
    try:
        datetime(int(m[1]), int(m[2]), int(m[3]), int(m[4]), int(m[5]), min(int(m[6]), 59))
    except ValueError:
        return False
    if int(m[6]) > 60:
        return False
    offset = m[8]
    if offset not in ("Z", "z") and (int(offset[1:3]) > 23 or int(offset[4:6]) > 59):
        return False
    return True


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if value is True or value is False:
        return "boolean"
    if type(value) is int:
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _json_equal(a: Any, b: Any) -> bool:
    """JSON equality: ``true`` is not ``1``, key order does not matter."""
    ta, tb = _json_type(a), _json_type(b)
    if ta != tb:
        return False
    if ta == "array":
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b))
    if ta == "object":
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    return bool(a == b)


class Validator:
    """Validate instances against one schema document (never raises on instances).

    Args:
        schema: the schema document.

    Raises:
        ValueError: it uses a keyword the interpreter does not cover, or is
            not an object or a boolean where a schema belongs.
    """

    def __init__(self, schema: dict[str, Any]) -> None:
        self.schema = schema
        self._check_keywords(schema, "#")

    def _check_keywords(self, node: Any, where: str) -> None:
        if isinstance(node, bool):
            return
        if not isinstance(node, dict):
            raise ValueError(f"{where}: a schema is an object or a boolean")
        for key, value in node.items():
            if key in _ANNOTATIONS:
                if key == "$defs":
                    for name, sub in value.items():
                        self._check_keywords(sub, f"{where}/$defs/{name}")
                continue
            if key not in _KEYWORDS:
                raise ValueError(f"{where}: keyword {key!r} is not supported by capseal's schema interpreter")
            if key in ("allOf", "anyOf", "oneOf"):
                for i, sub in enumerate(value):
                    self._check_keywords(sub, f"{where}/{key}/{i}")
            elif key in ("not", "if", "then", "else", "items", "contains") or (key == "additionalProperties" and isinstance(value, dict)):
                self._check_keywords(value, f"{where}/{key}")
            elif key == "properties":
                for name, sub in value.items():
                    self._check_keywords(sub, f"{where}/properties/{name}")

    def _resolve(self, ref: str) -> tuple[Any, str]:
        if not ref.startswith("#/"):
            raise ValueError(f"only local $ref is supported, not {ref!r}")
        node: Any = self.schema
        for part in ref[2:].split("/"):
            node = node[part.replace("~1", "/").replace("~0", "~")]
        return node, ref

    def errors(self, instance: Any) -> list[SchemaError]:
        """Every failed keyword, in schema order. Never raises.

        Args:
            instance: the JSON value.

        Returns:
            The errors, each with its schema path (empty when valid).
        """
        return list(self._walk(instance, self.schema, (), "#"))

    def is_valid(self, instance: Any) -> bool:
        """Does ``instance`` meet the schema? Stops at the first failure. Never raises.

        Args:
            instance: the JSON value.

        Returns:
            True when no keyword fails.
        """
        return next(iter(self._walk(instance, self.schema, (), "#")), None) is None

    def _walk(self, inst: Any, schema: Any, path: Path, sp: str) -> Iterator[SchemaError]:
        if schema is True:
            return
        if schema is False:
            yield SchemaError("false", path, sp, "no value is allowed here")
            return
        if "$ref" in schema:
            target, ref = self._resolve(schema["$ref"])
            yield from self._walk(inst, target, path, ref)
        t = _json_type(inst)
        if "type" in schema:
            allowed = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
            if t not in allowed:
                yield SchemaError("type", path, f"{sp}/type", f"must be {' or '.join(allowed)}, not {t}")
                return
        if "const" in schema and not _json_equal(inst, schema["const"]):
            yield SchemaError("const", path, f"{sp}/const", f"must be {json.dumps(schema['const'])}")
        if "enum" in schema and not any(_json_equal(inst, e) for e in schema["enum"]):
            yield SchemaError("enum", path, f"{sp}/enum", f"must be one of {json.dumps(schema['enum'])}")
        if t == "string":
            yield from self._string(inst, schema, path, sp)
        elif t == "integer":
            if "minimum" in schema and inst < schema["minimum"]:
                yield SchemaError("minimum", path, f"{sp}/minimum", f"must be at least {schema['minimum']}")
            if "maximum" in schema and inst > schema["maximum"]:
                yield SchemaError("maximum", path, f"{sp}/maximum", f"must be at most {schema['maximum']}")
        elif t == "object":
            yield from self._object(inst, schema, path, sp)
        elif t == "array":
            yield from self._array(inst, schema, path, sp)
        yield from self._combinators(inst, schema, path, sp)

    def _string(self, inst: str, schema: dict[str, Any], path: Path, sp: str) -> Iterator[SchemaError]:
        if "minLength" in schema and len(inst) < schema["minLength"]:
            yield SchemaError("minLength", path, f"{sp}/minLength", f"must have at least {schema['minLength']} character(s)")
        if "maxLength" in schema and len(inst) > schema["maxLength"]:
            yield SchemaError("maxLength", path, f"{sp}/maxLength", f"must have at most {schema['maxLength']} characters")
        if "pattern" in schema and _ecma_pattern(schema["pattern"]).search(inst) is None:
            yield SchemaError("pattern", path, f"{sp}/pattern", f"must match {schema['pattern']}")
        if schema.get("format") == "date-time" and not is_rfc3339(inst):
            yield SchemaError("format", path, f"{sp}/format", "must be an RFC 3339 date-time, e.g. 2026-10-01T12:00:00Z")

    def _object(self, inst: dict[str, Any], schema: dict[str, Any], path: Path, sp: str) -> Iterator[SchemaError]:
        for name in schema.get("required", ()):
            if name not in inst:
                yield SchemaError("required", path, f"{sp}/required", f"required member {name!r} is missing", member=name)
        if "minProperties" in schema and len(inst) < schema["minProperties"]:
            yield SchemaError("minProperties", path, f"{sp}/minProperties", f"needs at least {schema['minProperties']} member(s)")
        props: dict[str, Any] = schema.get("properties", {})
        for name, sub in props.items():
            if name in inst:
                yield from self._walk(inst[name], sub, (*path, name), f"{sp}/properties/{name}")
        extra_schema = schema.get("additionalProperties", True)
        for name in inst:
            if name in props:
                continue
            if extra_schema is False:
                yield SchemaError("additionalProperties", path, f"{sp}/additionalProperties", f"member {name!r} is not allowed (closed object)", member=name)
            elif isinstance(extra_schema, dict):
                yield from self._walk(inst[name], extra_schema, (*path, name), f"{sp}/additionalProperties")

    def _array(self, inst: list[Any], schema: dict[str, Any], path: Path, sp: str) -> Iterator[SchemaError]:
        if "minItems" in schema and len(inst) < schema["minItems"]:
            yield SchemaError("minItems", path, f"{sp}/minItems", f"needs at least {schema['minItems']} item(s)")
        if "maxItems" in schema and len(inst) > schema["maxItems"]:
            yield SchemaError("maxItems", path, f"{sp}/maxItems", f"allows at most {schema['maxItems']} item(s)")
        if "items" in schema:
            for i, item in enumerate(inst):
                yield from self._walk(item, schema["items"], (*path, i), f"{sp}/items")
        if "contains" in schema:
            hits = sum(1 for item in inst if self.is_valid_against(item, schema["contains"]))
            lo, hi = schema.get("minContains", 1), schema.get("maxContains")
            if hits < lo or (hi is not None and hits > hi):
                want = f"exactly {lo}" if hi == lo else f"at least {lo}" + (f" and at most {hi}" if hi is not None else "")
                yield SchemaError("contains", path, f"{sp}/contains", f"must contain {want} matching item(s), has {hits}")

    def is_valid_against(self, inst: Any, schema: Any) -> bool:
        """Does ``inst`` meet ``schema``, a part of this validator's schema (its
        ``$ref`` resolved against the whole)? Never raises.

        Args:
            inst: the JSON value.
            schema: a subschema.

        Returns:
            True when no keyword fails.
        """
        return next(iter(self._walk(inst, schema, (), "#")), None) is None

    def _combinators(self, inst: Any, schema: dict[str, Any], path: Path, sp: str) -> Iterator[SchemaError]:
        for i, sub in enumerate(schema.get("allOf", ())):
            yield from self._walk(inst, sub, path, f"{sp}/allOf/{i}")
        if "anyOf" in schema:
            branches = [list(self._walk(inst, sub, path, f"{sp}/anyOf/{i}")) for i, sub in enumerate(schema["anyOf"])]
            if all(branches):
                yield SchemaError("anyOf", path, f"{sp}/anyOf", "matches none of the allowed shapes")
        if "oneOf" in schema:
            branches = [list(self._walk(inst, sub, path, f"{sp}/oneOf/{i}")) for i, sub in enumerate(schema["oneOf"])]
            valid = [i for i, errs in enumerate(branches) if not errs]
            if not valid:
                # report the closest branch: its errors name what to fix
                yield from min(branches, key=len)
            elif len(valid) > 1:
                yield SchemaError("oneOf", path, f"{sp}/oneOf", "matches more than one allowed shape")
        if "not" in schema and self.is_valid_against(inst, schema["not"]):
            sub = schema["not"]
            member = None
            if isinstance(sub, dict) and list(sub) == ["required"] and len(sub["required"]) == 1:
                member = sub["required"][0]
            detail = f"member {member!r} is not allowed here" if member else "matches a forbidden shape"
            yield SchemaError("not", path, f"{sp}/not", detail, member=member)
        if "if" in schema:
            if self.is_valid_against(inst, schema["if"]):
                if "then" in schema:
                    yield from self._walk(inst, schema["then"], path, f"{sp}/then")
            elif "else" in schema:
                yield from self._walk(inst, schema["else"], path, f"{sp}/else")


@functools.cache
def _load_text(name: str) -> str:
    node = resources.files("capseal.judge").joinpath("schemas")
    for part in name.split("/"):
        node = node.joinpath(part)
    return node.read_text(encoding="utf-8")


def load_schema(name: str) -> dict[str, Any]:
    """A shipped schema, by its path under ``capseal/judge/schemas``.

    Args:
        name: e.g. ``judge/close-v1.json``.

    Returns:
        A fresh copy of the schema.

    Raises:
        FileNotFoundError: no such schema ships.
    """
    value: dict[str, Any] = json.loads(_load_text(name))
    return value


@functools.cache
def validator_for(name: str, definition: str | None = None) -> Validator:
    """A cached validator for a shipped schema, or for one of its ``$defs``.

    Args:
        name: the schema's path, as :func:`load_schema`.
        definition: a ``$defs`` member to validate against instead of the root.

    Returns:
        The validator.

    Raises:
        FileNotFoundError: no such schema ships.
        KeyError: no such definition.
        ValueError: the schema uses a keyword the interpreter does not cover.
    """
    schema = load_schema(name)
    if definition is not None:
        schema = {"$defs": schema["$defs"], "$ref": f"#/$defs/{definition}"}
    return Validator(schema)


def parity() -> list[str]:
    """Three-way ``epistemic_type`` parity (judge-record-family-v1 §0): each
    schema's ``const`` equals ``SHAPES`` and lies in the vendored Evidence
    Layer set, and the vendored set equals ``EPISTEMIC_TYPES``.

    Returns:
        The problems found (empty when all three agree).
    """
    problems: list[str] = []
    vendored = load_schema("vendor/epistemic-types.json").get("values")
    if vendored != list(EPISTEMIC_TYPES):
        problems.append(f"vendored epistemic types {vendored} differ from capseal's {list(EPISTEMIC_TYPES)}")
    for shape in SHAPES.values():
        schema = load_schema(shape.schema)
        root = schema["$ref"].rsplit("/", 1)[-1]
        props = schema["$defs"][root]["properties"]
        const = props.get("epistemic_type", {}).get("const")
        version = props.get("record_version", {}).get("const")
        if const != shape.epistemic_type:
            problems.append(f"{shape.schema}: epistemic_type const {const!r} != capseal's {shape.epistemic_type!r}")
        if const not in (vendored or ()):
            problems.append(f"{shape.schema}: epistemic_type const {const!r} is not in the vendored set")
        if version != shape.record_version:
            problems.append(f"{shape.schema}: record_version const {version!r} != {shape.record_version!r}")
    return problems
