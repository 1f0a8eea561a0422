"""How a referee's re-answer arrives: an injected callable, and the two shipped.

A transport is called as ``transport(referee_node_id, request)`` with the
re-answer request (:func:`reanswer_request`: the twins' own request at
temperature 0 with the twins' seed) and returns a :class:`Reanswer`, or raises
``RefereeUnreachableError`` — the pair's one call is spent either way.

* :class:`ReplayTransport` — a deterministic replay of answers given per node
  (tests and audits); ``capture_method: deterministic_replay``.
* :class:`HTTPTransport` — an OpenAI-compatible ``POST /v1/chat/completions``
  (what mesh nodes and local model servers expose), over ``http.client`` with a
  timeout that bounds the whole exchange; ``capture_method: http_chat_completion``.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from capseal.errors import MalformedJSONError, RefereeInputError, RefereeUnreachableError
from capseal.record import strict_json

from .halves import Half, answer_text
from .vocab import CAPTURE_HTTP, CAPTURE_REPLAY

__all__ = ["Reanswer", "Transport", "reanswer_request", "ReplayTransport", "HTTPTransport", "MAX_ANSWER_BYTES"]

_HEADER = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_VALUE = re.compile(r"[\t\x20-\x7e\x80-\xff]*")

#: an answer larger than this is refused (a hostile server cannot fill memory)
MAX_ANSWER_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class Reanswer:
    """A referee's re-answer: the text, the body it served, how it was captured,
    and the request it answered."""

    text: str
    body: Any
    capture_method: str
    request: dict[str, Any]


Transport = Callable[[str, dict[str, Any]], Reanswer]


def reanswer_request(a: Half, divergence_index: int, request: Any = None) -> dict[str, Any]:
    """The request a referee re-answers: the twins' model and messages, greedy
    (temperature 0), half A's decoding seed (0 when it signed none), and enough
    tokens to pass the word where the twins split.

    Args:
        a: half A (its signed seed is used).
        divergence_index: where the twins' words split.
        request: the twins' disclosed request (default: half A's).

    Returns:
        The chat-completion request body (no floats: it is digested).
    """
    twins = request if request is not None else a.request
    body: dict[str, Any] = {}
    if isinstance(twins, Mapping) and isinstance(twins.get("model"), str):
        body["model"] = twins["model"]
    messages = twins.get("messages") if isinstance(twins, Mapping) else None
    body["messages"] = list(messages) if isinstance(messages, list) else []
    body["temperature"] = 0
    body["max_tokens"] = min(8 * (divergence_index + 2), 256)
    seed = a.facts.get("seed")
    body["seed"] = seed if type(seed) is int else 0
    return body


class ReplayTransport:
    """Replays recorded re-answers: ``answers[node_id]`` is the text that node
    gives (None: it does not answer). Deterministic; nothing leaves the process.

    Args:
        answers: node id -> its re-answer text, or None.

    Raises:
        RefereeInputError: an answer that is neither text nor None.
    """

    def __init__(self, answers: Mapping[str, str | None]) -> None:
        for node, text in answers.items():
            if text is not None and not isinstance(text, str):
                raise RefereeInputError(f"a replayed re-answer is text or null, not {type(text).__name__}",
                                        path=f"$.referee.{node}.reanswer")
        self._answers = dict(answers)
        self.calls: list[str] = []

    def __call__(self, referee: str, request: dict[str, Any]) -> Reanswer:
        self.calls.append(referee)
        text = self._answers.get(referee)
        if text is None:
            raise RefereeUnreachableError(f"{referee} gave no re-answer (replay)")
        return Reanswer(text=text, body=text, capture_method=CAPTURE_REPLAY, request=dict(request))


class HTTPTransport:
    """Re-answers from an OpenAI-compatible chat-completions endpoint.

    ``base_url`` is ``http://host:port[/prefix]`` (https too); the request goes
    to ``<prefix>/v1/chat/completions`` with the referee named in the
    ``target_header`` (``x-mesh-target``, how a mesh routes a request to one
    node; None sends none). ``timeout`` (seconds) bounds the whole exchange —
    connecting, sending and reading — so a server that trickles bytes cannot
    hold the call. ``headers`` (e.g. an Authorization) are sent as given and
    never appear in errors or reprs.

    Args:
        base_url: the endpoint, ``http(s)://host:port[/prefix]``.
        timeout: seconds for the whole exchange, in (0, 3600).
        target_header: the header naming the referee, or None.
        headers: other headers to send.

    Raises:
        RefereeInputError: one of these is not as described (named by its path).
    """

    def __init__(self, base_url: str, *, timeout: float = 30.0, target_header: str | None = "x-mesh-target",
                 headers: Mapping[str, str] | None = None) -> None:
        parts = urllib.parse.urlsplit(base_url) if isinstance(base_url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise RefereeInputError(f"base_url is an http:// or https:// URL, not {str(base_url)[:60]!r}",
                                    path="$.base_url")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < 3600:
            raise RefereeInputError(f"timeout is a number of seconds in (0, 3600), not {timeout!r:.20}", path="$.timeout")
        if target_header is not None and not (isinstance(target_header, str) and _HEADER.fullmatch(target_header)):
            raise RefereeInputError("target_header is an HTTP header name, or None", path="$.target_header")
        for name, value in (headers or {}).items():
            if not (isinstance(name, str) and isinstance(value, str) and _HEADER.fullmatch(name) and _VALUE.fullmatch(value)):
                raise RefereeInputError("headers are names (HTTP tokens) and values (printable text, no line breaks)",
                                        path="$.headers")
        self._parts = parts
        self.timeout = float(timeout)
        self._target = target_header
        self._headers = dict(headers or {})

    def __repr__(self) -> str:
        return f"HTTPTransport({self._parts.scheme}://{self._parts.netloc}{self._parts.path!s}, timeout={self.timeout:g})"

    def __call__(self, referee: str, request: dict[str, Any]) -> Reanswer:
        if not request.get("messages"):
            raise RefereeUnreachableError("the twins' request was not disclosed: there is nothing to re-answer")
        deadline = time.monotonic() + self.timeout
        try:
            status, raw = self._post(referee, json.dumps(request, ensure_ascii=False).encode("utf-8"), deadline)
        except (OSError, http.client.HTTPException) as exc:
            kind = "timed out" if isinstance(exc, (socket.timeout, TimeoutError)) else f"failed ({type(exc).__name__})"
            raise RefereeUnreachableError(f"{referee}: the re-answer request {kind} after at most {self.timeout:g} s")\
                from None
        if status != 200:
            raise RefereeUnreachableError(f"{referee}: the endpoint answered HTTP {status}")
        try:
            body = strict_json(raw, "the re-answer")
        except MalformedJSONError as exc:
            raise RefereeUnreachableError(f"{referee}: the answer is not JSON ({exc})") from None
        text = answer_text(body) if isinstance(body, Mapping) else None
        if text is None:
            raise RefereeUnreachableError(f"{referee}: the answer is not a chat completion (no choices[0].message.content)")
        return Reanswer(text=text, body=body, capture_method=CAPTURE_HTTP, request=dict(request))

    def _post(self, referee: str, payload: bytes, deadline: float) -> tuple[int, bytes]:
        parts = self._parts
        left = max(0.001, deadline - time.monotonic())
        cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        conn = cls(parts.hostname or "", parts.port, timeout=left)
        try:
            conn.connect()
            sock = conn.sock  # kept: each read below gets only what is left of the budget
            headers = {"Content-Type": "application/json", "Accept": "application/json", **self._headers}
            if self._target:
                headers[self._target] = referee
            conn.request("POST", parts.path.rstrip("/") + "/v1/chat/completions", body=payload, headers=headers)
            response = conn.getresponse()
            chunks: list[bytes] = []
            total = 0
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("the answer did not finish in time")
                if sock is not None:
                    sock.settimeout(left)
                chunk = response.read1(65536) if hasattr(response, "read1") else response.read(65536)
                if not chunk:
                    break
                total += len(chunk)
                if total > MAX_ANSWER_BYTES:
                    raise http.client.HTTPException(f"the answer is over {MAX_ANSWER_BYTES} bytes")
                chunks.append(chunk)
            return response.status, b"".join(chunks)
        finally:
            conn.close()
