"""capseal[langchain]: a real ``create_agent`` agent on LangChain's own fake
chat model (with ``bind_tools``), its tool calls sealed by the callback
handler or the ``wrap_tool_call`` middleware."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import ToolErrorMiddleware
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import BaseTool, ToolException, tool

from capseal import Producer
from capseal.errors import ToolCallBlockedError, ToolCallPairingError
from capseal.integrations import SealFailure
from capseal.integrations.langchain import CapsealCallbackHandler, CapsealMiddleware
from capseal.keys import UnsafeEphemeralSigner

from .support import (
    Token,
    assert_blocked_before_running,
    assert_nothing_raw,
    assert_outcome_lost,
    assert_planned_failures_did_not_block,
    assert_reference_accepts,
    by_call_id,
    digest,
    ledger_locked,
    open_items,
    secret,
    tool_calls,
)
from .support import (
    fault as fault_in,
)


class ScriptedChat(GenericFakeChatModel):
    """LangChain's fake chat model, answering with the messages given, with tools bound."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


def _calls(*calls: tuple[str, dict[str, Any], str]) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": n, "args": a, "id": i, "type": "tool_call"} for n, a, i in calls])


def _tools(raw: dict[str, str], ran: list[str], *, handled: bool,
           inside: Callable[[], None] | None = None) -> list[BaseTool]:
    @tool
    def lookup_order(order_id: str, amount: float) -> dict[str, Any]:
        """Look an order up."""
        ran.append("lookup_order")
        if inside is not None:
            inside()
        return {"status": raw["out"], "amount": amount}

    @tool
    def cancel_order(order_id: str) -> str:
        """Cancel an order."""
        ran.append("cancel_order")
        raise (ToolException if handled else ValueError)(raw["err"])

    cancel_order.handle_tool_error = handled
    return [lookup_order, cancel_order]


def _raw() -> dict[str, str]:
    return {"order": secret("order"), "out": secret("out"), "err": secret("err")}


def _script(raw: dict[str, str], *, one_per_turn: bool = False) -> ScriptedChat:
    lookup = ("lookup_order", {"order_id": raw["order"], "amount": 12.375}, "c-lookup")
    cancel = ("cancel_order", {"order_id": raw["order"]}, "c-cancel")
    turns = [_calls(lookup), _calls(cancel)] if one_per_turn else [_calls(lookup, cancel)]
    return ScriptedChat(messages=iter([*turns, AIMessage(content="done")]))


def _agent(way: str, model: ScriptedChat, tools: list[BaseTool], producer: Producer, *, handled: bool,
           **options: Any) -> tuple[Any, dict[str, Any], Any]:
    """The agent, its run config, and the capseal hook in it."""
    errors = [] if handled else [ToolErrorMiddleware(on_error=lambda exc, request: "the tool failed")]
    if way == "handler":
        hook: Any = CapsealCallbackHandler(producer, **options)
        return create_agent(model, tools=tools, middleware=errors), {"callbacks": [hook]}, hook
    hook = CapsealMiddleware(producer, **options)
    return create_agent(model, tools=tools, middleware=[hook, *errors]), {}, hook


def _run(agent: Any, config: dict[str, Any], mode: str) -> dict[str, Any]:
    state = {"messages": [("user", "cancel my order")]}
    if mode == "async":
        return asyncio.run(agent.ainvoke(state, config=config))
    return agent.invoke(state, config=config)  # type: ignore[no-any-return]


def _tool_messages(result: dict[str, Any]) -> dict[str, ToolMessage]:
    return {m.tool_call_id: m for m in result["messages"] if isinstance(m, ToolMessage)}


@pytest.mark.parametrize(("way", "mode", "handled"), [
    ("handler", "sync", True), ("handler", "async", False), ("middleware", "sync", False), ("middleware", "async", True)])
