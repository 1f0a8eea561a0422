"""``capseal[mcp]``: MCP server tool calls sealed as capsules.

Two ways in; use one of them for a server, not both (each seals every call):

* :class:`CapsealMCPMiddleware`, a server middleware (``MCPServer(…,
  middleware=[CapsealMCPMiddleware(producer)])`` or appended to
  ``Server.middleware``) that seals each ``tools/call`` request: the planned
  capsule before the request goes on to the handler, and its outcome from
  the result (``isError: true`` is a failure; a request the handler raised
  for, such as an unknown method, too). The response digest is over the
  result without its ``_meta``. The MCP SDK marks this middleware API
  provisional, hence:
* :class:`SealedTools`, a decorator for the tool functions themselves
  (``@server.tool()`` above ``@sealed``): it keeps the function's name,
  docstring and signature, so the server derives the same input schema. It
  digests the arguments the function is called with (a ``Context``
  parameter excepted) and what it returns; a function that raises is sealed
  failed. It sees the request id only when the function takes a ``Context``.

Runtime context the middleware offers to the allow-list: ``client_info``,
``protocol_version``; the decorator offers none. Fail-closed, the middleware
answers a ``tools/call`` whose planned capsule cannot be sealed with an
internal error (an ``MCPError`` raised from the
:class:`~capseal.errors.ToolCallBlockedError`), and the decorator raises
the ToolCallBlockedError (the server hands it back as an error result): in
both, before the tool runs.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from capseal import Producer
from capseal.aio import AsyncProducer

from ._extras import require
from .calls import ABSENT, SealFailure, ToolCall
from .recorder import ToolCallRecorder

require("mcp", "mcp", __name__)
require("mcp.server.mcpserver", "mcp", __name__)

from mcp import MCPError  # noqa: E402
from mcp.server.mcpserver import Context  # noqa: E402
from mcp.types import INTERNAL_ERROR  # noqa: E402

from capseal.errors import ToolCallBlockedError  # noqa: E402

__all__ = ["CapsealMCPMiddleware", "SealedTools", "FRAMEWORK"]

FRAMEWORK = "mcp"
_CLIENT_INFO = "io.modelcontextprotocol/clientInfo"

F = TypeVar("F", bound=Callable[..., Any])


class CapsealMCPMiddleware:
    """A server middleware sealing every ``tools/call`` (see the module docstring).

    Args:
        producer: the producer that seals (or a ``capseal.aio.AsyncProducer`` over it).
        fail_closed: refuse a call before its tool runs when its planned capsule cannot be sealed.
        on_seal_error: called with each :class:`~capseal.integrations.SealFailure`.
        context: allow-listed runtime context (``client_info``, ``protocol_version``),
            each ``"clear"`` or ``"digest"``.
        irreversibility_class: written on every capsule.

    Raises:
        InputError: a bad argument.
    """

    def __init__(self, producer: Producer | AsyncProducer, *, fail_closed: bool = False,
                 on_seal_error: Callable[[SealFailure], object] | None = None,
                 context: Mapping[str, str] | None = None, irreversibility_class: str | None = None) -> None:
        self.recorder = ToolCallRecorder(producer, framework=FRAMEWORK, fail_closed=fail_closed,
                                         on_seal_error=on_seal_error, context=context,
                                         irreversibility_class=irreversibility_class)

    async def __call__(self, ctx: Any, call_next: Callable[[Any], Awaitable[Any]]) -> Any:
        """Seal a ``tools/call`` around the rest of the chain; pass anything else on.

        Raises:
            MCPError: fail-closed, and the planned capsule could not be sealed
                (an internal error for the client, raised from the
                ToolCallBlockedError; the message says no more).
            what the rest of the chain raised (after the failed capsule).
        """
        if ctx.method != "tools/call" or ctx.request_id is None:
            return await call_next(ctx)
        params = ctx.params if isinstance(ctx.params, Mapping) else {}
        meta = params.get("_meta")
        seen = {"protocol_version": getattr(ctx, "protocol_version", None),
                "client_info": meta.get(_CLIENT_INFO) if isinstance(meta, Mapping) else None}
        try:
            call = await self.recorder.astart(tool=params.get("name", "?"), arguments=params.get("arguments", ABSENT),
                                              ids={"request_id": ctx.request_id},
                                              context={k: v for k, v in seen.items() if v is not None})
        except ToolCallBlockedError as exc:  # the client learns the call did not run, not why (logged here)
            raise MCPError(INTERNAL_ERROR, "the tool call was not run: it could not be recorded") from exc
        try:
            result = await call_next(ctx)
        except Exception:
            await call.afailed(outcome="raised")
            raise
        await _seal_result(call, result)
        return result


async def _seal_result(call: ToolCall, result: Any) -> None:
    """The outcome of a ``tools/call`` from the result the chain returned."""
    body = result.model_dump(by_alias=True, mode="json", exclude_none=True) if hasattr(result, "model_dump") else result
    if not isinstance(body, Mapping):
        await call.aunobserved()
        return
    response = {k: v for k, v in body.items() if k != "_meta"}
    if body.get("isError") is True:
        await call.afailed(response, outcome="error_result")
    elif body.get("resultType", "complete") == "complete" and ("content" in body or "structuredContent" in body):
        await call.aconfirmed(response)
    else:  # not a final tool result (more input asked for): the call is not over
        await call.aunobserved()


class SealedTools:
    """A decorator sealing each call of the tool functions it wraps (see the module docstring).

    Args: as :class:`CapsealMCPMiddleware` (no runtime context is offered).
    """

    def __init__(self, producer: Producer | AsyncProducer, *, fail_closed: bool = False,
                 on_seal_error: Callable[[SealFailure], object] | None = None,
                 irreversibility_class: str | None = None) -> None:
        self.recorder = ToolCallRecorder(producer, framework=FRAMEWORK, fail_closed=fail_closed,
                                         on_seal_error=on_seal_error, irreversibility_class=irreversibility_class)

    def __call__(self, fn: F) -> F:
        """``fn``, sealed; its name, docstring, annotations and signature kept.

        Args:
            fn: a tool function, sync or async.

        Returns:
            The wrapped function (async if ``fn`` is).
        """
        signature = inspect.signature(fn)
        recorder = self.recorder

        def described(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
            try:
                bound = signature.bind_partial(*args, **kwargs).arguments
            except TypeError:
                return {"tool": fn.__name__, "arguments": ABSENT}
            contexts = [v for v in bound.values() if isinstance(v, Context)]
            ids = {"request_id": _request_id(contexts[0])} if contexts else {}
            return {"tool": fn.__name__, "ids": ids,
                    "arguments": {k: v for k, v in bound.items() if not isinstance(v, Context)}}

        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def sealed_async(*args: Any, **kwargs: Any) -> Any:
                call = await recorder.astart(**described(args, kwargs))
                try:
                    result = await fn(*args, **kwargs)
                except Exception:
                    await call.afailed(outcome="raised")
                    raise
                await call.aconfirmed(result)
                return result

            return sealed_async  # type: ignore[return-value]

        @functools.wraps(fn)
        def sealed_sync(*args: Any, **kwargs: Any) -> Any:
            call = recorder.start(**described(args, kwargs))
            try:
                result = fn(*args, **kwargs)
            except Exception:
                call.failed(outcome="raised")
                raise
            call.confirmed(result)
            return result

        return sealed_sync  # type: ignore[return-value]


def _request_id(context: Any) -> Any:
    try:
        return context.request_id
    except Exception:  # noqa: BLE001 - a context outside a request has none: absent
        return None
