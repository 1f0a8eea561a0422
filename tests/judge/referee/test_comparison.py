"""C1–C4: words, the first split, the shared prefix, no threshold."""

from __future__ import annotations

import sys
import unicodedata

import pytest

from capseal.canonical import json_digest
from capseal.judge.referee import compare, token_at, words
from capseal.judge.referee.comparison import SEPARATORS


def test_C1_words_split_on_unicode_whitespace_and_the_four_separators() -> None:
    assert words(" a\tb\u00a0c\u001fd \n") == ["a", "b", "c", "d"]
    assert words("x\u001cy\u001dz\u001ew\u3000v\u2028u\u0085t") == ["x", "y", "z", "w", "v", "u", "t"]
    assert words("") == [] and words(" \t\n ") == []
    # a zero-width space and a BOM are not white space: they stay inside the word
    assert words("a\u200bb \ufeffc") == ["a\u200bb", "\ufeffc"]
    assert token_at("a b", 1) == "b" and token_at("a b", 2) is None


def test_C1_the_separator_set_is_unicode_white_space_plus_u001c_to_u001f() -> None:
    # Python's str.isspace() is White_Space plus U+001C-U+001F: the set written out agrees with it here
    spaces = {chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace()}
    assert spaces == set(SEPARATORS), (sorted(map(ord, spaces ^ set(SEPARATORS))), unicodedata.unidata_version)
    with pytest.raises(TypeError):
        words(None)  # type: ignore[arg-type]


def test_C2_same_iff_every_word_equal_else_the_first_split() -> None:
    assert compare("a b c", "a b c").same
    differ = compare("1, 2, 3, 4, 5", "1, 2, 3, 999 5")
    assert (differ.same, differ.shared, differ.divergence_index) == (False, 3, 3)
    assert compare("a b", "a b c").divergence_index == 2  # one answer stops early
    assert compare("a b c", "a b").divergence_index == 2
    assert compare("x", "y").divergence_index == 0


def test_C3_prefix_digest_is_the_digest_of_the_shared_words() -> None:
    assert compare("1, 2, 3, 4, 5", "1, 2, 3, 999 5").prefix_digest == json_digest({"prefix_tokens": ["1,", "2,", "3,"]})
    assert compare("a b", "a b").prefix_digest == json_digest({"prefix_tokens": ["a", "b"]})
    assert compare("x", "y").prefix_digest is None  # nothing shared
    assert compare("", " ").prefix_digest is None


def test_C4_no_threshold_a_late_word_an_early_stop_index_0_all_differ() -> None:
    long = " ".join(str(i) for i in range(1000))
    assert compare(long, long[:-1] + "x").divergence_index == 999  # one character of a thousand words
    assert not compare(long, long.rsplit(" ", 1)[0]).same  # stops one word early
    assert compare("yes it is", "no it is").divergence_index == 0


def test_C4_whitespace_only_differences_are_the_same() -> None:
    assert compare("1, 2, 3", "  1,\t2,\n\n3 \u00a0").same
    assert compare("a\u001fb", "a b").same
    assert compare("", "   ").same  # two empty answers
    assert not compare("", "a").same  # an empty answer against a non-empty one differs at 0
    assert compare("", "a").divergence_index == 0
