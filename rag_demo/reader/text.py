"""An answer's words as SQuAD compares them: the echo tests of the reader aids and eval's metrics
share this one normalisation, so an answer counted as an echo is one eval would count equal."""
from __future__ import annotations

import re
import string

_PUNCT = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(s: str) -> str:
    """SQuAD v1.1 normalisation: lowercase, delete punctuation, drop the articles a/an/the,
    collapse whitespace.

    >>> normalize_answer("The  Eiffel-Tower!")
    'eiffeltower'
    >>> normalize_answer("A Sunday Afternoon")
    'sunday afternoon'
    """
    s = "".join(ch for ch in s.lower() if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def match_tokens(text: str) -> list[str]:
    """Tokens for has_answer: lowercase, punctuation turned into spaces (not deleted), articles
    dropped, split on whitespace. Like DPR's tokenizer, which splits punctuation off, so
    "Seurat's" holds the token "seurat" (SQuAD's deletion would make it "seurats").

    >>> match_tokens("Georges Seurat's most famous work")
    ['georges', 'seurat', 's', 'most', 'famous', 'work']
    """
    s = "".join(" " if ch in _PUNCT else ch for ch in text.lower())
    return _ARTICLES.sub(" ", s).split()


def occurs_in(needle: str, text: str) -> bool:
    """Do `needle`'s match_tokens occur as a contiguous run of `text`'s (DPR's has_answer for one
    answer)? Token match, not substring: "1961" is not in "19612", nor "art" in "party".

    >>> occurs_in("Seurat", "Georges Seurat's work"), occurs_in("art", "a party")
    (True, False)
    """
    hay, want = match_tokens(text), match_tokens(needle)
    n = len(want)
    return n > 0 and any(hay[i : i + n] == want for i in range(len(hay) - n + 1))
