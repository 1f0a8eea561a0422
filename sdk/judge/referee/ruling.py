"""The referee's side: check what it can, re-answer, rule, and sign (V1–V8, S4).

A :class:`RefereeSeat` is one referee node: its id and its own capseal signer
(software, PKCS#11 or TPM). Asked about a pair with the tier it was chosen from
and its re-answer, it:

1. seals its re-answer as a capsule of its own (:func:`~.halves.seal_half`,
   role ``referee``): the record of what it served, ``response_digest`` the
   digest of the body;
2. refuses, without a ruling, when it cannot name itself (exactly one roster
   node announced its key), a half is not signed by its server's announced key
   with its body, it is a twin, or the twins answered different requests;
3. rules (:func:`~.verdict.adjudicate`): twins on unknown or differing weights,
   or sampled, are ``not_comparable`` (with why), never compared;
4. signs a statement of its ruling (``capseal-referee-statement/1``: referee,
   tier, verdict, both halves, the divergence, the answer's capsule and digest)
   kept as a judgment-store artifact, and — for ``corroborated``,
   ``inconclusive`` and ``contradicted`` — an ``adjudication/v1`` through
   :mod:`capseal.judge`: type ``adjudication``, an ``adjudicates`` link to each
   half and a ``cites`` link to its answer capsule in the store header, both
   halves cited as parties, the statement as its ``referee``, the divergence
   index as a decimal string. ``not_comparable`` has no ``adjudication/v1``
   token, so only the statement is signed.

The halves are never edited. The referee's records are sealed into the ledger
the book is kept in (which holds the halves), so every citation resolves there.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from capseal.canonical import is_hex64, json_digest
from capseal.errors import PairRefusedError
from capseal.judge.citation import DigestRef, Target
from capseal.judge.links import Link
from capseal.judge.pin import JudgePin
from capseal.judge.shapes import Adjudication
from capseal.judge.store import JudgmentStore
from capseal.ledger import Ledger

from .book import keep_record
from .halves import Half, load_half, seal_half
from .pairs import Pair
from .selection import Candidate
from .transports import Reanswer
from .verdict import adjudicate
from .vocab import (
    CONTRADICTED_PREFIX,
    ROLE_REFEREE,
    STATEMENT_TYPE,
    STATEMENT_VERSION,
    TIERS,
    VERDICT_NOT_COMPARABLE,
)

__all__ = ["Ruling", "Refusal", "RefereeSeat", "split_verdict"]


@dataclass(frozen=True)
class Ruling:
    """What a referee signed about one pair."""

    referee: str
    tier: int
    #: the mesh-form verdict: corroborated, inconclusive, contradicted:<node>, not_comparable
    verdict: str
    because: str | None
    statement_id: str
    ruling_id: str | None
    answer_capsule_id: str


@dataclass(frozen=True)
class Refusal:
    """A referee that answered but will not sign a ruling, and why."""

    referee: str
    reason: str
    detail: str | None = None


def split_verdict(verdict: str) -> tuple[str, str | None]:
    """Split a mesh-form verdict.

    Args:
        verdict: ``corroborated``, ``inconclusive``, ``not_comparable`` or ``contradicted:<node>``.

    Returns:
        ``("contradicted", node)`` for a contradiction, else ``(verdict, None)``.
    """
    if verdict.startswith(CONTRADICTED_PREFIX):
        return "contradicted", verdict[len(CONTRADICTED_PREFIX):]
    return verdict, None


class RefereeSeat:
    """A referee node that seals with its own signer.

    Args:
        node_id: the referee's node id.
        signer: its ``capseal.keys.Signer``.
        ledger: where its records go (the ledger holding the halves).
        roster: the nodes and announced keys it knows (to name itself and check halves).
        model_hash: the model it serves (default: its roster entry's).
        weights_digest: the weights it serves (default: its roster entry's).
        clock: returns this node's time (RFC 3339 UTC).
        operator: the operator named on its capsules.
    """

    def __init__(self, node_id: str, signer: Any, ledger: Ledger, *, roster: Sequence[Candidate],
                 clock: Callable[[], str], model_hash: str | None = None, weights_digest: str | None = None,
                 operator: str = "capseal-referee") -> None:
        self.node_id = node_id
        self.signer = signer
        self.ledger = ledger
        self.roster = list(roster)
        own = next((c for c in self.roster if c.node_id == node_id), None)
        self.model_hash = model_hash if model_hash is not None else own.model_hash if own else None
        self.weights_digest = weights_digest if weights_digest is not None else own.weights_digest if own else None
        self._clock = clock
        self._operator = operator
        self._producer: Any = None

    def close(self) -> None:
        """Close the seat's producer (its signer is the caller's to close)."""
        if self._producer is not None:
            self._producer.close()
            self._producer = None

    def __enter__(self) -> RefereeSeat:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _seal_answer(self, pair: Pair, reanswer: Reanswer) -> Any:
        from capseal import Producer

        if self._producer is None:
            self._producer = Producer(self._operator, self.node_id, self.signer, self.ledger, clock=self._clock)
        seed = reanswer.request.get("seed")
        return seal_half(self._producer, action_id=f"referee-answer/{pair.pair_id[:32]}/{os.urandom(4).hex()}",
                         node_id=self.node_id, request=reanswer.request, body=reanswer.body,
                         model_hash=self.model_hash, weights_digest=self.weights_digest, temperature=0,
                         seed=seed if type(seed) is int else None, role=ROLE_REFEREE,
                         capture_method=reanswer.capture_method)

    def _checked_halves(self, pair: Pair) -> tuple[Half, Half] | Refusal:
        keys = {c.node_id: c.announced_key for c in self.roster}
        checked = []
        for i, half in enumerate(pair.halves):
            try:
                checked.append(load_half(half.record_json(), node_id=half.node_id, announced=keys.get(half.node_id),
                                         text=half.text, body=half.body, request=half.request, host=half.host,
                                         path=f"$.halves[{i}]"))
            except PairRefusedError as exc:
                return Refusal(self.node_id, "half_unverified", exc.reason)
        return checked[0], checked[1]

    def rule(self, pair: Pair, *, tier: int, reanswer: Reanswer) -> Ruling | Refusal:
        """Rule on ``pair`` from the tier it was asked from, with its re-answer.

        Args:
            pair: the pair (as the comparing node holds it).
            tier: the tier this referee was chosen from (sealed into the statement).
            reanswer: its re-answer.

        Returns:
            The :class:`Ruling` it signed, or the :class:`Refusal` it gives.

        Raises:
            capseal.errors.SignerError: its signer failed while sealing.
        """
        answer = self._seal_answer(pair, reanswer)
        if type(tier) is not int or tier not in TIERS:
            return Refusal(self.node_id, "request_malformed", f"tier {tier!r} is not 1 or 2")
        named = [c.node_id for c in self.roster if c.announced_key is not None and c.kid == self.signer.kid]
        if named != [self.node_id]:
            return Refusal(self.node_id, "referee_unnamed", f"its key is announced by {named or 'no node'}")
        checked = self._checked_halves(pair)
        if isinstance(checked, Refusal):
            return checked
        a, b = checked
        if self.node_id in (a.facts.get("node_id"), b.facts.get("node_id"), a.node_id, b.node_id):
            return Refusal(self.node_id, "referee_not_independent")
        if not a.request_digest or a.request_digest != b.request_digest:
            return Refusal(self.node_id, "twins_differ_in_request")
        wa, wb = a.facts.get("weights_digest"), b.facts.get("weights_digest")
        because = None
        if not (wa and wa == wb):
            because = "weights_differ" if wa and wb else "weights_unknown"
            # still checked as halves (a forged one is refused), but never compared on weights
            a = dataclasses.replace(a, facts={k: v for k, v in a.facts.items() if k != "weights_digest"})
            b = dataclasses.replace(b, facts={k: v for k, v in b.facts.items() if k != "weights_digest"})
        try:
            outcome = adjudicate(a, b, None if because else (lambda: reanswer.text), self.node_id,
                                 unknown_weights="compare")
        except PairRefusedError as exc:
            return Refusal(self.node_id, "half_unverified", exc.reason)
        if outcome.no_verdict_reason == "not_comparable":
            because = "sampled"
        if because is not None:
            verdict = VERDICT_NOT_COMPARABLE
        elif outcome.verdict is None:
            return Refusal(self.node_id, "no_verdict", outcome.no_verdict_reason)
        else:
            verdict = outcome.verdict
        return self._sign(pair, (a, b), tier, verdict, because, outcome.divergence_index, outcome.prefix_digest,
                          reanswer, answer)

    def _sign(self, pair: Pair, halves: tuple[Half, Half], tier: int, verdict: str, because: str | None,
              divergence: int | None, prefix: str | None, reanswer: Reanswer, answer: Any) -> Ruling:
        a, b = halves
        weights = a.facts.get("weights_digest") if a.facts.get("weights_digest") == b.facts.get("weights_digest") else None
        now = self._clock()
        statement: dict[str, Any] = {
            "statement_version": STATEMENT_VERSION,
            "referee_node_id": self.node_id,
            "selection_tier": tier,
            "verdict": verdict,
            "twin_bracket_id": pair.twin_bracket_id,
            "request_digest": pair.request_digest,
            "halves": [{"node_id": h.node_id, "capsule_id": h.capsule_id} for h in (a, b)],
            "divergence_index": divergence,
            "prefix_digest": prefix,
            "answer_capsule_id": answer.capsule_id,
            "answer_digest": json_digest(reanswer.body),
            "capture_method": reanswer.capture_method,
            "model_hash": a.host.model_hash,
            "weights_digest": weights,
            "stated_at": now,
        }
        if because is not None:
            statement["not_comparable_because"] = because
        for half in halves:  # what the ruling cites resolves where it is sealed
            keep_record(self.ledger, half)
        store = JudgmentStore(self.ledger, self.signer)
        stated = store.put_json(statement, type=STATEMENT_TYPE)
        ruling_id = None
        if verdict != VERDICT_NOT_COMPARABLE:
            ruling_id = self._seal_adjudication(store, pair, halves, verdict, divergence, reanswer, answer, stated, now).digest
        return Ruling(self.node_id, tier, verdict, because, stated.digest, ruling_id, answer.capsule_id)

    def _seal_adjudication(self, store: JudgmentStore, pair: Pair, halves: tuple[Half, Half], verdict: str,
                           divergence: int | None, reanswer: Reanswer, answer: Any, stated: Target, now: str) -> Any:
        a, b = halves
        parties = [Target.of_capsule(h.capsule, type="twin-half") for h in halves]
        token, named = split_verdict(verdict)
        contradicted = None
        if named is not None:
            contradicted = next(t for t, h in zip(parties, halves) if h.facts.get("node_id") == named)
        prompt = store.put_json(reanswer.request, type="referee-request")
        pin: dict[str, Any] = {
            "model_id": a.host.model_hash or "unknown-model",
            "prompt_digest": DigestRef.of(prompt),
            "sampling": {"temperature": 0, "seed": reanswer.request.get("seed", 0)},
        }
        weights = a.facts.get("weights_digest")
        if isinstance(weights, str) and is_hex64(weights) and weights == b.facts.get("weights_digest"):
            # the digest both halves sign; its preimage (the weights) is not kept here
            pin["weights_digest"] = DigestRef(digest_alg="SHA-256", digest=weights)
        record = Adjudication.ruling(
            record_id=f"capseal-referee:{pair.pair_id}", adjudicated_at=now, verdict=token, basis=JudgePin(**pin),
            parties=parties, contradicted=contradicted, referee=stated,
            divergence_index=None if divergence is None else str(divergence))
        links = [Link.to("adjudicates", p) for p in parties] + [Link.to("cites", answer.capsule_id)]
        return store.seal(record, links=links)
