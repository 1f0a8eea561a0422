"""An MCP server whose tool calls are sealed as capsules, with an in-process client.

    python examples/agent_mcp.py                         # a throwaway key, a temporary ledger
    python examples/agent_mcp.py --key URI               # a key of your own: file:…, pkcs11:…, tpm2:…

The server (``MCPServer``) has two tools: ``lookup_order`` answers,
``cancel_order`` fails (a ``ToolError``: an ``isError`` result). The MCP
SDK's own ``Client`` connects to it in-process and calls both at once.
``CapsealMCPMiddleware`` seals a planned capsule before each ``tools/call``
goes on to its tool and a confirmed or failed one after it (the calls are
named by their JSON-RPC request ids).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
from pathlib import Path
from typing import Any

from _tool_calls import print_tool_calls
from mcp import Client
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from capseal import Producer
from capseal.integrations.mcp import CapsealMCPMiddleware
from capseal.keys import UnsafeEphemeralSigner, open_signer


def build(middleware: CapsealMCPMiddleware) -> MCPServer:
    server = MCPServer("shop", middleware=[middleware])

    @server.tool()
    def lookup_order(order_id: str, amount: float) -> dict[str, Any]:
        """Look an order up."""
        return {"order_id": order_id, "status": "shipped", "amount": amount}

    @server.tool()
    def cancel_order(order_id: str) -> str:
        """Cancel an order."""
        raise ToolError(f"order {order_id} has shipped and cannot be cancelled")

    return server


async def client(server: MCPServer) -> list[Any]:
    async with Client(server) as session:
        return list(await asyncio.gather(session.call_tool("lookup_order", {"order_id": "A-100", "amount": 59.7}),
                                         session.call_tool("cancel_order", {"order_id": "A-100"})))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--key", metavar="URI", help="the signing key (default: a throwaway in-memory key)")
    args = parser.parse_args()
    ledger = Path(tempfile.mkdtemp()) / "capsules.db"
    signer = open_signer(args.key) if args.key else UnsafeEphemeralSigner()
    with contextlib.closing(signer), Producer("acme", "shop-server@1.0", signer, ledger) as producer:
        middleware = CapsealMCPMiddleware(producer)
        results = asyncio.run(client(build(middleware)))
        said = ", ".join("error" if r.is_error else "ok" for r in results)
        print(f"client: {said}  (signed by {type(signer).__name__})")
        open_calls = middleware.recorder.open_calls()
    print_tool_calls(ledger, open_calls)


if __name__ == "__main__":
    main()
