"""``summary``: deterministic prose from an Interpretation's fields and nothing else.

No model, no clock, no stored record: the same fields give the same text. Its
contract is agreement with the fields: every name it mentions (in single
quotes), every reason code (in square brackets after a space), every status
(as its phrase: ``pass`` "passed", ``met`` "was met", an unknown token
"recorded status <token>"), the reading and the support value are in the
fields, and every one in the fields is mentioned. Recorded reasoning is quoted
verbatim in parentheses.

A recorded value that could be mistaken for one of those marks (a name holding
a quote, a policy spelled ``passed``, a reason holding a bracket) is shown as a
JSON string literal whose quotes, parentheses and brackets, and the first
letter of any word the summary reserves, are ``\\u`` escapes: :func:`shown`.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterable

from .model import DecidedBy, Evidence, Interpretation, JudgeSeat, Stage
from .vocab import PHRASES, UNKNOWN_STATUS_PHRASE

__all__ = ["summarise", "shown", "shown_reasoning", "status_phrase", "RESERVED_WORDS"]

READING_GLOSS = {
    "ACCEPTED": "the subject was judged and accepted",
    "REJECTED": "the subject was judged and rejected",
    "UNDECIDED": "the subject was judged and the jury could not decide; not an instrument failure",
    "NOT_APPLICABLE": "the criteria did not apply to the subject",
    "NOT_ASSESSED": "the instrument did not reach an assessment of the subject",
}
SUPPORT_GLOSS = {
    "SUPPORTED": "the recorded facts agree with the reading",
    "CONTRADICTED": "a recorded fact contradicts the reading; see the INCONSISTENT defect(s)",
    "UNDETERMINED": "the facts needed to check the reading are absent or their rule is not closed-form",
}

#: words and phrases the summary uses as marks; a recorded value holding one is escaped
RESERVED_WORDS = (*sorted(set(PHRASES.values()), key=len, reverse=True), UNKNOWN_STATUS_PHRASE,
                  *READING_GLOSS, *SUPPORT_GLOSS)
_RESERVED = re.compile(r"(?<!\w)(?:" + "|".join(re.escape(w) for w in RESERVED_WORDS) + r")(?!\w)")
_PLAIN = re.compile(r"[\w.:/@#+=-]+(?: [\w.:/@#+=-]+)*")
_PLAIN_PATH = re.compile(r"[\w.:/@#+=\[\]-]+")
_ESCAPE = {"'": "\\u0027", "(": "\\u0028", ")": "\\u0029", "[": "\\u005b", "]": "\\u005d"}


def _literal(text: str) -> str:
    out = json.dumps(text, ensure_ascii=True)
    out = "".join(_ESCAPE.get(ch, ch) for ch in out)
    return _RESERVED.sub(lambda m: f"\\u{ord(m.group(0)[0]):04x}{m.group(0)[1:]}", out)


def shown(text: str, *, path: bool = False) -> str:
    """A recorded value as the summary writes it: unchanged when it is plain
    (empty, or word characters and ``. : / @ # + = -`` with single spaces
    between; a defect path also brackets, no spaces) and holds no reserved word; otherwise a JSON
    string literal with its quotes, parentheses, brackets and reserved words
    escaped, which ``json.loads`` reads back to the value.

    Args:
        text: the recorded value.
        path: whether it is a defect path (brackets allowed, no spaces).

    Returns:
        The value as the summary writes it.
    """
    if not text or (_PLAIN_PATH if path else _PLAIN).fullmatch(text) and not _RESERVED.search(text):
        return text
    return _literal(text)


def _balanced(text: str) -> bool:
    depth = 0
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                return False
    return depth == 0


def shown_reasoning(text: str) -> str:
    """Recorded reasoning as the summary quotes it: verbatim, unless it holds a
    single quote, a control or unpaired surrogate character, or unbalanced
    parentheses (then as :func:`shown`'s literal).

    Args:
        text: recorded reasoning.

    Returns:
        The reasoning as the summary quotes it.
    """
    if "'" not in text and _balanced(text) and not any(unicodedata.category(ch) in ("Cc", "Cs") for ch in text):
        return text
    return _literal(text)


def status_phrase(status: str) -> str:
    """How the summary says one recorded status.

    Args:
        status: a recorded status.

    Returns:
        Its phrase.
    """
    return PHRASES.get(status) or f"{UNKNOWN_STATUS_PHRASE} {shown(status)}"


def _quoted(name: str) -> str:
    return f"'{shown(name)}'"


def _ref(path: Iterable[str], stage: str | None = None) -> str:
    segments = list(path)
    if not segments:
        return _quoted(stage) if stage is not None else "an unnamed stage"
    return " > ".join(_quoted(s) for s in segments)


def _outcome(status: str | None, code: str | None, reasoning: str | None) -> str:
    if status is None:  # no reasoning is quoted for an unreadable status; a recorded code is still named
        return "records no readable status" + (f" [{shown(code)}]" if code is not None else "")
    text = status_phrase(status)
    if code is not None:
        text += f" [{shown(code)}]"
    if reasoning:
        text += f" ({shown_reasoning(reasoning)})"
    return text


def _judges(judges: tuple[JudgeSeat, ...]) -> str:
    if not judges:
        return " with no seated judge"
    return "; its judges: " + "; ".join(f"{_quoted(j.name)} {_outcome(j.status, j.reason_code, j.reasoning)}" for j in judges)


def _evidence(e: Evidence | None) -> list[str]:
    if e is None:
        return []
    strategy = e.get("strategy")
    parts = [shown(strategy) if strategy is not None else "an unnamed strategy"]
    for key, label in (("errorPolicy", "errors"), ("notApplicablePolicy", "exclusions")):
        if e.get(key) is not None:
            parts.append(f"{label} {shown(e.get(key))}")
    if e.get("threshold") is not None:
        parts.append(f"threshold {e.get('threshold')!r}")
    for key, label in (("inputCount", "in"), ("eligibleCount", "eligible"), ("passCount", "pass"), ("failCount", "fail"),
                       ("errorCount", "error(s)"), ("notApplicableCount", "not applicable"),
                       ("explicitAbstainCount", "explicit abstention(s)")):
        if e.get(key) is not None:
            parts.append(f"{e.get(key)} {label}")
    causes = e.get("errorCodeCounts")
    if causes:
        parts.append("causes " + " ".join(f"{shown(code)}={n}" for code, n in causes))
    return [f"Evidence: {', '.join(parts)}."]


def _facts(s: Stage) -> str:
    facts = [shown(x) for x in (s.relation, s.policy) if x is not None]
    if s.used_by_parent is True:
        facts.append("used")
    elif s.used_by_parent is False:
        facts.append(f"not used: {shown(s.reason)}" if s.reason is not None else "not used")
    elif s.disposition is not None:
        facts.append(f"disposition {shown(s.disposition)}")
    elif s.relation is not None or s.policy is not None:
        facts.append("use unrecorded")
    if s.failure is not None:
        facts.append(f"no verdict: {shown(s.failure)}")
    return f" ({', '.join(facts)})" if facts else ""


def _stage_sentence(s: Stage) -> str:
    ref = _ref(s.path, s.stage)
    subject = ref[0].upper() + ref[1:]
    if s.status is None and s.reason_code is None:
        if s.failure is not None:
            return f"{subject} entered and produced no verdict; its failure is {shown(s.failure)}."
        if not s.reasoning and not s.judges:
            return f"{subject} produced no verdict."
    return f"{subject} {_outcome(s.status, s.reason_code, s.reasoning)}{_judges(s.judges)}."


def _decided(i: Interpretation, capseal: bool) -> str:
    d: DecidedBy | None = i.decided_by
    if d is not None:
        where = " > ".join(_quoted(p) for p in d.path) if d.path else _quoted(d.stage)
        if d.basis == "tier_outcome":
            return f"The root adopted the outcome of {where} (tier_outcome)."
        if d.basis == "individual_rejection":
            return f"The root stopped on an individual rejection established in {where} (individual_rejection)."
        return f"The decision of the root names {where} with basis {shown(d.basis)}."
    if capseal:
        return "The record names no deciding stage."
    if any((x.path == "verdict" and x.field == "decision") or x.path == "verdict.decision" for x in i.defects):
        return "Which stage decided is not recorded and has not been inferred."
    return "The root's own reduction decided; no stage is named."


def summarise(i: Interpretation) -> str:
    """The summary of an interpretation, from its fields alone (its own ``summary`` is ignored).

    Args:
        i: an interpretation.

    Returns:
        The summary text.
    """
    capseal = i.root.stage is not None
    out: list[str] = []
    n = len(i.root.judges)
    unit = "part(s) recorded" if capseal else "stage(s) ran"
    if not i.stages:
        none = "No part is recorded" if capseal else "No composite stage ran"
        out.append(f"{none}, and the root seats no judge." if n == 0 else f"{none}; the root seated {n} judge(s) directly.")
    else:
        out.append(f"{len(i.stages)} {unit}: " + ", ".join(_ref(s.path, s.stage) + _facts(s) for s in i.stages) + ".")
    for s in i.stages:
        out.append(_stage_sentence(s))
        out.extend(_evidence(s.evidence))
    root = "The root" + (f" {_ref(i.root.path)}" if i.root.path else "")
    out.append(f"{root} {_outcome(i.root.status, i.root.reason_code, i.root.reasoning)}{_judges(i.root.judges)}.")
    out.extend(_evidence(i.root.evidence))
    if capseal and i.stages and i.root.status is None and i.reading is not None:
        out.append("The reading is taken across the recorded parts: a rejected part outranks the rest, then an unreadable "
                   "part, then an instrument failure, then an undecided part.")
    out.append(_decided(i, capseal))
    if i.reading is not None:
        out.append(f"Reading: {i.reading} \u2014 {READING_GLOSS.get(i.reading, '')}.")
    elif capseal:
        out.append("Reading: none; the record gives no reading of a subject.")
    else:
        out.append("Reading: none; the root records no readable status.")
    out.append(f"Support: {i.reading_support} \u2014 {SUPPORT_GLOSS.get(i.reading_support, '')}.")
    if capseal:
        form = _quoted(i.root.stage or "")
        out.append(f"Source: the capseal record form {form} (sourceVersion {i.source_version})." if i.source_version
                   else f"Source: the capseal record form {form}, with no version stamp read (sourceVersion 0).")
    elif i.source_version == 1:
        out.append("Source: the seven-component form 0.17 writes (sourceVersion 1).")
    else:
        out.append(f"Source: an unstamped record written before 0.17 (sourceVersion {i.source_version}).")
    if not i.defects:
        out.append("Defects: none.")
    else:
        listed = "; ".join(f"{shown(f'{x.path}.{x.field}', path=True)} {x.kind}" for x in i.defects)
        out.append(f"{len(i.defects)} defect(s): {listed}.")
    return " ".join(out)
