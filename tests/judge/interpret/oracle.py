"""The summary's agreement oracle: what the summary mentions equals what the fields hold.

Both directions, for names (in single quotes), reason codes (``[code]`` after
whitespace), statuses (as their phrase), the reading and the support value.
Recorded reasoning is stripped first (it is quoted verbatim in parentheses).
The phrase table is this test's own copy: the oracle for the generator's. A
recorded value the summary had to escape is compared in its escaped form
(``shown``), which tests/judge/interpret/test_summary.py checks separately.
"""

from __future__ import annotations

import re

from capseal.judge.interpret import Interpretation
from capseal.judge.interpret.model import READINGS, SUPPORTS
from capseal.judge.interpret.summary import shown, shown_reasoning

QUOTED = re.compile(r"'([^']*)'")
BRACKETED = re.compile(r"(?<=\s)\[([a-z_]+)]")
PHRASES = {
    "pass": "passed", "fail": "failed", "abstain": "abstained", "not_applicable": "was not applicable", "error": "errored",
    "met": "was met", "not_met": "was not met", "not_evaluable": "was not evaluable", "corroborated": "was corroborated",
    "contradicted": "was contradicted", "inconclusive": "was inconclusive", "not_comparable": "was not comparable",
    "not_adjudicated": "was not adjudicated",
}


def mentions(text: str, phrase: str) -> bool:
    return re.search(r"(?<!\w)" + re.escape(phrase) + r"(?!\w)", text) is not None


def disagreements(i: Interpretation) -> list[str]:
    """Every way the summary and the fields disagree (empty: they agree)."""
    stages = [i.root, *i.stages]
    reasons = {s.reasoning for s in stages if s.reasoning} | {j.reasoning for s in stages for j in s.judges if j.reasoning}
    text = i.summary
    for reason in sorted(reasons, key=len, reverse=True):
        text = text.replace(f" ({shown_reasoning(reason)})", "")
    names: set[str] = set()
    statuses: set[str] = set()
    codes: set[str] = set()
    for s in stages:
        if s.stage is not None:
            names.add(shown(s.stage))
        names |= {shown(p) for p in s.path}
        if s.status is not None:
            statuses.add(s.status)
        if s.reason_code is not None:
            codes.add(shown(s.reason_code))
        for j in s.judges:
            names.add(shown(j.name))
            if j.status is not None:
                statuses.add(j.status)
            if j.reason_code is not None:
                codes.add(shown(j.reason_code))
    if i.decided_by is not None:
        names.add(shown(i.decided_by.stage))
        names |= {shown(p) for p in i.decided_by.path}
    out: list[str] = []
    mentioned = set(QUOTED.findall(text))
    if mentioned != names:
        out.append(f"names: mentioned {sorted(mentioned - names)} not in the fields; {sorted(names - mentioned)} not mentioned")
    bracketed = set(BRACKETED.findall(text))
    expected = {c for c in codes if re.fullmatch(r"[a-z_]+", c)}
    if bracketed != expected:
        out.append(f"codes: mentioned {sorted(bracketed - expected)} not in the fields; {sorted(expected - bracketed)} not mentioned")
    out += [f"code {c} not mentioned" for c in codes if f" [{c}]" not in text]
    for token, phrase in PHRASES.items():
        if mentions(text, phrase) != (token in statuses):
            out.append(f"status {token}: phrase {'mentioned' if token in statuses else 'absent'} in the fields, not in the text")
    for token in statuses - set(PHRASES):
        if not mentions(text, f"recorded status {shown(token)}"):
            out.append(f"unknown status {token!r} not mentioned")
    for reading in READINGS:
        if mentions(text, reading) != (reading == i.reading):
            out.append(f"reading {reading}: mentioned iff it is the reading ({i.reading})")
    for support in SUPPORTS:
        if mentions(text, support) != (support == i.reading_support):
            out.append(f"support {support}: mentioned iff it is the support ({i.reading_support})")
    return out
