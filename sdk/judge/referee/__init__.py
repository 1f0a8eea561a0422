"""capseal.judge.referee — twins and a referee.

Two serving nodes answered one request; each sealed its own half (its own key,
any backend) with the answer's digest in it, and the host marked the two as
one pair (``twin_bracket_id``). The comparing node holds both halves. It asks
whether the twins agree and, when they do not, asks one independent third
node to re-answer and sign a ruling — or is told plainly why no ruling was
made: every case without one is a ``not_adjudicated`` row with its reason,
0 calls, counted against nobody. The switch is **off by default**.

>>> from capseal.judge.referee import Book, Referee, Settings, load_half, make_pair  # doctest: +SKIP
>>> pair = make_pair("bracket-1", request_digest, [load_half(rec_a, node_id="node-a", announced=pem_a, text=a),
...                                                load_half(rec_b, node_id="node-b", announced=pem_b, text=b)])  # doctest: +SKIP
>>> referee = Referee(Book(ledger, signer), roster=roster, settings=Settings(adjudicate_differing_twins=True),
...                   transport=HTTPTransport("http://127.0.0.1:9337"), seats={"node-c": seat})  # doctest: +SKIP
>>> referee.consider(pair).to_json()                                                           # doctest: +SKIP
{'counts_against': 'node-b', 'referee_calls': 1, 'row': {...}}

Modules, one job each:

* ``vocab`` — rows, reasons, verdicts, record types: ``not_adjudicated``,
  ``adjudicated``, ``counts_against``.
* ``comparison`` (C1–C4) — ``words``, ``token_at``, ``compare``,
  ``Comparison``, ``prefix_digest``.
* ``halves`` (V1, V2) — ``Half``, ``HostView``, ``load_half``, ``seal_half``,
  ``answer_text``, ``sampled_on_request``, ``sampled_on_ruling``.
* ``pairs`` (P1) — ``Pair``, ``make_pair``, ``pair_id_of``.
* ``gates`` (G1–G7) — ``Settings``, ``before_asking``.
* ``book`` (P2–P6) — ``Book``, ``BookRow``, ``HeldHalf``; ``verify_entry``
  is the ``capseal verify`` hook for ``referee:`` records.
* ``bar`` (B1–B5) and ``selection`` (S1–S3) — ``Recorded``, ``barred``,
  ``corroborated``, ``Candidate``, ``select``, ``Selection``, ``UniformDraw``,
  ``ScriptedDraw``.
* ``verdict`` (V1–V8) — ``adjudicate``, ``referee_verdict``, ``Outcome``.
* ``ruling`` and ``check`` (S4) — ``RefereeSeat``, ``Ruling``, ``Refusal``,
  ``verify_ruling``, ``RulingReport``.
* ``transports`` — ``Reanswer``, ``ReplayTransport``, ``HTTPTransport``,
  ``reanswer_request``.
* ``mesh`` — ``read_mesh_verdict``, ``to_adjudication``.
* ``counting`` — ``counted_rulings``, ``tally``, ``Tally``, ``StopRouting``.
* ``facade`` — ``Referee``, ``RuleAnswer``; ``case`` — ``load_case``,
  ``read_case``, ``run_case`` (what ``capseal referee rule`` runs).

Book rows are ledger records of type ``referee:book-row`` (``producer_claim``)
whose body carries the ``row`` exactly as the rules write it; see ``book``.
"""

from .bar import Recorded, barred, corroborated
from .book import Book, BookRow, HeldHalf
from .case import Case, load_case, read_case, run_case
from .check import RulingReport, verify_ruling
from .comparison import Comparison, compare, prefix_digest, token_at, words
from .counting import Counted, StopRouting, Tally, counted_rulings, tally
from .facade import Referee, RuleAnswer
from .gates import Settings, before_asking
from .halves import Half, HostView, answer_text, load_half, sampled_on_request, sampled_on_ruling, seal_half
from .mesh import MeshVerdict, read_mesh_verdict, to_adjudication
from .pairs import Pair, make_pair, pair_id_of
from .ruling import RefereeSeat, Refusal, Ruling
from .selection import Candidate, ScriptedDraw, Selection, UniformDraw, select
from .transports import HTTPTransport, Reanswer, ReplayTransport, reanswer_request
from .verdict import Outcome, adjudicate, referee_verdict
from .vocab import adjudicated, counts_against, not_adjudicated

__all__ = [
    "words", "token_at", "compare", "Comparison", "prefix_digest",
    "Half", "HostView", "load_half", "seal_half", "answer_text", "sampled_on_request", "sampled_on_ruling",
    "Pair", "make_pair", "pair_id_of", "Settings", "before_asking",
    "Book", "BookRow", "HeldHalf",
    "Recorded", "barred", "corroborated", "Candidate", "select", "Selection", "UniformDraw", "ScriptedDraw",
    "adjudicate", "referee_verdict", "Outcome", "RefereeSeat", "Ruling", "Refusal", "verify_ruling", "RulingReport",
    "Reanswer", "ReplayTransport", "HTTPTransport", "reanswer_request",
    "read_mesh_verdict", "to_adjudication", "MeshVerdict",
    "counted_rulings", "tally", "Tally", "Counted", "StopRouting",
    "Referee", "RuleAnswer", "Case", "load_case", "read_case", "run_case",
    "not_adjudicated", "adjudicated", "counts_against",
]
