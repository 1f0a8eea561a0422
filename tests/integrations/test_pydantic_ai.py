"""capseal[pydantic-ai]: real ``Agent`` runs on pydantic-ai's own
``FunctionModel`` and ``TestModel``, their tool calls sealed by the capability."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic_ai import Agent, ModelRetry
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

from capseal import Producer
from capseal.errors import ToolCallBlockedError
from capseal.integrations import SealFailure
from capseal.integrations.pydantic_ai import CapsealCapability
from capseal.keys import UnsafeEphemeralSigner

from .support import (
    Token,
    assert_blocked_before_running,
    assert_nothing_raw,
    assert_outcome_lost,
    assert_planned_failures_did_not_block,
    assert_reference_accepts,
    by_call_id,
    caused_by,
    digest,
    ledger_locked,
    open_items,
    secret,
    tool_calls,
)
from .support import (
    fault as fault_in,
)


def _raw() -> dict[str, str]:
    return {"order": secret("order"), "out": secret("out"), "err": secret("err")}


def _scripted(*turns: list[ToolCallPart]) -> FunctionModel:
    """A model answering turn by turn (then with text), by the number of responses so far."""
    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        done = sum(isinstance(m, ModelResponse) for m in messages)
        return ModelResponse(parts=list(turns[done]) if done < len(turns) else [TextPart("done")])

    return FunctionModel(respond)


def _agent(capability: CapsealCapability, raw: dict[str, str], ran: list[str], *, fails_with: type[Exception],
           one_per_turn: bool = False, inside: Callable[[], None] | None = None) -> Agent[None, str]:
    lookup = ToolCallPart("lookup_order", {"order_id": raw["order"], "amount": 12.375}, tool_call_id="c-lookup")
    cancel = ToolCallPart("cancel_order", {"order_id": raw["order"]}, tool_call_id="c-cancel")
    model = _scripted([lookup], [cancel]) if one_per_turn else _scripted([lookup, cancel])
    agent: Agent[None, str] = Agent(model, capabilities=[capability])

    @agent.tool_plain
    def lookup_order(order_id: str, amount: float) -> dict[str, Any]:
        ran.append("lookup_order")
        if inside is not None:
            inside()
        return {"status": raw["out"], "amount": amount}

    @agent.tool_plain(retries=0 if fails_with is not ModelRetry else 1)
    async def cancel_order(order_id: str) -> str:
        ran.append("cancel_order")
        raise fails_with(raw["err"])

    return agent


def test_an_agent_calling_two_tools_one_asking_to_retry(tmp_path: Path) -> None:
    raw, ran = _raw(), list[str]()
    path = tmp_path / "pa.db"
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), path) as producer:
        capability = CapsealCapability(producer)
        assert _agent(capability, raw, ran, fails_with=ModelRetry).run_sync("cancel my order").output == "done"
        assert capability.recorder.open_calls() == []
    assert sorted(ran) == ["cancel_order", "lookup_order"]
    calls = by_call_id(tool_calls(path))
    lookup, cancel = calls["c-lookup"], calls["c-cancel"]
    assert lookup.tool == "lookup_order" and lookup.status == "confirmed"
    assert lookup.effect["request_digest"] == digest({"order_id": raw["order"], "amount": 12.375})
    assert lookup.effect["response_digest"] == digest({"status": raw["out"], "amount": 12.375})
    assert cancel.tool == "cancel_order" and cancel.status == "failed" and cancel.kind == "retry"
    assert cancel.effect["request_digest"] == digest({"order_id": raw["order"]})
    assert lookup.ids["run_id"] == cancel.ids["run_id"] and lookup.ids["run_step"] == 1
    assert_reference_accepts(path)
    assert open_items(path) == []
    assert_nothing_raw(path, *raw.values(), "12.375")


def test_a_tool_that_raises_is_sealed_failed_and_the_run_raises(tmp_path: Path) -> None:
    raw, ran = _raw(), list[str]()
    path = tmp_path / "raise.db"
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), path) as producer:
        capability = CapsealCapability(producer)
        with pytest.raises(ValueError):
            _agent(capability, raw, ran, fails_with=ValueError, one_per_turn=True).run_sync("cancel")
        assert capability.recorder.open_calls() == []
    calls = by_call_id(tool_calls(path))
    assert calls["c-lookup"].status == "confirmed"
    assert calls["c-cancel"].status == "failed" and calls["c-cancel"].kind == "raised"
    assert "response_digest" not in calls["c-cancel"].effect
    assert_reference_accepts(path)
    assert_nothing_raw(path, *raw.values())


def test_test_model_call_ids_repeat_across_steps_and_runs(tmp_path: Path) -> None:
    """``TestModel`` names a tool's first call ``pyd_ai_tool_call_id__<tool>``
    in every run: the run id (and the step, for a retry) keep them apart."""
    path = tmp_path / "tm.db"
    tries: list[int] = []
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), path) as producer:
        capability = CapsealCapability(producer)
        agent: Agent[None, str] = Agent(TestModel(), capabilities=[capability])

        @agent.tool_plain(retries=2)
        def flaky(n: int) -> str:
            tries.append(n)
            if len(tries) % 2:
                raise ModelRetry("again")
            return f"ok {n}"

        agent.run_sync("one")
        agent.run_sync("two")
        assert capability.recorder.open_calls() == []
    calls = tool_calls(path)
    assert len(calls) == 4
    first = [c for c in calls if c.ids["run_step"] == 1]
    assert [c.ids["tool_call_id"] for c in first] == ["pyd_ai_tool_call_id__flaky"] * 2
    assert [(c.status, c.kind) for c in first] == [("failed", "retry")] * 2
    assert [c.status for c in calls if c.ids["run_step"] == 2] == ["confirmed"] * 2
    assert len({c.ids["run_id"] for c in calls}) == 2
    assert_reference_accepts(path)


def test_eight_concurrent_tool_calls_are_paired_by_id(tmp_path: Path) -> None:
    n, running, peak = 8, [0], [0]
    tags = [secret(f"tag{i}") for i in range(n)]
    path = tmp_path / "pa8.db"
    everyone = anyio.Event()
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), path) as producer:
        model = _scripted([ToolCallPart("echo", {"k": k, "tag": tags[k]}, tool_call_id=f"c{k}") for k in range(n)])
        agent: Agent[None, str] = Agent(model, capabilities=[CapsealCapability(producer)])

        @agent.tool_plain
        async def echo(k: int, tag: str) -> dict[str, Any]:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
            if running[0] == n:
                everyone.set()
            with anyio.fail_after(20):
                await everyone.wait()
            await anyio.sleep((n - k) * 0.01)
            running[0] -= 1
            return {"k": k, "echo": tag[::-1]}

        agent.run_sync("echo")
    assert peak[0] == n
    calls = by_call_id(tool_calls(path))
    assert len(calls) == n
    for k in range(n):
        assert calls[f"c{k}"].status == "confirmed"
        assert calls[f"c{k}"].effect["request_digest"] == digest({"k": k, "tag": tags[k]})
        assert calls[f"c{k}"].effect["response_digest"] == digest({"k": k, "echo": tags[k][::-1]})
    assert_reference_accepts(path)
    assert_nothing_raw(path, *tags)


@pytest.mark.parametrize("fault", ["ledger", "token"])
def test_a_seal_failure_never_stops_the_agent_by_default(fault: str, token_producer: Producer, token: Token,
                                                         tmp_path: Path) -> None:
    raw, ran, seen = _raw(), list[str](), list[SealFailure]()
    before = token_producer.ledger.count()
    agent = _agent(CapsealCapability(token_producer, on_seal_error=seen.append), raw, ran, fails_with=ModelRetry)
    with fault_in(fault, token_producer, token, tmp_path):
        assert agent.run_sync("cancel my order").output == "done"
    assert sorted(ran) == ["cancel_order", "lookup_order"]
    assert_planned_failures_did_not_block(seen, fault, token_producer, before)


@pytest.mark.parametrize("fault", ["ledger", "token"])
def test_fail_closed_a_seal_failure_stops_the_tool_before_it_runs(fault: str, token_producer: Producer,
                                                                  token: Token, tmp_path: Path) -> None:
    raw, ran, seen = _raw(), list[str](), list[SealFailure]()
    before = token_producer.ledger.count()
    capability = CapsealCapability(token_producer, on_seal_error=seen.append, fail_closed=True)
    agent = _agent(capability, raw, ran, fails_with=ModelRetry)
    with fault_in(fault, token_producer, token, tmp_path), pytest.raises(Exception) as stopped:
        agent.run_sync("cancel my order")
    assert caused_by(stopped.value, ToolCallBlockedError)
    assert_blocked_before_running(ran, seen, token_producer, before)


def test_an_outcome_lost_mid_run_leaves_an_open_item(token_producer: Producer) -> None:
    raw, ran, seen = _raw(), list[str](), list[SealFailure]()
    path = token_producer.ledger.path
    lock = ledger_locked(path)
    capability = CapsealCapability(token_producer, on_seal_error=seen.append)
    agent = _agent(capability, raw, ran, fails_with=ModelRetry, one_per_turn=True, inside=lock.__enter__)
    try:
        agent.run_sync("cancel my order")
    finally:
        lock.__exit__(None, None, None)
    assert_outcome_lost(path, ran, seen, capability.recorder)
