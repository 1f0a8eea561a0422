"""The two shipped transports: deterministic replay, and an OpenAI-compatible
/v1/chat/completions client tested against a loopback server this test starts."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from capseal.errors import RefereeInputError, RefereeUnreachableError
from capseal.judge.referee import HTTPTransport, ReplayTransport, reanswer_request
from capseal.judge.referee import transports as transports_module

from .world import REANSWER, REQUEST, World

SERVED = {"id": "cmpl-1", "object": "chat.completion", "model": "seed-model",
          "choices": [{"index": 0, "message": {"role": "assistant", "content": REANSWER}, "finish_reason": "stop"}]}


class Endpoint:
    """A loopback chat-completions server; ``mode`` says how it answers."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.seen: list[dict[str, Any]] = []
        self.release = threading.Event()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length))
                endpoint.seen.append({"path": self.path, "headers": dict(self.headers), "body": body})
                mode = endpoint.mode
                if mode == "slow":
                    endpoint.release.wait(10)
                if mode == "trickle":
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    for _ in range(100):
                        if endpoint.release.wait(0.05):
                            return
                        self.wfile.write(b" ")
                        self.wfile.flush()
                    return
                status, payload = {
                    "ok": (200, SERVED),
                    "slow": (200, {"choices": [{"message": {"content": REANSWER}}]}),
                    "error": (500, {"error": "overloaded"}),
                    "not_chat": (200, {"result": REANSWER}),
                    "big": (200, {"choices": [{"message": {"content": "x" * 5000}}]}),
                    "garbage": (200, None),
                }[mode]
                data = json.dumps(payload).encode() if mode != "garbage" else b"{not json"
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture()
def endpoint() -> Iterator[Endpoint]:
    e = Endpoint()
    try:
        yield e
    finally:
        e.stop()


def test_replay_gives_the_recorded_answer_deterministically() -> None:
    replay = ReplayTransport({"node-c": REANSWER, "node-d": None})
    first, second = replay("node-c", {"messages": []}), replay("node-c", {"messages": []})
    assert first == second and first.text == REANSWER and first.capture_method == "deterministic_replay"
    with pytest.raises(RefereeUnreachableError):
        replay("node-d", {})
    with pytest.raises(RefereeUnreachableError):
        replay("node-z", {})
    assert replay.calls == ["node-c", "node-c", "node-d", "node-z"]


def test_http_posts_the_twins_request_greedy_with_their_seed_and_reads_the_completion(world: World, endpoint: Endpoint) -> None:
    a, _ = world.pair().halves
    request = reanswer_request(a, 3, REQUEST)
    assert request == {"model": "seed-model", "messages": REQUEST["messages"], "temperature": 0, "max_tokens": 40, "seed": 7}
    answer = HTTPTransport(endpoint.url, timeout=5, headers={"Authorization": "Bearer secret-token-q7"})("node-c", request)
    assert answer.text == REANSWER and answer.capture_method == "http_chat_completion"
    assert answer.body["id"] == "cmpl-1"
    seen = endpoint.seen[0]
    assert seen["path"] == "/v1/chat/completions" and seen["body"] == request
    assert seen["headers"]["x-mesh-target"] == "node-c" and seen["headers"]["Authorization"] == "Bearer secret-token-q7"
    assert "secret-token-q7" not in repr(HTTPTransport(endpoint.url, headers={"Authorization": "Bearer secret-token-q7"}))


def test_http_timing_out_is_unreachable_within_the_timeout(endpoint: Endpoint) -> None:
    for mode in ("slow", "trickle"):  # no answer at all; an answer that never finishes
        endpoint.mode = mode
        start = time.monotonic()
        with pytest.raises(RefereeUnreachableError) as caught:
            HTTPTransport(endpoint.url, timeout=0.5)("node-c", {"messages": [{"role": "user", "content": "x"}]})
        elapsed = time.monotonic() - start
        assert "timed out" in str(caught.value) and elapsed < 3, (mode, elapsed)


def test_http_refusals_and_garbage_are_unreachable(endpoint: Endpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    ask = {"messages": [{"role": "user", "content": "x"}]}
    for mode, said in (("error", "HTTP 500"), ("not_chat", "not a chat completion"), ("garbage", "not JSON")):
        endpoint.mode = mode
        with pytest.raises(RefereeUnreachableError) as caught:
            HTTPTransport(endpoint.url, timeout=5)("node-c", ask)
        assert said in str(caught.value), mode
    endpoint.mode = "big"
    monkeypatch.setattr(transports_module, "MAX_ANSWER_BYTES", 1000)
    with pytest.raises(RefereeUnreachableError):
        HTTPTransport(endpoint.url, timeout=5)("node-c", ask)
    port = endpoint.server.server_address[1]
    endpoint.stop()
    with pytest.raises(RefereeUnreachableError):  # nobody listens any more
        HTTPTransport(f"http://127.0.0.1:{port}", timeout=2)("node-c", ask)
    with pytest.raises(RefereeUnreachableError):  # nothing to re-answer
        HTTPTransport(f"http://127.0.0.1:{port}", timeout=2)("node-c", {"messages": []})
    for bad in ("ftp://x", "127.0.0.1:9", None):
        with pytest.raises(RefereeInputError):
            HTTPTransport(bad)  # type: ignore[arg-type]
    for timeout in (0, -1, float("nan"), True, "5"):
        with pytest.raises(RefereeInputError):
            HTTPTransport("http://127.0.0.1:1", timeout=timeout)  # type: ignore[arg-type]


def test_a_referee_reached_over_http_rules_and_a_timeout_spends_the_call(world: World, endpoint: Endpoint) -> None:
    book = world.book()
    answer = world.referee(book, transport=HTTPTransport(endpoint.url, timeout=5)).consider(world.pair())
    assert answer.to_json()["row"] == {"state": "adjudicated", "referee": "node-c", "tier": 2, "verdict": "contradicted:node-b"}
    assert answer.book_row is not None and answer.book_row.statement_id is not None
    statement = json.loads(book.ledger.entry(answer.book_row.statement_id).body)["content"]  # type: ignore[union-attr]
    assert statement["capture_method"] == "http_chat_completion"
    answer_capsule = book.ledger.get(statement["answer_capsule_id"]).capsule  # type: ignore[union-attr]
    from capseal.canonical import json_digest

    assert answer_capsule["effect"]["response_digest"] == json_digest(SERVED)  # the body as served, digested
    endpoint.mode = "slow"
    slow = world.referee(world.book("slow"), transport=HTTPTransport(endpoint.url, timeout=0.3))
    timed_out = slow.consider(world.pair())
    assert timed_out.to_json() == {"counts_against": None, "referee_calls": 1,
                                   "row": {"state": "not_adjudicated", "reason": "referee_unreachable"}}
    assert "timed out" in str(timed_out.refusal)
    assert slow.consider(timed_out.pair).referee_calls == 0  # spent, never retried

