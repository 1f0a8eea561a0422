"""A pydantic-ai agent whose tool calls are sealed as capsules, offline.

    python examples/agent_pydantic_ai.py                 # a throwaway key, a temporary ledger
    python examples/agent_pydantic_ai.py --key URI       # a key of your own: file:…, pkcs11:…, tpm2:…

The agent runs on pydantic-ai's own ``FunctionModel``, scripted to ask for
two tools at once: ``lookup_order`` answers, ``cancel_order`` asks the model
to try again (``ModelRetry``), and the model gives up. The
``CapsealCapability`` seals a planned capsule before each tool runs and a
confirmed or failed one after it, chained to it.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from pathlib import Path
from typing import Any

from _tool_calls import print_tool_calls
from pydantic_ai import Agent, ModelRetry
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from capseal import Producer
from capseal.integrations.pydantic_ai import CapsealCapability
from capseal.keys import UnsafeEphemeralSigner, open_signer


def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    if len(messages) == 1:  # the user's request: ask for both tools
        return ModelResponse(parts=[
            ToolCallPart("lookup_order", {"order_id": "A-100", "amount": 59.7}, tool_call_id="c-lookup"),
            ToolCallPart("cancel_order", {"order_id": "A-100"}, tool_call_id="c-cancel")])
    return ModelResponse(parts=[TextPart("A-100 has shipped; it cannot be cancelled.")])


def lookup_order(order_id: str, amount: float) -> dict[str, Any]:
    """Look an order up."""
    return {"order_id": order_id, "status": "shipped", "amount": amount}


def cancel_order(order_id: str) -> str:
    """Cancel an order."""
    raise ModelRetry(f"order {order_id} has shipped and cannot be cancelled")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--key", metavar="URI", help="the signing key (default: a throwaway in-memory key)")
    args = parser.parse_args()
    ledger = Path(tempfile.mkdtemp()) / "capsules.db"
    signer = open_signer(args.key) if args.key else UnsafeEphemeralSigner()
    with contextlib.closing(signer), Producer("acme", "shop-agent@1.0", signer, ledger) as producer:
        capability = CapsealCapability(producer)
        agent = Agent(FunctionModel(model), tools=[lookup_order, cancel_order], capabilities=[capability])
        print(f"agent: {agent.run_sync('Cancel order A-100').output}  (signed by {type(signer).__name__})")
        open_calls = capability.recorder.open_calls()
    print_tool_calls(ledger, open_calls)


if __name__ == "__main__":
    main()
