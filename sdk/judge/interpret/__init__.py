"""capseal.judge.interpret — reading verdicts: what a stored verdict means, read-only.

A stored verdict says what happened, not what it means. The rules for reading
it belong to the library that wrote it, so capseal reads every judgment it
writes (judge-family records, Evidence Results, ``x-judgment-v1`` capsules,
referee book rows, the mesh verdict record) and stored jury verdict maps of any
age into one shape:

>>> from capseal.judge import interpret, summarise, tally   # doctest: +SKIP
>>> i = interpret(stored_verdict)                           # doctest: +SKIP
>>> i.reading, i.reading_support, i.decided_by              # doctest: +SKIP
('REJECTED', 'SUPPORTED', None)
>>> i.to_json()["readingSupport"]                           # doctest: +SKIP
'SUPPORTED'

``interpret`` reads; it never rewrites the value and never raises. ``read``
also gives the value's *items* (one per verdict about one subject: a case, a
claim, a party), which is what a consumer counts; :func:`tally` is one such
consumer's policy, never a figure capseal itself reports.

Public modules: ``model`` (the Interpretation and its JSON); ``jury`` (stored
jury verdicts) with ``jury_nodes`` (one node), ``jury_stages`` (attempts and
sub-verdicts), ``jury_decision`` (``decidedBy``) and ``jury_support`` (whether
the facts back the reading); ``records`` / ``results`` / ``capsules`` /
``referee_rows`` (capseal's records), ``parts`` (records and their items),
``reading`` (the reading and support rules), ``defects``, ``summary`` (the
prose), ``tally`` (counting), ``dispatch`` (the entry points), ``sources``
(ledgers and files), ``values`` (JSON values of any kind), ``vocab`` (the
tokens the reader knows).
"""

from .dispatch import JURY_VERDICT_ARTIFACT, Item, Reading, interpret, read
from .model import (
    DEFECT_KINDS,
    READINGS,
    SCHEMA_VERSION,
    SUPPORTS,
    Check,
    DecidedBy,
    Defect,
    Evidence,
    Interpretation,
    JudgeSeat,
    ScoreScale,
    Stage,
)
from .sources import Source, SourceRecord, read_source, reexport
from .summary import summarise
from .tally import Tally, pass_rate, tally

__all__ = [
    "interpret", "read", "Reading", "Item", "summarise", "tally", "pass_rate", "Tally", "reexport",
    "read_source", "Source", "SourceRecord", "JURY_VERDICT_ARTIFACT",
    "Interpretation", "Stage", "JudgeSeat", "Check", "ScoreScale", "Evidence", "DecidedBy", "Defect",
    "SCHEMA_VERSION", "READINGS", "SUPPORTS", "DEFECT_KINDS",
]
