"""Agent-framework adapters: what sealing each tool call costs, in one run.

Prints, with a software Ed25519 key and a durable ledger:
  * per adapter, the wall time of one tool call in a real agent of that
    framework on its offline test model, with capseal and without (the same
    agent, the adapter left out), and the time capseal adds to each call:
    its planned capsule, durable before the tool runs, and its outcome
    (medians of rotating rounds; the difference is taken per round);
  * sealed records/s through the recorder: synchronous calls one after the
    other on one thread, and asynchronous calls many at a time (sealed off
    the event loop through capseal.aio.AsyncProducer, sharing group commits);
  * the event loop's longest stall while 1,000 tool calls are sealed
    through the asynchronous path, beside the stall when the same seals run
    on the loop itself.

Usage: python bench/integrations.py [--calls 20] [--rounds 5] [--n 1000] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from _common import median, next_id, rotating_rounds

from capseal import Producer
from capseal.integrations import ToolCallRecorder
from capseal.keys import UnsafeEphemeralSigner

logging.getLogger("mcp").setLevel(logging.WARNING)


def _order(i: int, amount: float) -> dict[str, Any]:
    return {"order_id": f"A-{i}", "status": "shipped", "amount": amount}


# ---------------------------------------------------------------------------- one agent per adapter
# Each returns a function running an agent that makes ``calls`` tool calls one
# after the other (one per model turn), sealed by the adapter or not.


def langchain_agent(way: str) -> Callable[[Producer | None, int], None]:
    from langchain.agents import create_agent
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool

    from capseal.integrations.langchain import CapsealCallbackHandler, CapsealMiddleware

    class ScriptedChat(GenericFakeChatModel):
        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

    @tool
    def lookup_order(order_id: str, amount: float) -> dict[str, Any]:
        """Look an order up."""
        return _order(0, amount)

    def run(producer: Producer | None, calls: int) -> None:
        turns = [AIMessage(content="", tool_calls=[{"name": "lookup_order", "args": {"order_id": f"A-{i}", "amount": 1.5},
                                                    "id": f"c{i}"}]) for i in range(calls)]
        model = ScriptedChat(messages=iter([*turns, AIMessage(content="done")]))
        config: Any = {"recursion_limit": 4 * calls + 10}
        middleware: list[Any] = []
        if producer is not None and way == "handler":
            config["callbacks"] = [CapsealCallbackHandler(producer)]
        elif producer is not None:
            middleware = [CapsealMiddleware(producer)]
        create_agent(model, tools=[lookup_order], middleware=middleware).invoke({"messages": [("user", "go")]},
                                                                                config=config)

    return run


def openai_agents_agent() -> Callable[[Producer | None, int], None]:
    from agents import Agent, RunConfig, Runner, function_tool, set_tracing_disabled
    from agents.testing import ScriptedModel, assistant_message, function_call

    from capseal.integrations.openai_agents import CapsealRunHooks

    set_tracing_disabled(True)

    def lookup_order(order_id: str, amount: float) -> dict[str, Any]:
        """Look an order up."""
        return _order(0, amount)

    def run(producer: Producer | None, calls: int) -> None:
        hooks = CapsealRunHooks(producer) if producer is not None else None
        tool = hooks.function_tool(lookup_order) if hooks is not None else function_tool(lookup_order)
        model = ScriptedModel([*([function_call("lookup_order", {"order_id": f"A-{i}", "amount": 1.5}, call_id=f"c{i}")]
                                 for i in range(calls)), [assistant_message("done")]])
        agent = Agent(name="shop", model=model, tools=[tool])
        asyncio.run(Runner.run(agent, "go", hooks=hooks, max_turns=calls + 2, run_config=RunConfig()))

    return run


def pydantic_ai_agent() -> Callable[[Producer | None, int], None]:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from capseal.integrations.pydantic_ai import CapsealCapability

    def run(producer: Producer | None, calls: int) -> None:
        def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            done = sum(isinstance(m, ModelResponse) for m in messages)
            if done < calls:
                return ModelResponse(parts=[ToolCallPart("lookup_order", {"order_id": f"A-{done}", "amount": 1.5},
                                                         tool_call_id=f"c{done}")])
            return ModelResponse(parts=[TextPart("done")])

        def lookup_order(order_id: str, amount: float) -> dict[str, Any]:
            return _order(0, amount)

        capabilities = [CapsealCapability(producer)] if producer is not None else []
        Agent(FunctionModel(respond), tools=[lookup_order], capabilities=capabilities).run_sync("go")

    return run


def mcp_agent(way: str) -> Callable[[Producer | None, int], None]:
    from mcp import Client
    from mcp.server.mcpserver import MCPServer

    from capseal.integrations.mcp import CapsealMCPMiddleware, SealedTools

    def run(producer: Producer | None, calls: int) -> None:
        middleware = [CapsealMCPMiddleware(producer)] if producer is not None and way == "middleware" else None
        server = MCPServer("shop", middleware=middleware)

        def lookup_order(order_id: str, amount: float) -> dict[str, Any]:
            """Look an order up."""
            return _order(0, amount)

        server.tool()(SealedTools(producer)(lookup_order) if producer is not None and way == "decorator"
                      else lookup_order)

        async def client() -> None:
            async with Client(server) as session:
                for i in range(calls):
                    await session.call_tool("lookup_order", {"order_id": f"A-{i}", "amount": 1.5})

        asyncio.run(client())

    return run


ADAPTERS: dict[str, Callable[[], Callable[[Producer | None, int], None]]] = {
    "langchain callback handler": lambda: langchain_agent("handler"),
    "langchain wrap_tool_call middleware": lambda: langchain_agent("middleware"),
    "openai-agents RunHooks": openai_agents_agent,
    "mcp server middleware": lambda: mcp_agent("middleware"),
    "mcp tool decorator": lambda: mcp_agent("decorator"),
    "pydantic-ai capability": pydantic_ai_agent,
}


def per_call_ms(run: Callable[[Producer | None, int], None], producer: Producer | None, calls: int) -> float:
    start = time.perf_counter()
    run(producer, calls)
    return 1e3 * (time.perf_counter() - start) / calls


def adapters(tmp: str, calls: int, rounds: int) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for name, make in ADAPTERS.items():
        run = make()
        with Producer("acme", "bench-agent@1", UnsafeEphemeralSigner(), os.path.join(tmp, f"a-{next_id()}.db")) as p:
            run(p, 2)  # imports, the epoch boundary and the first commit: not measured
            run(None, 2)
            figures = rotating_rounds({"with": partial(per_call_ms, run, p, calls),
                                       "without": partial(per_call_ms, run, None, calls)}, rounds)
        gained = [w - wo for w, wo in zip(figures["with"], figures["without"])]
        out[name] = {"with_ms": median(figures["with"]), "without_ms": median(figures["without"]),
                     "gain_ms": median(gained), "gain_min_ms": min(gained), "gain_max_ms": max(gained)}
    return out


# ---------------------------------------------------------------------------- the recorder's two paths


def sync_rate(recorder: ToolCallRecorder, n: int) -> float:
    """Sealed records/s: ``n`` calls (planned + confirmed) one after the other on this thread."""
    start = time.perf_counter()
    for i in range(n):
        recorder.start(tool="lookup_order", arguments={"i": i, "amount": 1.5}).confirmed({"ok": i})
    return 2 * n / (time.perf_counter() - start)


async def _async_calls(recorder: ToolCallRecorder, n: int, in_flight: int) -> None:
    gate = asyncio.Semaphore(in_flight)

    async def one(i: int) -> None:
        async with gate:
            call = await recorder.astart(tool="lookup_order", arguments={"i": i, "amount": 1.5})
            await call.aconfirmed({"ok": i})

    await asyncio.gather(*(one(i) for i in range(n)))


def async_rate(recorder: ToolCallRecorder, n: int, in_flight: int) -> float:
    """Sealed records/s: ``n`` calls awaited ``in_flight`` at a time (the executor path)."""
    start = time.perf_counter()
    asyncio.run(_async_calls(recorder, n, in_flight))
    return 2 * n / (time.perf_counter() - start)


async def _watch(work: Any) -> float:
    """The longest the event loop went without running a 1 ms ticker while ``work`` ran (seconds)."""
    worst, done = 0.0, False

    async def ticker() -> None:
        nonlocal worst
        while not done:
            before = time.perf_counter()
            await asyncio.sleep(0.001)
            worst = max(worst, time.perf_counter() - before - 0.001)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    await work
    done = True
    await task
    return worst


async def _on_the_loop(recorder: ToolCallRecorder, n: int, in_flight: int) -> None:
    """The same calls, sealed synchronously inside coroutines (what the async path avoids)."""
    gate = asyncio.Semaphore(in_flight)

    async def one(i: int) -> None:
        async with gate:
            call = recorder.start(tool="lookup_order", arguments={"i": i, "amount": 1.5})
            await asyncio.sleep(0)
            call.confirmed({"ok": i})

    await asyncio.gather(*(one(i) for i in range(n)))


def stalls(recorder: ToolCallRecorder, n: int, in_flight: int) -> dict[str, float]:
    off = asyncio.run(_watch(_async_calls(recorder, n, in_flight)))
    on = asyncio.run(_watch(_on_the_loop(recorder, n, in_flight)))
    return {"async_path_ms": 1e3 * off, "sealing_on_the_loop_ms": 1e3 * on}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20, help="tool calls per agent run")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n", type=int, default=1000, help="tool calls sealed for the rates and the stall")
    ap.add_argument("--in-flight", type=int, default=64, help="asynchronous calls under way at once")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        per_adapter = adapters(tmp, args.calls, args.rounds)
        with Producer("acme", "bench-agent@1", UnsafeEphemeralSigner(), os.path.join(tmp, "rates.db")) as producer:
            recorder = ToolCallRecorder(producer, framework="bench")
            sync_rate(recorder, 20)
            async_rate(recorder, 20, args.in_flight)
            rates = rotating_rounds({"sync": lambda: sync_rate(recorder, args.n // 2),
                                     "async": lambda: async_rate(recorder, args.n // 2, args.in_flight)}, args.rounds)
            stall = stalls(recorder, args.n, args.in_flight)
            recorder.close()
    out = {"adapters": per_adapter, "sync_records_per_s": median(rates["sync"]),
           "async_records_per_s": median(rates["async"]),
           "async_vs_sync": median([a / s for a, s in zip(rates["async"], rates["sync"])]), "stall": stall,
           "async_path": "capseal.aio.AsyncProducer (specs made on the recorder's pool)"}
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"tool calls sealed by each adapter (planned before the tool runs, then its outcome), {args.calls} calls "
          f"a run one after the other, software Ed25519 key, durable ledger; medians of {args.rounds} rotating rounds")
    for name, row in per_adapter.items():
        print(f"  {name:<36} {row['without_ms']:7.2f} ms a call without capseal, {row['with_ms']:7.2f} ms with: "
              f"+{row['gain_ms']:.2f} ms a call (rounds {row['gain_min_ms']:+.2f} to {row['gain_max_ms']:+.2f})")
    print(f"sealed records/s through the recorder ({args.n // 2} calls, two records each; async: {args.in_flight} "
          f"in flight, {out['async_path']})")
    print(f"  sync, one thread, call after call            {out['sync_records_per_s']:8.0f} /s")
    print(f"  async, off the event loop                    {out['async_records_per_s']:8.0f} /s  "
          f"({out['async_vs_sync']:.2f}x sync, per round)")
    print(f"event loop's longest stall while {args.n} tool calls are sealed ({args.in_flight} in flight)")
    print(f"  async path (seals off the loop)              {stall['async_path_ms']:8.1f} ms")
    print(f"  the same seals run on the loop, for contrast {stall['sealing_on_the_loop_ms']:8.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
