"""Comparing two answers word by word (C1–C4). Pure functions, no threshold.

* C1 — the words of a text are what is left between separators: Unicode white
  space (the ``White_Space`` property) and the four ASCII information
  separators U+001C–U+001F; empty words are dropped.
* C2 — ``shared`` is the number of equal leading words; the answers are the
  same iff ``shared`` equals both lengths, else they split at
  ``divergence_index = shared``.
* C3 — ``prefix_digest`` is the JSON digest of ``{"prefix_tokens": [the shared
  words]}``, given only when ``shared > 0``.
* C4 — there is no similarity threshold: a late word, an early stop and a split
  at index 0 all differ; whitespace-only differences are the same.

The separator set is written out rather than taken from ``str.split()`` so the
comparison does not move with the Unicode tables of the Python that runs it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from capseal.canonical import json_digest

__all__ = ["SEPARATORS", "words", "token_at", "Comparison", "compare", "prefix_digest"]

#: Unicode White_Space (PropList.txt) plus U+001C–U+001F
SEPARATORS = frozenset(
    "\t\n\v\f\r \x85\xa0\u1680"
    "\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
    "\x1c\x1d\x1e\x1f"
)
_SPLIT = re.compile("[" + re.escape("".join(sorted(SEPARATORS))) + "]+")


def words(text: str) -> list[str]:
    """The words of ``text`` (C1).

    Args:
        text: an answer text.

    Returns:
        Its words in order, none empty.

    Raises:
        TypeError: ``text`` is not a str.
    """
    if not isinstance(text, str):
        raise TypeError(f"words() takes an answer text (str), not {type(text).__name__}")
    return [w for w in _SPLIT.split(text) if w]


def token_at(text: str, index: int) -> str | None:
    """The word at ``index`` of ``text``; None past its end.

    Args:
        text: an answer text.
        index: a word position (0-based, not negative).

    Returns:
        The word, or None.

    Raises:
        TypeError: ``text`` is not a str.
    """
    found = words(text)
    return found[index] if 0 <= index < len(found) else None


def prefix_digest(shared: list[str]) -> str | None:
    """C3: the digest of the shared words.

    Args:
        shared: the words both answers start with.

    Returns:
        The JSON digest of ``{"prefix_tokens": shared}``; None for no shared word.
    """
    return json_digest({"prefix_tokens": list(shared)}) if shared else None


@dataclass(frozen=True)
class Comparison:
    """Where two answers first differ and what they share before it."""

    same: bool
    shared: int
    #: the first word at which they differ; None when the words are the same
    divergence_index: int | None
    prefix_digest: str | None


def compare(text_a: str, text_b: str) -> Comparison:
    """Compare two answers word by word (C2–C4).

    Args:
        text_a: one twin's answer.
        text_b: the other twin's answer.

    Returns:
        A :class:`Comparison`: ``same`` iff every word is equal and neither
        answer has a word more.

    Raises:
        TypeError: either text is not a str.
    """
    a, b = words(text_a), words(text_b)
    shared = 0
    for x, y in zip(a, b):
        if x != y:
            break
        shared += 1
    same = shared == len(a) == len(b)
    return Comparison(same=same, shared=shared, divergence_index=None if same else shared,
                      prefix_digest=prefix_digest(a[:shared]))