def test_an_agent_calling_two_tools_one_failing(way: str, mode: str, handled: bool, tmp_path: Path) -> None:
    raw, ran = _raw(), list[str]()
    path = tmp_path / "lc.db"
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), path) as producer:
        agent, config, hook = _agent(way, _script(raw), _tools(raw, ran, handled=handled), producer, handled=handled)
        result = _run(agent, config, mode)
        assert hook.recorder.open_calls() == []
    assert sorted(ran) == ["cancel_order", "lookup_order"]
    messages = _tool_messages(result)
    assert messages["c-cancel"].status == "error"
    calls = by_call_id(tool_calls(path))
    assert set(calls) == {"c-lookup", "c-cancel"}
    lookup, cancel = calls["c-lookup"], calls["c-cancel"]
    assert lookup.tool == "lookup_order" and lookup.status == "confirmed"
    assert lookup.effect["request_digest"] == digest({"order_id": raw["order"], "amount": 12.375})
    assert lookup.effect["response_digest"] == digest(messages["c-lookup"].content)
    assert cancel.tool == "cancel_order" and cancel.status == "failed"
    assert cancel.effect["request_digest"] == digest({"order_id": raw["order"]})
    if way == "handler" and not handled:  # on_tool_error: the tool raised, nothing handed back yet
        assert cancel.kind == "raised" and "response_digest" not in cancel.effect
    else:  # the error ToolMessage the model got
        assert cancel.kind == "error_result" and cancel.effect["response_digest"] == digest(messages["c-cancel"].content)
    if way == "handler":
        assert all(uuid.UUID(c.ids["run_id"]) for c in calls.values())
    assert_reference_accepts(path)
    assert open_items(path) == []
    assert_nothing_raw(path, *raw.values(), "12.375")


@pytest.mark.parametrize("way", ["handler", "middleware"])
def test_eight_concurrent_tool_calls_are_paired_by_id(way: str, tmp_path: Path) -> None:
    """Eight calls of one tool run at once (each waits until all eight run)
    and finish in reverse order: each outcome has its own call's digests."""
    n, running, peak = 8, [0], [0]
    tags = [secret(f"tag{i}") for i in range(n)]
    everyone: asyncio.Event | None = None

    @tool
    async def echo(k: int, tag: str) -> dict[str, Any]:
        """Echo."""
        nonlocal everyone
        everyone = everyone or asyncio.Event()
        running[0] += 1
        peak[0] = max(peak[0], running[0])
        if running[0] == n:
            everyone.set()
        await asyncio.wait_for(everyone.wait(), 20)
        await asyncio.sleep((n - k) * 0.01)
        running[0] -= 1
        return {"k": k, "echo": tag[::-1]}

    model = ScriptedChat(messages=iter([_calls(*(("echo", {"k": k, "tag": tags[k]}, f"c{k}") for k in range(n))),
                                        AIMessage(content="done")]))
    path = tmp_path / "lc8.db"
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), path) as producer:
        agent, config, _ = _agent(way, model, [echo], producer, handled=True)
        result = _run(agent, config, "async")
    assert peak[0] == n
    messages = _tool_messages(result)
    calls = by_call_id(tool_calls(path))
    assert len(calls) == n
    for k in range(n):
        call = calls[f"c{k}"]
        assert call.status == "confirmed"
        assert call.effect["request_digest"] == digest({"k": k, "tag": tags[k]})
        assert call.effect["response_digest"] == digest(messages[f"c{k}"].content)
    assert_reference_accepts(path)
    assert_nothing_raw(path, *tags)


@pytest.mark.parametrize("fault", ["ledger", "token"])
@pytest.mark.parametrize("way", ["handler", "middleware"])
def test_a_seal_failure_never_stops_the_agent_by_default(way: str, fault: str, token_producer: Producer,
                                                         token: Token, tmp_path: Path) -> None:
    raw, ran, seen = _raw(), list[str](), list[SealFailure]()
    before = token_producer.ledger.count()
    agent, config, _ = _agent(way, _script(raw), _tools(raw, ran, handled=True), token_producer, handled=True,
                              on_seal_error=seen.append)
    with fault_in(fault, token_producer, token, tmp_path):
        result = _run(agent, config, "sync")
    assert sorted(ran) == ["cancel_order", "lookup_order"] and result["messages"][-1].content == "done"
    assert_planned_failures_did_not_block(seen, fault, token_producer, before)
    token_producer.seal({"action_id": f"after-{fault}", "action_type": "fyi"})  # the fault is gone: sealing goes on


