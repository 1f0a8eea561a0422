"""A small mesh for the referee tests: nodes with their own keys, their halves, a book.

The pair is the seed's (the rule corpus's ``request`` cases): A = "1, 2, 3, 4, 5",
B = "1, 2, 3, 999 5", temperature 0, bracket ``bracket-1``, the model hash and
weights digest below; the referee's re-answer is A's. Model hash and weights
digest are copied from Mesh-LLM/capsules vectors/parity/referee/corpus/request.json
at b4e24453f572b2d9fe8f2cefbd0f35a5eb54b0ad (tag v0.1.4). The request body is
this suite's own (the corpus publishes only its digest), so capsule ids and the
request digest are ours.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization

from capseal import Producer, SealedRecord
from capseal.canonical import json_digest
from capseal.judge.referee import (
    Book,
    Candidate,
    Half,
    Pair,
    Recorded,
    Referee,
    RefereeSeat,
    ReplayTransport,
    Settings,
    load_half,
    make_pair,
    seal_half,
)
from capseal.keys import FileSigner, UnsafeEphemeralSigner, generate_private_key, write_pkcs8

MODEL = "b2767326b03d5e629546363ebe41714b78065e028709580996d60d2d119192da"
WEIGHTS = "ac28b90e169cc75956ee6283ac8dc787a945696122692a3b2f266d8453ff56cc"
OTHER = "0" * 64
REQUEST: dict[str, Any] = {"model": "seed-model", "messages": [{"role": "user", "content": "Count from 1 to 5."}],
                           "temperature": 0, "seed": 7}
A_TEXT, B_TEXT, REANSWER = "1, 2, 3, 4, 5", "1, 2, 3, 999 5", "1, 2, 3, 4, 5"
NOW = "2026-10-01T12:00:00Z"
BRACKET = "bracket-1"

#: the seed's answers for its pair, one per regime
OFF = {"counts_against": None, "referee_calls": 0, "row": {"reason": "off", "state": "not_adjudicated"}}
ONE_CALL = {"counts_against": "node-b", "referee_calls": 1,
            "row": {"referee": "node-c", "state": "adjudicated", "tier": 1, "verdict": "contradicted:node-b"}}
NO_ELIGIBLE = {"counts_against": None, "referee_calls": 0,
               "row": {"reason": "no_eligible_referee", "state": "not_adjudicated"}}
#: node-c corroborated on the model before: tier 1
CORROBORATED_C = {"node_id": "node-c", "model_hash": MODEL, "bucket": "corroborated", "recorded_at": "2026-09-01T00:00:00Z"}


def pem_of(public_key: Any) -> str:
    return str(public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode())


class World:
    """Nodes with file keys (so a CLI run can open them), each sealing into its own ledger."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        (tmp / "keys").mkdir(exist_ok=True)
        self.signers: dict[str, Any] = {}
        self.key_paths: dict[str, Path] = {}
        self._count = 0
        self._closing: list[Any] = []

    def close(self) -> None:
        for thing in reversed(self._closing):
            thing.close()
        self._closing.clear()

    def signer(self, node: str) -> Any:
        if node not in self.signers:
            path = write_pkcs8(generate_private_key("ed25519"), self.tmp / "keys" / f"{node}.pem")
            self.key_paths[node] = path
            self.signers[node] = FileSigner(path)
        return self.signers[node]

    def key_uri(self, node: str) -> str:
        self.signer(node)
        return f"file:{self.key_paths[node]}"

    def pem(self, node: str) -> str:
        return pem_of(self.signer(node).public_key)

    def half(self, node: str, text: str | None = None, *, body: Any = None, request: Any = None, model: str | None = MODEL,
             weights: str | None = WEIGHTS, temperature: int | str = 0, seed: int | None = 7, role: str = "provider",
             signer: Any = None, served_by: str | None = None) -> SealedRecord:
        """``node`` seals its half in its own ledger (``signer``: another key than its own)."""
        self._count += 1
        with Producer("mesh.example", f"{node}@1", signer or self.signer(node), self.tmp / f"{node}.db") as p:
            return seal_half(p, action_id=f"answer-{self._count}", node_id=served_by or node,
                             request=REQUEST if request is None else request, body=text if body is None else body,
                             model_hash=model, weights_digest=weights, temperature=temperature, seed=seed, role=role)

    def load(self, record: Any, node: str, text: str | None = None, **kw: Any) -> Half:
        kw.setdefault("request", REQUEST)
        announced = kw.pop("announced") if "announced" in kw else self.signer(node).public_key
        return load_half(record, node_id=node, announced=announced, text=text, **kw)

    def pair(self, a: str = A_TEXT, b: str = B_TEXT, *, bracket: str | None = BRACKET, nodes: tuple[str, str] = ("node-a", "node-b"),
             a_kw: Mapping[str, Any] | None = None, b_kw: Mapping[str, Any] | None = None, request: Any = None) -> Pair:
        request = REQUEST if request is None else request
        halves = []
        for node, text, kw in ((nodes[0], a, a_kw or {}), (nodes[1], b, b_kw or {})):
            kw = dict(kw)
            host = kw.pop("host", None)
            record = self.half(node, text, request=request, **kw)
            halves.append(self.load(record, node, text, request=request, host=host))
        return make_pair(bracket, json_digest(request), halves, request=request)

    def candidate(self, node: str, *, model: str | None = MODEL, weights: str | None = WEIGHTS, key: Any = "own",
                  blocked: bool = False) -> Candidate:
        public = self.signer(node).public_key if key == "own" else key
        return Candidate(node, model, weights, public, blocked)

    def roster(self, *nodes: str, **overrides: Mapping[str, Any]) -> list[Candidate]:
        nodes = nodes or ("node-a", "node-b", "node-c")
        return [self.candidate(n, **overrides.get(n.replace("-", "_"), {})) for n in nodes]

    def book(self, name: str = "book") -> Book:
        book = Book(self.tmp / f"{name}.db", UnsafeEphemeralSigner())
        self._closing.append(book)
        return book

    def seat(self, book: Book, node: str = "node-c", roster: Sequence[Candidate] | None = None, clock: Any = None,
             signer: Any = None) -> RefereeSeat:
        seat = RefereeSeat(node, signer or self.signer(node), book.ledger, roster=roster or self.roster(),
                           clock=clock or (lambda: NOW))
        self._closing.append(seat)
        return seat

    def referee(self, book: Book, *, on: bool | None = True, roster: Sequence[Candidate] | None = None,
                answers: Mapping[str, str | None] | None = None, seats: Iterable[str] = ("node-c",),
                history: Sequence[Recorded] = (), clock: Any = None, draw: Any = None, bar_days: int | None = None,
                **kw: Any) -> Referee:
        roster = list(roster) if roster is not None else self.roster()
        clock = clock or (lambda: NOW)
        return Referee(book, roster=roster, settings=Settings(on, bar_days),
                       transport=kw.pop("transport", ReplayTransport(answers if answers is not None else {"node-c": REANSWER})),
                       seats={n: self.seat(book, n, roster, clock) for n in seats}, history=history, clock=clock,
                       draw=draw, **kw)

    # ------------------------------------------------------------------ case files

    def case(self, *, settings: Mapping[str, Any] | None = None, roster: Iterable[str] = ("node-a", "node-b", "node-c"),
             referee: Mapping[str, Mapping[str, Any]] | None = None, history: Sequence[Mapping[str, Any]] = (CORROBORATED_C,),
             halves: Sequence[tuple[str, str]] = (("node-a", A_TEXT), ("node-b", B_TEXT)), draws: Sequence[int] | None = None,
             request: Any = None) -> dict[str, Any]:
        """A case file (JSON) for the seed's pair; the halves are sealed now."""
        request = REQUEST if request is None else request
        case_halves = []
        for node, text in halves:
            record = self.half(node, text, request=request)
            case_halves.append({"node_id": node, "model_hash": MODEL, "weights_digest": WEIGHTS, "temperature": 0,
                                "text": text, "capsule_id": record.capsule_id, "record": record.to_json()})
        referee = referee if referee is not None else {"node-c": {"reanswer": REANSWER, "signs": True}}
        case: dict[str, Any] = {
            "now": NOW,
            "settings": dict(settings) if settings is not None else {"adjudicate_differing_twins": True, "referee_bar_days": None},
            "pair": {"twin_bracket_id": BRACKET, "request_digest": json_digest(request), "request": request, "halves": case_halves},
            "roster": [{"node_id": n, "model_hash": MODEL, "weights_digest": WEIGHTS, "announced_key": self.pem(n), "blocked": False}
                       for n in roster],
            "history": [dict(h) for h in history],
            "referee": {n: {**spec, "key": spec.get("key", self.key_uri(n))} for n, spec in referee.items()},
        }
        if draws is not None:
            case["draws"] = list(draws)
        return case

    def write_case(self, name: str, case: Mapping[str, Any]) -> Path:
        path = self.tmp / f"{name}.json"
        path.write_text(json.dumps(case, indent=1))
        return path
