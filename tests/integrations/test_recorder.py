"""The framework-free core: pairing on ids (never order), open calls, seal
failures in both modes, what of a call enters a capsule."""

from __future__ import annotations

import asyncio
import logging
import random
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from capseal import Producer
from capseal.aio import AsyncProducer
from capseal.errors import InputError, LedgerBusyError, MissingExtraError, ToolCallBlockedError, ToolCallPairingError
from capseal.integrations import EXTENSION, SealFailure, ToolCallRecorder
from capseal.keys import UnsafeEphemeralSigner
from capseal.ledger import Ledger

from .support import (
    assert_nothing_raw,
    assert_reference_accepts,
    cli_verify,
    digest,
    failures_of,
    ledger_locked,
    open_items,
    secret,
    tool_calls,
)


@pytest.fixture()
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "calls.db", lock_timeout=0.1)


@pytest.fixture()
def producer(ledger: Ledger) -> Any:
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), ledger) as p:
        yield p
    ledger.close()


def _recorder(producer: Producer, seen: list[SealFailure] | None = None, **kw: Any) -> ToolCallRecorder:
    return ToolCallRecorder(producer, framework="test", on_seal_error=None if seen is None else seen.append, **kw)


def test_ends_are_paired_by_key_whatever_their_order(producer: Producer) -> None:
    """16 threads start calls at once and end them in a shuffled order: every
    outcome is chained to its own planned capsule, with its own arguments'
    and response's digests (a pairing by order would shift them)."""
    recorder = _recorder(producer)
    keys = [f"call-{i}" for i in range(16)]
    barrier = threading.Barrier(len(keys))

    def start(i: int) -> None:
        barrier.wait()
        recorder.start(tool="t", arguments={"i": i, "x": i / 8}, ids={"call_id": keys[i]}, key=keys[i])

    threads = [threading.Thread(target=start, args=(i,)) for i in range(len(keys))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    order = list(range(len(keys)))
    random.Random(7).shuffle(order)
    for i in order:
        recorder.finish_key(keys[i], "returned" if i % 3 else "raised", {"out": i * 7})
    calls = {c.ids["call_id"]: c for c in tool_calls(producer.ledger.path)}
    assert len(calls) == 16
    for i, key in enumerate(keys):
        call = calls[key]
        assert call.effect["request_digest"] == digest({"i": i, "x": i / 8})
        if i % 3:
            assert call.status == "confirmed" and call.effect["response_digest"] == digest({"out": i * 7})
        else:
            assert call.status == "failed" and call.kind == "raised"
    assert recorder.open_calls() == [] and open_items(producer.ledger.path) == []
    assert_reference_accepts(producer.ledger.path)


def test_many_concurrent_async_calls_are_kept_apart(producer: Producer) -> None:
    recorder = _recorder(producer)

    async def one(i: int) -> None:
        call = await recorder.astart(tool="t", arguments={"i": i}, ids={"call_id": str(i)})
        await asyncio.sleep(random.Random(i).random() / 50)
        await call.aconfirmed({"out": -i})

    async def main() -> None:
        await asyncio.gather(*(one(i) for i in range(40)))

    asyncio.run(main())
    calls = {c.ids["call_id"]: c for c in tool_calls(producer.ledger.path)}
    assert len(calls) == 40
    for i in range(40):
        assert calls[str(i)].effect["request_digest"] == digest({"i": i})
        assert calls[str(i)].effect["response_digest"] == digest({"out": -i})
    recorder.close()


class _Watched(dict):  # type: ignore[type-arg]
    """Arguments that note the threads reading them (the digest reads them)."""

    readers: set[int] = set()

    def items(self) -> Any:
        _Watched.readers.add(threading.get_ident())
        return super().items()


class _WatchedSigner(UnsafeEphemeralSigner):
    """A software key that notes the threads it signs on."""

    signers: set[int] = set()

    def sign(self, data: bytes) -> Any:
        _WatchedSigner.signers.add(threading.get_ident())
        return super().sign(data)


def test_an_async_hook_digests_and_seals_off_the_event_loop(tmp_path: Path) -> None:
    with Producer("acme", "agent@1", _WatchedSigner(), tmp_path / "loop.db") as producer:
        recorder = _recorder(producer)
        _Watched.readers.clear()
        _WatchedSigner.signers.clear()

        async def main() -> int:
            call = await recorder.astart(tool="t", arguments=_Watched(big="x" * 100_000))
            await call.aconfirmed(_Watched(out=1))
            return threading.get_ident()

        loop_thread = asyncio.run(main())
        recorder.close()
    assert _Watched.readers and loop_thread not in _Watched.readers
    assert _WatchedSigner.signers and loop_thread not in _WatchedSigner.signers
    assert [c.status for c in tool_calls(producer.ledger.path)] == ["confirmed"]


def test_a_recorder_over_an_async_producer_seals_through_it(producer: Producer) -> None:
    aio = AsyncProducer(producer)
    recorder = ToolCallRecorder(aio, framework="test")
    assert recorder.producer is producer
    recorder.start(tool="sync", arguments=1).confirmed(2)

    async def main() -> None:
        call = await recorder.astart(tool="async", arguments=3)
        await call.aconfirmed(4)

    asyncio.run(main())
    recorder.close()  # the AsyncProducer given, and its producer, stay open
    assert [c.status for c in tool_calls(producer.ledger.path)] == ["confirmed", "confirmed"]
    asyncio.run(aio.seal({"action_id": "after", "action_type": "fyi"}))


def test_a_float_never_drops_the_planned_capsule(producer: Producer) -> None:
    """Floats (NaN too), unsafe integers and even a value with no JSON form: the
    planned capsule is sealed; the request digest is over the exact form, or
    absent with the reason."""
    recorder = _recorder(producer)
    args = {"amount": 12.375, "ratio": float("nan"), "big": 2**64, "nested": [0.1, {"y": -0.0}]}
    first = recorder.start(tool="pay", arguments=args)
    second = recorder.start(tool="pay", arguments={"tags": {"a", "b"}})
    assert first.planned is not None and second.planned is not None
    first.confirmed({"ok": 1.5})
    second.confirmed("done")
    calls = {c.planned["capsule_id"]: c for c in tool_calls(producer.ledger.path)}
    one, two = calls[first.planned.capsule_id], calls[second.planned.capsule_id]
    assert one.effect["request_digest"] == digest({"amount": "12.375", "ratio": "nan", "big": str(2**64),
                                                   "nested": ["0.1", {"y": "-0.0"}]})
    assert "request_digest" not in two.effect and two.outcome is not None
    assert two.outcome[EXTENSION]["absent"] == {"request_digest": "not_json"}
    assert_reference_accepts(producer.ledger.path)


def test_a_key_reused_while_open_is_never_paired(producer: Producer) -> None:
    seen: list[SealFailure] = []
    recorder = _recorder(producer, seen)
    recorder.start(tool="a", arguments=1, ids={"call_id": "same"}, key="same")
    recorder.start(tool="b", arguments=2, ids={"call_id": "same"}, key="same")
    assert recorder.finish_key("same", "returned", "x") is None
    assert recorder.finish_key("same", "returned", "y") is None
    assert [f.stage for f in seen] == ["pairing", "pairing"]
    assert all(isinstance(f.error, ToolCallPairingError) for f in seen)
    assert [(c.tool, c.reason) for c in recorder.open_calls()] == [("a", "unpaired"), ("b", "unpaired")]
    assert [c.status for c in tool_calls(producer.ledger.path)] == [None, None]
    assert len(open_items(producer.ledger.path)) == 2
    # once both ends came, the key is free again
    recorder.start(tool="c", arguments=3, key="same")
    assert recorder.finish_key("same", "returned", "z") is not None


def test_an_end_without_a_start_and_a_second_end_seal_nothing(producer: Producer) -> None:
    seen: list[SealFailure] = []
    recorder = _recorder(producer, seen)
    assert recorder.finish_key("never-started", "returned", 1) is None
    call = recorder.start(tool="t", arguments=1)
    assert call.confirmed(2) is not None
    assert call.failed() is None
    assert [f.stage for f in seen] == ["pairing", "pairing"]
    assert [c.status for c in tool_calls(producer.ledger.path)] == ["confirmed"]


def test_default_mode_a_failed_planned_seal_lets_the_call_run_and_records_nothing(producer: Producer,
                                                                                  ledger: Ledger) -> None:
    seen: list[SealFailure] = []
    recorder = _recorder(producer, seen)
    before = ledger.count()
    with ledger_locked(ledger.path):
        call = recorder.start(tool="t", arguments={"a": 1}, key="k")
    assert call.planned is None
    assert recorder.finish_key("k", "returned", 1) is None  # no outcome without its planned capsule
    assert ledger.count() == before
    (failure,) = seen
    assert failure.stage == "planned" and not failure.blocked and isinstance(failure.error, LedgerBusyError)
    assert recorder.open_calls() == []


def test_fail_closed_a_failed_planned_seal_stops_the_call(producer: Producer, ledger: Ledger) -> None:
    seen: list[SealFailure] = []
    recorder = _recorder(producer, seen, fail_closed=True)
    before = ledger.count()
    with ledger_locked(ledger.path), pytest.raises(ToolCallBlockedError) as blocked:
        recorder.start(tool="t", arguments={"a": 1}, key="k")
    assert isinstance(blocked.value.__cause__, LedgerBusyError)
    assert ledger.count() == before and seen[0].blocked
    assert not recorder.has_key("k")

    async def later() -> None:
        with ledger_locked(ledger.path), pytest.raises(ToolCallBlockedError):
            await recorder.astart(tool="t", arguments={"a": 2})

    asyncio.run(later())
    assert ledger.count() == before
    recorder.close()


def test_an_outcome_that_could_not_be_sealed_leaves_the_call_open_and_verify_says_so(producer: Producer,
                                                                                   ledger: Ledger) -> None:
    seen: list[SealFailure] = []
    recorder = _recorder(producer, seen)
    call = recorder.start(tool="t", arguments={"a": 1})
    with ledger_locked(ledger.path):
        assert call.confirmed({"r": 1}) is None
    assert failures_of(seen, "outcome") and call.planned is not None
    assert [(c.capsule_id, c.reason) for c in recorder.open_calls()] == [(call.planned.capsule_id, "outcome_not_sealed")]
    assert open_items(ledger.path) == [call.action_id]
    assert "open items: 1 planned or dispatched effect(s) with no outcome" in cli_verify(ledger.path)
    assert call.confirmed({"r": 1}) is not None  # the outcome may be sealed once the ledger is back
    assert recorder.open_calls() == [] and open_items(ledger.path) == []
    assert "open items" not in cli_verify(ledger.path)


def test_a_callback_that_raises_never_reaches_the_agent(producer: Producer, ledger: Ledger,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    def angry(failure: SealFailure) -> None:
        raise RuntimeError("callback broke")

    recorder = ToolCallRecorder(producer, framework="test", on_seal_error=angry)
    with caplog.at_level(logging.WARNING, "capseal.integrations"), ledger_locked(ledger.path):
        call = recorder.start(tool="t", arguments=1)
    assert call.planned is None and "callback broke" in caplog.text


def test_only_allow_listed_context_enters_in_clear_or_as_digest(producer: Producer) -> None:
    hidden, shown = secret("ctx-hidden"), secret("ctx-shown")
    recorder = _recorder(producer, context={"tags": "clear", "metadata": "digest", "odd": "clear"})
    call = recorder.start(tool="t", arguments=1, context={"tags": [shown, 0.5], "metadata": {"user": hidden},
                                                          "agent_state": hidden, "odd": {1, 2}})
    call.confirmed(1)
    extension = tool_calls(producer.ledger.path)[0].planned[EXTENSION]
    assert extension["context"] == {"tags": [shown, "0.5"]}
    assert extension["context_digests"] == {"metadata": digest({"user": hidden})}
    assert extension["absent"] == {"context.odd": "not_json"}
    assert_nothing_raw(producer.ledger.path, hidden)
    for bad in ({"tags": "plain"}, {"": "clear"}, ["tags"]):
        with pytest.raises(InputError):
            ToolCallRecorder(producer, framework="test", context=bad)  # type: ignore[arg-type]


def test_what_the_hook_did_not_see_is_absent_never_guessed(producer: Producer) -> None:
    recorder = _recorder(producer)
    unseen = recorder.start(tool="t")            # no arguments seen
    unseen.failed()                              # a failure with no response
    nothing = recorder.start(tool="t", arguments=None)
    nothing.confirmed(None)                      # the tool returned None: a digest of JSON null
    odd = recorder.start(tool="t", arguments=1)
    odd.confirmed(object())                      # a result with no JSON form: not confirmed
    ended = recorder.start(tool="t", arguments=2)
    ended.unobserved()
    calls = {c.planned["capsule_id"]: c for c in tool_calls(producer.ledger.path)}
    assert unseen.planned and nothing.planned and odd.planned and ended.planned
    first = calls[unseen.planned.capsule_id]
    assert first.status == "failed" and "request_digest" not in first.effect and "response_digest" not in first.effect
    assert first.outcome is not None
    assert first.outcome[EXTENSION]["absent"] == {"request_digest": "not_seen", "response_digest": "not_seen"}
    assert calls[nothing.planned.capsule_id].effect["response_digest"] == digest(None)
    third = calls[odd.planned.capsule_id]
    assert third.status == "dispatched" and third.outcome is not None
    assert third.outcome[EXTENSION]["absent"] == {"response_digest": "not_json"}
    assert calls[ended.planned.capsule_id].status == "dispatched"
    assert [c.reason for c in recorder.open_calls()] == ["outcome_unobserved", "outcome_unobserved"]
    assert sorted(open_items(producer.ledger.path)) == sorted([odd.action_id + "/dispatched",
                                                               ended.action_id + "/dispatched"])
    assert_reference_accepts(producer.ledger.path)


def test_bad_arguments_are_refused_by_name(producer: Producer) -> None:
    with pytest.raises(InputError, match="producer"):
        ToolCallRecorder("not a producer", framework="x")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="framework"):
        ToolCallRecorder(producer, framework="a/b")
    with pytest.raises(InputError, match="on_seal_error"):
        ToolCallRecorder(producer, framework="x", on_seal_error=3)  # type: ignore[arg-type]
    call = _recorder(producer).start(tool="t", arguments=1)
    with pytest.raises(InputError, match="outcome"):
        call.failed(outcome="exploded")


_PROBE = """
import importlib, sys
import capseal.integrations, capseal.integrations.recorder
frameworks = ("langchain", "langchain_core", "langgraph", "agents", "openai", "mcp", "pydantic_ai")
print("imported:", sorted(m for m in sys.modules if m.split(".")[0] in frameworks))
from capseal.errors import MissingExtraError
for adapter, framework in (("langchain", "langchain_core"), ("openai_agents", "agents"), ("mcp", "mcp"),
                           ("pydantic_ai", "pydantic_ai")):
    sys.modules[framework] = None  # as if it were not installed
    try:
        importlib.import_module(f"capseal.integrations.{adapter}")
    except MissingExtraError as exc:
        print(adapter, exc)
"""


def test_the_core_imports_no_framework_and_a_missing_one_names_its_extra() -> None:
    proc = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "imported: []"
    said = dict(line.split(" ", 1) for line in lines[1:])
    assert sorted(said) == ["langchain", "mcp", "openai_agents", "pydantic_ai"]
    for adapter, extra in (("langchain", "langchain"), ("openai_agents", "openai-agents"), ("mcp", "mcp"),
                           ("pydantic_ai", "pydantic-ai")):
        assert f"capseal[{extra}]" in said[adapter], said[adapter]
    assert issubclass(MissingExtraError, ImportError)
