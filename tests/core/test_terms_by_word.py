"""Terms are read word by word through a cache of words as written (``terms._term``): the same as reading each word afresh."""

from __future__ import annotations

import math
import re
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from pcp_core.text.terms import MONTHS, STOPWORDS, TermStats, words_of

_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_'.\-/:]*[A-Za-z0-9]|[A-Za-z0-9]")


def words_afresh(text: str) -> tuple[str, ...]:
    """``words_of`` as it read every word before the cache."""
    out = []
    for word in _WORD.findall(text):
        word = word.lower().removesuffix("'s").strip(".'-/:")
        if "'" in word:
            continue
        if len(word) > 1 and word not in STOPWORDS or word.isdigit():
            out.append(word)
    return tuple(out)


def weights_afresh(stats: TermStats, text: str) -> dict[str, float]:
    originals = {w.lower().removesuffix("'s").strip(".'-/:"): w for w in _WORD.findall(text)}

    def boost(term: str, original: str) -> float:
        if any(ch.isdigit() for ch in term) or term in MONTHS:
            return 2.0
        if original[:1].isupper() or any(ch in term for ch in "_./-"):
            return 1.5
        return 1.0

    counts = Counter(words_afresh(text))
    return {t: (1 + math.log(c)) * stats.idf(t) * boost(t, originals.get(t, t)) for t, c in counts.items()}


PIECES = ["The", "the", "Caroline's", "i'd", "you've", "May", "may", "3", "10:30", "a.b", "x_y", "-/", "Don't", "LGBTQ", "it's", "'s", "o", "0"]
texts = st.lists(st.one_of(st.sampled_from(PIECES), st.text(alphabet="aBz09_'.-/: \n", max_size=12)), max_size=40).map(" ".join)


@settings(max_examples=300, deadline=None)
@given(texts, texts)
def test_terms_and_weights_are_those_of_each_word_read_afresh(text, other):
    assert words_of(text) == words_afresh(text)
    stats = TermStats([text, other, "the support group met on 8 May"])
    assert stats.weights(text) == weights_afresh(stats, text)
    assert list(stats.weights(other)) == list(weights_afresh(stats, other))  # the same order of terms
