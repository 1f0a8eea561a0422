"""capseal[mcp]: a real ``MCPServer`` and the SDK's in-process ``Client``,
its ``tools/call`` requests sealed by the server middleware or the tool decorator."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, MCPError
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import INTERNAL_ERROR

from capseal import Producer
from capseal.errors import LedgerBusyError, SignerError
from capseal.integrations import SealFailure
from capseal.integrations.mcp import CapsealMCPMiddleware, SealedTools
from capseal.keys import UnsafeEphemeralSigner

from .support import (
    Token,
    assert_blocked_before_running,
    assert_nothing_raw,
    assert_outcome_lost,
    assert_planned_failures_did_not_block,
    assert_reference_accepts,
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


def _server(way: str, producer: Producer, raw: dict[str, str], ran: list[str], *,
            inside: Callable[[], None] | None = None, **options: Any) -> tuple[MCPServer, Any]:
    """A shop server with two tools (cancel_order fails) and the capseal hook sealing its calls."""
    hook: Any = CapsealMCPMiddleware(producer, **options) if way == "middleware" else SealedTools(producer, **options)
    server = MCPServer("shop", middleware=[hook] if way == "middleware" else None)
    sealed: Callable[[Any], Any] = hook if way == "decorator" else (lambda fn: fn)

    @server.tool()
    @sealed
    def lookup_order(order_id: str, amount: float) -> dict[str, Any]:
        """Look an order up."""
        ran.append("lookup_order")
        if inside is not None:
            inside()
        return {"status": raw["out"], "amount": amount}

    @server.tool()
    @sealed
    async def cancel_order(order_id: str, ctx: Context) -> str:
        """Cancel an order."""
        ran.append("cancel_order")
        raise ToolError(raw["err"])

    return server, hook


async def _two_calls(server: MCPServer, raw: dict[str, str]) -> tuple[Any, Any]:
    async with Client(server) as client:
        lookup = await client.call_tool("lookup_order", {"order_id": raw["order"], "amount": 12.375})
        cancel = await client.call_tool("cancel_order", {"order_id": raw["order"]})
    return lookup, cancel


def _wire(result: Any) -> dict[str, Any]:
    """A tools/call result as the server sent it, without its ``_meta``."""
    body = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    return {k: v for k, v in body.items() if k != "_meta"}


@pytest.mark.parametrize("way", ["middleware", "decorator"])
def test_a_client_calling_two_tools_one_failing(way: str, tmp_path: Path) -> None:
    raw, ran = _raw(), list[str]()
    path = tmp_path / "mcp.db"
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), path) as producer:
        server, hook = _server(way, producer, raw, ran)
        lookup_result, cancel_result = asyncio.run(_two_calls(server, raw))
        assert hook.recorder.open_calls() == []
    assert not lookup_result.is_error and cancel_result.is_error
    assert ran == ["lookup_order", "cancel_order"]
    calls = {c.tool: c for c in tool_calls(path)}
    lookup, cancel = calls["lookup_order"], calls["cancel_order"]
    assert lookup.status == "confirmed"
    assert lookup.effect["request_digest"] == digest({"order_id": raw["order"], "amount": 12.375})
    assert cancel.status == "failed"
    assert cancel.effect["request_digest"] == digest({"order_id": raw["order"]})  # the Context never enters
    if way == "middleware":
        assert lookup.effect["response_digest"] == digest(_wire(lookup_result))
        assert cancel.kind == "error_result" and cancel.effect["response_digest"] == digest(_wire(cancel_result))
        assert isinstance(lookup.ids["request_id"], int) and lookup.ids["request_id"] != cancel.ids["request_id"]
    else:
        assert lookup.effect["response_digest"] == digest({"status": raw["out"], "amount": 12.375})
        assert cancel.kind == "raised" and "response_digest" not in cancel.effect
        assert lookup.ids == {} and cancel.ids["request_id"]  # seen only through the tool's Context
    assert_reference_accepts(path)
    assert open_items(path) == []
    assert_nothing_raw(path, *raw.values(), "12.375")


def test_the_decorator_keeps_the_tool_schema(tmp_path: Path) -> None:
    raw: dict[str, str] = _raw()
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), tmp_path / "s.db") as producer:
        plain, _ = _server("middleware", producer, raw, [])
        decorated, _ = _server("decorator", producer, raw, [])

        async def listed(server: MCPServer) -> list[Any]:
            async with Client(server) as client:
                return [t.model_dump() for t in (await client.list_tools()).tools]

        assert asyncio.run(listed(decorated)) == asyncio.run(listed(plain))


@pytest.mark.parametrize("way", ["middleware", "decorator"])
def test_eight_concurrent_tool_calls_are_paired_by_id(way: str, tmp_path: Path) -> None:
    n, running, peak = 8, [0], [0]
    tags = [secret(f"tag{i}") for i in range(n)]
    path = tmp_path / "mcp8.db"
    everyone: list[asyncio.Event] = []
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), path) as producer:
        hook: Any = CapsealMCPMiddleware(producer) if way == "middleware" else SealedTools(producer)
        server = MCPServer("echo", middleware=[hook] if way == "middleware" else None)

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

        server.tool()(hook(echo) if way == "decorator" else echo)

        async def calls() -> list[Any]:
            async with Client(server) as client:
                return list(await asyncio.gather(*(client.call_tool("echo", {"k": k, "tag": tags[k]})
                                                   for k in range(n))))

        results = asyncio.run(calls())
    assert peak[0] == n
    by_k = {}
    for call in tool_calls(path):
        assert call.status == "confirmed"
        k = next(k for k in range(n) if call.effect["request_digest"] == digest({"k": k, "tag": tags[k]}))
        by_k[k] = call
    assert sorted(by_k) == list(range(n))
    for k in range(n):
        expected = _wire(results[k]) if way == "middleware" else {"k": k, "echo": tags[k][::-1]}
        assert by_k[k].effect["response_digest"] == digest(expected)
    assert_reference_accepts(path)
    assert_nothing_raw(path, *tags)


@pytest.mark.parametrize("fault", ["ledger", "token"])
@pytest.mark.parametrize("way", ["middleware", "decorator"])
def test_a_seal_failure_never_stops_the_calls_by_default(way: str, fault: str, token_producer: Producer, token: Token,
                                                         tmp_path: Path) -> None:
    raw, ran, seen = _raw(), list[str](), list[SealFailure]()
    before = token_producer.ledger.count()
    server, _ = _server(way, token_producer, raw, ran, on_seal_error=seen.append)
    with fault_in(fault, token_producer, token, tmp_path):
        lookup_result, cancel_result = asyncio.run(_two_calls(server, raw))
    assert ran == ["lookup_order", "cancel_order"] and not lookup_result.is_error
    assert_planned_failures_did_not_block(seen, fault, token_producer, before)


@pytest.mark.parametrize("fault", ["ledger", "token"])
@pytest.mark.parametrize("way", ["middleware", "decorator"])
def test_fail_closed_a_seal_failure_stops_the_tool_before_it_runs(way: str, fault: str, token_producer: Producer,
                                                                  token: Token, tmp_path: Path) -> None:
    """The middleware answers the request with an error, the decorated tool
    raises ToolCallBlockedError (an error result): neither tool runs."""
    raw, ran, seen = _raw(), list[str](), list[SealFailure]()
    before = token_producer.ledger.count()
    server, _ = _server(way, token_producer, raw, ran, on_seal_error=seen.append, fail_closed=True)

    async def call() -> Any:
        async with Client(server) as client:
            try:
                return await client.call_tool("lookup_order", {"order_id": raw["order"], "amount": 12.375})
            except MCPError as refused:  # inside the session: leaving it with an error would wrap it
                return refused

    with fault_in(fault, token_producer, token, tmp_path):
        answer = asyncio.run(call())
    if way == "middleware":
        assert isinstance(answer, MCPError) and answer.code == INTERNAL_ERROR
        assert answer.error.message == "the tool call was not run: it could not be recorded"
    else:
        assert answer.is_error and "Error executing tool lookup_order" in answer.content[0].text
    assert all(isinstance(f.error, LedgerBusyError if fault == "ledger" else SignerError) for f in seen)
    assert_blocked_before_running(ran, seen, token_producer, before)


@pytest.mark.parametrize("way", ["middleware", "decorator"])
def test_an_outcome_lost_mid_run_leaves_an_open_item(way: str, token_producer: Producer) -> None:
    raw, ran, seen = _raw(), list[str](), list[SealFailure]()
    path = token_producer.ledger.path
    lock = ledger_locked(path)
    server, hook = _server(way, token_producer, raw, ran, on_seal_error=seen.append, inside=lock.__enter__)
    try:
        asyncio.run(_two_calls(server, raw))
    finally:
        lock.__exit__(None, None, None)
    assert_outcome_lost(path, ran, seen, hook.recorder)
