"""capseal[openai-agents]: a real ``Runner`` run on the SDK's own
``ScriptedModel`` (tracing off), its tool calls sealed by ``RunHooks`` and
failures seen through the tools' failure function."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, Runner, default_tool_error_function, function_tool, set_tracing_disabled
from agents.testing import ScriptedModel, assistant_message, function_call

from capseal import Producer
from capseal.errors import ToolCallBlockedError
from capseal.integrations import SealFailure
from capseal.integrations.openai_agents import CapsealRunHooks
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

set_tracing_disabled(True)

FAILURE_MESSAGE = default_tool_error_function(None, Exception())  # type: ignore[arg-type]


def _raw() -> dict[str, str]:
    return {"order": secret("order"), "out": secret("out"), "err": secret("err")}


def _agent(hooks: CapsealRunHooks, raw: dict[str, str], ran: list[str], *, one_per_turn: bool = False,
           inside: Callable[[], None] | None = None) -> Agent[Any]:
    @hooks.function_tool
    def lookup_order(order_id: str, amount: float) -> dict[str, Any]:
        """Look an order up."""
        ran.append("lookup_order")
        if inside is not None:
            inside()
        return {"status": raw["out"], "amount": amount}

    @hooks.function_tool
    async def cancel_order(order_id: str) -> str:
        """Cancel an order."""
        ran.append("cancel_order")
        raise ValueError(raw["err"])

    lookup = function_call("lookup_order", {"order_id": raw["order"], "amount": 12.375}, call_id="c-lookup")
    cancel = function_call("cancel_order", {"order_id": raw["order"]}, call_id="c-cancel")
    turns = [[lookup], [cancel]] if one_per_turn else [[lookup, cancel]]
    model = ScriptedModel([*turns, [assistant_message("done")]])
    return Agent(name="clerk", model=model, tools=[lookup_order, cancel_order])


def _run(agent: Agent[Any], hooks: CapsealRunHooks) -> Any:
    return asyncio.run(Runner.run(agent, "cancel my order", hooks=hooks))


def test_an_agent_calling_two_tools_one_failing(tmp_path: Path) -> None:
    raw, ran = _raw(), list[str]()
    path = tmp_path / "oa.db"
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), path) as producer:
        hooks = CapsealRunHooks(producer)
        result = _run(_agent(hooks, raw, ran), hooks)
        assert result.final_output == "done" and hooks.recorder.open_calls() == []
    assert sorted(ran) == ["cancel_order", "lookup_order"]
    calls = by_call_id(tool_calls(path))
    lookup, cancel = calls["c-lookup"], calls["c-cancel"]
    assert lookup.tool == "lookup_order" and lookup.status == "confirmed" and lookup.kind == "returned"
    assert lookup.effect["request_digest"] == digest({"order_id": raw["order"], "amount": 12.375})
    assert lookup.effect["response_digest"] == digest({"status": raw["out"], "amount": 12.375})
    assert cancel.tool == "cancel_order" and cancel.status == "failed" and cancel.kind == "raised"
    assert cancel.effect["request_digest"] == digest({"order_id": raw["order"]})
    assert cancel.effect["response_digest"] == digest(FAILURE_MESSAGE)  # what the model was told
    assert_reference_accepts(path)
    assert open_items(path) == []
    assert_nothing_raw(path, *raw.values(), "12.375")


def test_a_tool_the_hooks_did_not_make_is_never_sealed_confirmed(tmp_path: Path) -> None:
    """A plain ``function_tool`` turns its errors into a message the hooks see
    as a normal end: its outcome is sealed dispatched (not recorded), never
    confirmed, and reported open."""
    path = tmp_path / "plain.db"

    @function_tool
    def fails_quietly(x: str) -> str:
        """Fail."""
        raise ValueError(x)

    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), path) as producer:
        hooks = CapsealRunHooks(producer)
        model = ScriptedModel([[function_call("fails_quietly", {"x": "y"}, call_id="c1")], [assistant_message("ok")]])
        _run(Agent(name="a", model=model, tools=[fails_quietly]), hooks)
        assert [c.reason for c in hooks.recorder.open_calls()] == ["outcome_unobserved"]
    (call,) = tool_calls(path)
    assert call.status == "dispatched" and call.kind == "unobserved"
    assert len(open_items(path)) == 1


def test_a_tool_whose_error_stops_the_run_is_sealed_failed(tmp_path: Path) -> None:
    """``failure_error_function=None``: the error ends the run, and no
    ``on_tool_end`` comes; the failure function seals the failure first."""
    path = tmp_path / "raise.db"
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), path) as producer:
        hooks = CapsealRunHooks(producer)

        @hooks.function_tool(failure_error_function=None)
        def explode(x: str) -> str:
            """Explode."""
            raise KeyError(x)

        model = ScriptedModel([[function_call("explode", {"x": "y"}, call_id="c1")], [assistant_message("ok")]])
        with pytest.raises(Exception) as raised:
            _run(Agent(name="a", model=model, tools=[explode]), hooks)
        assert "KeyError" in repr(raised.value) or isinstance(raised.value.__cause__, KeyError)
        assert hooks.recorder.open_calls() == []
    (call,) = tool_calls(path)
    assert call.status == "failed" and call.kind == "raised" and "response_digest" not in call.effect


def test_eight_concurrent_tool_calls_are_paired_by_id(tmp_path: Path) -> None:
    n, running, peak = 8, [0], [0]
    tags = [secret(f"tag{i}") for i in range(n)]
    path = tmp_path / "oa8.db"
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), path) as producer:
        hooks = CapsealRunHooks(producer)
        everyone: list[asyncio.Event] = []

        @hooks.function_tool
        async def echo(k: int, tag: str) -> dict[str, Any]:
            """Echo."""
            if not everyone:
                everyone.append(asyncio.Event())
            running[0] += 1
            peak[0] = max(peak[0], running[0])
            if running[0] == n:
                everyone[0].set()
            await asyncio.wait_for(everyone[0].wait(), 20)
            await asyncio.sleep((n - k) * 0.01)
            running[0] -= 1
            return {"k": k, "echo": tag[::-1]}

        model = ScriptedModel([[function_call("echo", {"k": k, "tag": tags[k]}, call_id=f"c{k}") for k in range(n)],
                               [assistant_message("done")]])
        _run(Agent(name="a", model=model, tools=[echo]), hooks)
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
    hooks = CapsealRunHooks(token_producer, on_seal_error=seen.append)
    agent = _agent(hooks, raw, ran)
    with fault_in(fault, token_producer, token, tmp_path):
        result = _run(agent, hooks)
    assert result.final_output == "done" and sorted(ran) == ["cancel_order", "lookup_order"]
    assert_planned_failures_did_not_block(seen, fault, token_producer, before)


@pytest.mark.parametrize("fault", ["ledger", "token"])
def test_fail_closed_a_seal_failure_stops_the_tool_before_it_runs(fault: str, token_producer: Producer,
                                                                  token: Token, tmp_path: Path) -> None:
    raw, ran, seen = _raw(), list[str](), list[SealFailure]()
    before = token_producer.ledger.count()
    hooks = CapsealRunHooks(token_producer, on_seal_error=seen.append, fail_closed=True)
    agent = _agent(hooks, raw, ran)
    with fault_in(fault, token_producer, token, tmp_path), pytest.raises(Exception) as stopped:
        _run(agent, hooks)
    assert caused_by(stopped.value, ToolCallBlockedError)  # the SDK raises its UserError from it
    assert_blocked_before_running(ran, seen, token_producer, before)


def test_an_outcome_lost_mid_run_leaves_an_open_item(token_producer: Producer) -> None:
    raw, ran, seen = _raw(), list[str](), list[SealFailure]()
    path = token_producer.ledger.path
    lock = ledger_locked(path)
    hooks = CapsealRunHooks(token_producer, on_seal_error=seen.append)
    agent = _agent(hooks, raw, ran, one_per_turn=True, inside=lock.__enter__)
    try:
        _run(agent, hooks)
    finally:
        lock.__exit__(None, None, None)
    assert_outcome_lost(path, ran, seen, hooks.recorder)
