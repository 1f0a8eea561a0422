"""An OpenAI Agents SDK agent whose tool calls are sealed as capsules, offline.

    python examples/agent_openai_agents.py               # a throwaway key, a temporary ledger
    python examples/agent_openai_agents.py --key URI     # a key of your own: file:…, pkcs11:…, tpm2:…

The agent runs on the SDK's own ``ScriptedModel`` (tracing off: nothing
leaves the machine), which asks for two tools at once: ``lookup_order``
answers, ``cancel_order`` raises. ``CapsealRunHooks`` seals a planned capsule
before each tool runs and its outcome after; the tools are made with
``hooks.function_tool``, so a tool that raised is seen through its failure
function (the hooks alone would see the SDK's error message as a result).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
from pathlib import Path
from typing import Any

from _tool_calls import print_tool_calls
from agents import Agent, Runner, set_tracing_disabled
from agents.testing import ScriptedModel, assistant_message, function_call

from capseal import Producer
from capseal.integrations.openai_agents import CapsealRunHooks
from capseal.keys import UnsafeEphemeralSigner, open_signer


def build(hooks: CapsealRunHooks) -> Agent[Any]:
    @hooks.function_tool
    def lookup_order(order_id: str, amount: float) -> dict[str, Any]:
        """Look an order up."""
        return {"order_id": order_id, "status": "shipped", "amount": amount}

    @hooks.function_tool
    def cancel_order(order_id: str) -> str:
        """Cancel an order."""
        raise RuntimeError(f"order {order_id} has shipped and cannot be cancelled")

    model = ScriptedModel([
        [function_call("lookup_order", {"order_id": "A-100", "amount": 59.7}, call_id="c-lookup"),
         function_call("cancel_order", {"order_id": "A-100"}, call_id="c-cancel")],
        [assistant_message("A-100 has shipped; it cannot be cancelled.")],
    ])
    return Agent(name="shop", model=model, tools=[lookup_order, cancel_order])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--key", metavar="URI", help="the signing key (default: a throwaway in-memory key)")
    args = parser.parse_args()
    set_tracing_disabled(True)
    ledger = Path(tempfile.mkdtemp()) / "capsules.db"
    signer = open_signer(args.key) if args.key else UnsafeEphemeralSigner()
    with contextlib.closing(signer), Producer("acme", "shop-agent@1.0", signer, ledger) as producer:
        hooks = CapsealRunHooks(producer)
        result = asyncio.run(Runner.run(build(hooks), "Cancel order A-100", hooks=hooks))
        print(f"agent: {result.final_output}  (signed by {type(signer).__name__})")
        open_calls = hooks.recorder.open_calls()
    print_tool_calls(ledger, open_calls)


if __name__ == "__main__":
    main()
