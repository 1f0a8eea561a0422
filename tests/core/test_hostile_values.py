"""Hostile values through every argument of the producer API: each is refused
at once with a typed capseal error that names the argument (or its JSON path),
and nothing is written, queued or created.

The values: lists and dicts that contain themselves, a value that shares its
parts so often that it would serialize to more members than memory holds,
integers of thousands of digits, nesting a thousand deep, lone surrogates in
strings and keys, and values that are not JSON at all."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from capseal import Producer, canonical_bytes, json_digest
from capseal.canonical import MAX_MEMBERS
from capseal.errors import CapsealError, LedgerError, NonJSONValueError
from capseal.keys import UnsafeEphemeralSigner

pytestmark = pytest.mark.timeout(120)  # a value that hangs the walk fails the test instead of the run


def _self_list() -> list[Any]:
    x: list[Any] = []
    x.append(x)
    return x


def _self_dict() -> dict[str, Any]:
    d: dict[str, Any] = {}
    d["a"] = {"b": d}
    return d


def _nested(depth: int, kind: type = list) -> Any:
    root: Any = [] if kind is list else {}
    cur = root
    for _ in range(depth):
        nxt: Any = [] if kind is list else {}
        if kind is list:
            cur.append(nxt)
        else:
            cur["k"] = nxt
        cur = nxt
    return root


def _shared(levels: int) -> list[Any]:
    a: list[Any] = []
    for _ in range(levels):
        a = [a, a]
    return a


HOSTILE: dict[str, Callable[[], Any]] = {
    "self-list": _self_list,
    "self-dict": _self_dict,
    "cycle-inside": lambda: {"ok": [1, 2, _self_list()]},
    "int-5000-digits": lambda: 10**5000,
    "negative-int-5000-digits": lambda: -(10**5000),
    "list-1000-deep": lambda: _nested(1000),
    "dict-1000-deep": lambda: _nested(1000, dict),
    "lone-surrogate": lambda: "call-\udc80",
    "surrogate-key": lambda: {"\ud800": 1},
    "float": lambda: 1.5,
    "nan": lambda: float("nan"),
    "bytes": lambda: b"\x00\x01",
    "set": lambda: {1, 2},
    "object": object,
}

# arguments that take any JSON value (digested, or a spec member): every
# hostile value must be refused; the others take strings (or a parent)
ANY_JSON = {"request", "response", "reason", "x-extra"}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    path = tmp_path_factory.mktemp("hostile") / "l.db"
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), path) as p:
        planned = p.planned("base", effect_type="write_order", request={"a": 1})
        dispatched = p.dispatched(planned)
        deferred = p.refused(action_id="def-1", verdict_class="deferred", decision="deferred")
        p.flush()
        yield {"p": p, "path": path, "planned": planned, "dispatched": dispatched, "deferred": deferred}


def _state(path: Path) -> str:
    digest = hashlib.sha256()
    for suffix in ("", "-wal"):
        part = Path(str(path) + suffix)
        digest.update(part.read_bytes() if part.exists() else b"")
    return digest.hexdigest()


def _spec_call(method: str, param: str) -> Callable[[dict[str, Any], Any], Any]:
    def call(w: dict[str, Any], value: Any) -> Any:
        spec: Any = {"action_id": "s-1", "action_type": "fyi"}
        kwargs: dict[str, Any] = {}
        if param == "spec":
            spec = value
        elif param in ("parent", "relation"):
            kwargs = {"parent": w["planned"], param: value} if param == "relation" else {param: value}
        else:
            spec = {**spec, param: value}
        result = getattr(w["p"], method)(spec, **kwargs)
        return result.result() if method == "submit" else result
    return call


CALLS: dict[tuple[str, str], Callable[[dict[str, Any], Any], Any]] = {}
for _param in ("action_id", "effect_type", "request", "irreversibility_class", "external_ref", "action_type", "x-extra"):
    CALLS[("planned", _param)] = (lambda k: lambda w, v: w["p"].planned(**{"action_id": "n-1", k: v}))(_param)
for _param in ("parent", "request", "effect_attestation", "action_id", "x-extra"):
    CALLS[("dispatched", _param)] = (lambda k: lambda w, v: w["p"].dispatched(**{"parent": w["planned"], k: v}))(_param)
for _param in ("parent", "response", "request", "effect_attestation", "action_id", "verdict_class"):
    CALLS[("confirmed", _param)] = (lambda k: lambda w, v: w["p"].confirmed(
        **{"parent": w["dispatched"], "response": {"ok": 1}, k: v}))(_param)
for _param in ("parent", "response", "request", "effect_attestation", "verdict_class", "action_id"):
    CALLS[("failed", _param)] = (lambda k: lambda w, v: w["p"].failed(**{"parent": w["dispatched"], k: v}))(_param)
for _param in ("parent", "verdict_class", "action_id", "decision", "approver", "reason", "authority"):
    CALLS[("refused", _param)] = (lambda k: lambda w, v: w["p"].refused(
        **{"action_id": "r-1", "verdict_class": "denied", k: v}))(_param)
for _param in ("open_record", "decision", "approver", "verdict_class", "action_id", "reason"):
    CALLS[("resolved", _param)] = (lambda k: lambda w, v: w["p"].resolved(
        **{"open_record": w["deferred"], "decision": "accept", "approver": "policy", k: v}))(_param)
for _method in ("seal", "check", "submit"):
    for _param in ("spec", "parent", "relation", "action_id", "developer", "operator", "epoch_id", "x-extra"):
        CALLS[(_method, _param)] = _spec_call(_method, _param)


@pytest.mark.parametrize(("method", "param"), sorted(CALLS), ids=[f"{m}-{p}" for m, p in sorted(CALLS)])
def test_every_hostile_value_is_refused_by_name_and_writes_nothing(world: dict[str, Any], method: str, param: str) -> None:
    before, count = _state(world["path"]), world["p"].ledger.count()
    for name, make in HOSTILE.items():
        value = make()
        if param not in ANY_JSON and name == "surrogate-key":
            continue  # a dict in a string argument: refused as any non-string is (covered by "set", "object")
        with pytest.raises(CapsealError) as refused:
            CALLS[(method, param)](world, value)
        message = str(refused.value)
        assert param in message or "spec" in message or "$" in message, (name, message)
        assert len(message) < 600, (name, len(message))  # a value is described, never dumped whole
    world["p"].flush()
    assert world["p"].ledger.count() == count
    assert _state(world["path"]) == before


@pytest.mark.parametrize("name", sorted(HOSTILE))
@pytest.mark.parametrize("param", ["operator", "developer", "epoch_id", "model_id", "provider"])
def test_a_refused_producer_leaves_no_file(tmp_path: Path, param: str, name: str) -> None:
    path = tmp_path / "l.db"
    kwargs: dict[str, Any] = {"model_id": "m-1", "provider": "p-1"} if param in ("model_id", "provider") else {}
    kwargs[param] = HOSTILE[name]()
    with pytest.raises(CapsealError) as refused:
        Producer(**{"operator": "acme", "developer": "agent@1", "signer": UnsafeEphemeralSigner(), "ledger": path,
                    **kwargs})  # type: ignore[arg-type]  # deliberately wrong values
    assert param in str(refused.value)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("value", ["acme\x1fagent", "acme\x00", "line\nbreak", "tab\there"])
def test_control_characters_in_the_producer_names_are_refused(tmp_path: Path, value: str) -> None:
    # U+001F separates operator and developer in the ledger's stream key:
    # "a\x1fb" + "c" and "a" + "b\x1fc" would be one producer's stream
    for param in ("operator", "developer"):
        with pytest.raises(CapsealError, match=f"{param} holds a control character"):
            Producer(**{"operator": "acme", "developer": "agent@1", "signer": UnsafeEphemeralSigner(),  # type: ignore[arg-type]
                        "ledger": tmp_path / "l.db", param: value})
    assert os.listdir(tmp_path) == []


def test_a_ledger_path_with_a_nul_byte_is_a_ledger_error(tmp_path: Path) -> None:
    with pytest.raises(LedgerError, match="NUL byte"):
        Producer("acme", "agent@1", UnsafeEphemeralSigner(), str(tmp_path / "l\x00.db"))
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("name", ["self-list", "self-dict", "cycle-inside"])
@pytest.mark.parametrize("fn", [json_digest, canonical_bytes])
def test_a_value_that_contains_itself_is_named_as_a_cycle(fn: Callable[..., Any], name: str) -> None:
    with pytest.raises(NonJSONValueError, match="contains itself"):
        fn(HOSTILE[name]())


def test_a_value_that_would_serialize_to_too_many_members_is_refused() -> None:
    bomb = _shared(64)  # 65 lists in memory, 2**64 leaves serialized
    with pytest.raises(NonJSONValueError, match=f"more than {MAX_MEMBERS:,}"):
        json_digest(bomb, path="request")
    shared = _shared(10)  # shared parts are fine when the whole stays small: hashed as their copy is
    assert json_digest(shared) == json_digest(json.loads(canonical_bytes(shared)))


class _RaisingKey(str):
    """A key whose comparisons raise: sorting it would run its code."""

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("compared")

    def __lt__(self, other: object) -> bool:
        raise RuntimeError("compared")

    __hash__ = str.__hash__


def test_a_str_subclass_key_that_raises_when_compared_is_refused_by_name(world: dict[str, Any]) -> None:
    """Its type is refused before any sort compares it: the typed error, not its own."""
    before, count = _state(world["path"]), world["p"].ledger.count()
    for method in ("seal", "check", "submit"):
        spec = {"action_id": "k-1", "action_type": "fyi", "x-extra": {"a": 1, _RaisingKey("b"): 2, "c": 3}}
        with pytest.raises(NonJSONValueError, match="object key 'b' is not a string") as refused:
            _spec_call(method, "spec")(world, spec)
        assert refused.value.path == '$["x-extra"]'  # type: ignore[attr-defined]
    world["p"].flush()
    assert world["p"].ledger.count() == count
    assert _state(world["path"]) == before
