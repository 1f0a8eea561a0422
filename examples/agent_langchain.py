"""A LangChain agent whose tool calls are sealed as capsules, offline.

    python examples/agent_langchain.py                   # a throwaway key, a temporary ledger
    python examples/agent_langchain.py --key URI         # a key of your own: file:…, pkcs11:…, tpm2:…

The agent (``create_agent``) runs on LangChain's own fake chat model, given
``bind_tools`` as every tool-calling model has: it asks for two tools at
once, ``lookup_order`` (which answers) and ``cancel_order`` (which fails: a
``ToolException`` handed back to the model as an error ``ToolMessage``).
``CapsealCallbackHandler`` seals a planned capsule before each tool runs and
a confirmed or failed one after it, chained to it; the arguments and results
enter only as digests.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from pathlib import Path
from typing import Any

from _tool_calls import print_tool_calls
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.tools import ToolException, tool

from capseal import Producer
from capseal.integrations.langchain import CapsealCallbackHandler
from capseal.keys import UnsafeEphemeralSigner, open_signer


class ScriptedChat(GenericFakeChatModel):
    """LangChain's fake chat model, with tools bound."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


@tool
def lookup_order(order_id: str, amount: float) -> dict[str, Any]:
    """Look an order up."""
    return {"order_id": order_id, "status": "shipped", "amount": amount}


@tool
def cancel_order(order_id: str) -> str:
    """Cancel an order."""
    raise ToolException(f"order {order_id} has shipped and cannot be cancelled")


cancel_order.handle_tool_error = True  # the model is told, the run goes on

MODEL = ScriptedChat(messages=iter([
    AIMessage(content="", tool_calls=[
        {"name": "lookup_order", "args": {"order_id": "A-100", "amount": 59.7}, "id": "c-lookup"},
        {"name": "cancel_order", "args": {"order_id": "A-100"}, "id": "c-cancel"}]),
    AIMessage(content="A-100 has shipped; it cannot be cancelled."),
]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--key", metavar="URI", help="the signing key (default: a throwaway in-memory key)")
    args = parser.parse_args()
    ledger = Path(tempfile.mkdtemp()) / "capsules.db"
    signer = open_signer(args.key) if args.key else UnsafeEphemeralSigner()
    with contextlib.closing(signer), Producer("acme", "shop-agent@1.0", signer, ledger) as producer:
        handler = CapsealCallbackHandler(producer)
        agent = create_agent(MODEL, tools=[lookup_order, cancel_order])
        answer = agent.invoke({"messages": [("user", "Cancel order A-100")]}, config={"callbacks": [handler]})
        print(f"agent: {answer['messages'][-1].content}  (signed by {type(signer).__name__})")
        open_calls = handler.recorder.open_calls()
    print_tool_calls(ledger, open_calls)


if __name__ == "__main__":
    main()
