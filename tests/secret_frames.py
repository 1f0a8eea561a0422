"""What an error reporter that captures frame locals (Sentry's
``include_local_variables``, a debugger's post-mortem, ``traceback`` with
``capture_locals``) would see of a secret: every capseal frame's locals are
looked at whenever an exception is raised in the frame or passes through it
(caught there or not), at that moment, on the calling thread and every
thread started meanwhile (``sys.settrace`` and ``threading.settrace``). A
local *shows* the secret when it is the secret (as text or bytes), holds
it, or its ``repr`` does."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: capseal's own code (the packages capseal, capseal.keys, capseal.attest)
_OURS = tuple(str(ROOT / folder) + "/" for folder in ("sdk", "keys", "attest"))


def shows(value: Any, secret: str) -> bool:
    """Whether ``value`` shows ``secret`` as text, bytes or in its repr."""
    needles = (secret, secret.encode("utf-8"))
    if isinstance(value, str):
        return secret in value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return needles[1] in bytes(value)
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a repr that fails shows nothing
        return False
    return secret in text or repr(needles[1])[2:-1] in text


@contextmanager
def watching(secret: str) -> Iterator[list[str]]:
    """Collect ``file:line function(local)`` for every capseal frame local
    that shows ``secret`` when an exception passes through the frame while
    the block runs."""
    found: list[str] = []
    seen: set[str] = set()

    def local_trace(frame: FrameType, event: str, arg: Any) -> Callable[..., Any] | None:
        if event == "exception":
            for name, value in list(frame.f_locals.items()):
                if shows(value, secret):
                    where = (f"{frame.f_code.co_filename.replace(str(ROOT) + '/', '')}:{frame.f_lineno} "
                             f"{frame.f_code.co_name}({name}) at {event}")
                    if where not in seen:
                        seen.add(where)
                        found.append(where)
        return local_trace

    def global_trace(frame: FrameType, event: str, arg: Any) -> Callable[..., Any] | None:
        if event == "call" and frame.f_code.co_filename.startswith(_OURS):
            frame.f_trace_lines = False  # only exception and return events are wanted
            return local_trace
        return None

    old = sys.gettrace()
    threading.settrace(global_trace)
    sys.settrace(global_trace)
    try:
        yield found
    finally:
        sys.settrace(old)
        threading.settrace(None)  # type: ignore[arg-type]