@pytest.mark.parametrize("fault", ["ledger", "token"])
@pytest.mark.parametrize("way", ["handler", "middleware"])
def test_fail_closed_a_seal_failure_stops_the_tool_before_it_runs(way: str, fault: str, token_producer: Producer,
                                                                  token: Token, tmp_path: Path) -> None:
    raw, ran, seen = _raw(), list[str](), list[SealFailure]()
    before = token_producer.ledger.count()
    agent, config, _ = _agent(way, _script(raw), _tools(raw, ran, handled=True), token_producer, handled=True,
                              on_seal_error=seen.append, fail_closed=True)
    with fault_in(fault, token_producer, token, tmp_path), pytest.raises(ToolCallBlockedError):
        _run(agent, config, "sync")
    assert_blocked_before_running(ran, seen, token_producer, before)


@pytest.mark.parametrize("way", ["handler", "middleware"])
def test_an_outcome_lost_mid_run_leaves_an_open_item(way: str, token_producer: Producer) -> None:
    """The ledger is locked while lookup_order runs (its planned capsule is
    in): its outcome cannot be sealed, and nor can cancel_order's planned
    capsule. The ledger holds lookup_order's planned capsule alone, which
    ``capseal verify`` reports as an open item; nothing misstates a call."""
    raw, ran, seen = _raw(), list[str](), list[SealFailure]()
    path = token_producer.ledger.path
    lock = ledger_locked(path)
    tools = _tools(raw, ran, handled=True, inside=lock.__enter__)
    agent, config, hook = _agent(way, _script(raw, one_per_turn=True), tools, token_producer, handled=True,
                                 on_seal_error=seen.append)
    try:
        _run(agent, config, "sync")
    finally:
        lock.__exit__(None, None, None)
    assert_outcome_lost(path, ran, seen, hook.recorder)


def test_an_end_naming_another_tool_call_id_is_not_paired(tmp_path: Path) -> None:
    seen: list[SealFailure] = []
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), tmp_path / "ids.db") as producer:
        handler = CapsealCallbackHandler(producer, on_seal_error=seen.append)
        run_id = uuid.uuid4()
        handler.on_tool_start({"name": "t"}, "{}", run_id=run_id, inputs={}, tool_call_id="a")
        handler.on_tool_end(ToolMessage(content="x", tool_call_id="b"), run_id=run_id)
        assert [(c.tool, c.reason) for c in handler.recorder.open_calls()] == [("t", "unpaired")]
    assert isinstance(seen[0].error, ToolCallPairingError)


def test_an_interrupted_or_cancelled_tool_stays_open(tmp_path: Path) -> None:
    """An interrupt (the tool paused for input) or a cancellation is no
    failure the hook saw: nothing is sealed for its end, the call stays open."""
    from langgraph.errors import GraphInterrupt

    path = tmp_path / "paused.db"
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), path) as producer:
        handler = CapsealCallbackHandler(producer)
        for i, error in enumerate([GraphInterrupt(()), asyncio.CancelledError()]):
            run_id = uuid.uuid4()
            handler.on_tool_start({"name": "t"}, "{}", run_id=run_id, inputs={"i": i}, tool_call_id=f"c{i}")
            handler.on_tool_error(error, run_id=run_id, tool_call_id=f"c{i}")
        assert [c.reason for c in handler.recorder.open_calls()] == ["awaiting_outcome"] * 2
    assert [c.status for c in tool_calls(path)] == [None, None]
    assert len(open_items(path)) == 2
