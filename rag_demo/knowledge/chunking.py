"""Passages from documents: sentences split as a reader would (initials and abbreviations do not
end one), packed into passages of about 100 words (the paper's DPR passages), never cutting a
sentence unless it alone is longer.
"""

from __future__ import annotations

import logging
import math
import re

from rag_demo.models.abbreviations import NOT_SENTENCE_ENDS

log = logging.getLogger(__name__)

_SENTENCE_END = re.compile(r"[.!?][\"')\]’”]*$")
_SENTENCE_START = re.compile(r"^[\"'(\[‘“]?[A-Z0-9]")


def normalise(text: str) -> str:
    return " ".join(text.split())


def _ends_sentence(word: str, next_word: str) -> bool:
    if not _SENTENCE_END.search(word) or not _SENTENCE_START.match(next_word):
        return False
    initial = len(word) == 2 and word[0].isupper()  # "Arthur C. Clarke"
    return not initial and word.lower() not in NOT_SENTENCE_ENDS


def split_sentences(text: str) -> list[str]:
    """The sentences of `text` (white space normalised), by the same rule that cuts passages:
    a word ending in . ! or ? followed by a capitalised word, not an initial or abbreviation."""
    return [" ".join(s) for s in sentence_words(text.split(), max_words=len(text) + 1)]


def sentence_words(words: list[str], max_words: int) -> list[list[str]]:
    """Word lists of sentences; a sentence over max_words is cut into near-equal pieces."""
    sentences, start = [], 0
    for i in range(len(words)):
        if i == len(words) - 1 or _ends_sentence(words[i], words[i + 1]):
            sentences.append(words[start : i + 1])
            start = i + 1
    pieces = []
    for s in sentences:
        n = math.ceil(len(s) / max_words)
        bounds = [round(j * len(s) / n) for j in range(n + 1)]
        pieces += [s[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    return pieces


def pack(sentences: list[list[str]], words: int) -> list[list[str]]:
    """Greedy packing into chunks of <= words words; a chunk under the minimum takes the next sentence anyway."""
    min_words = max(1, words * 3 // 10)
    chunks: list[list[str]] = []
    for s in sentences:
        if chunks and (len(chunks[-1]) + len(s) <= words or len(chunks[-1]) < min_words):
            chunks[-1] = chunks[-1] + s
        else:
            chunks.append(list(s))
    if len(chunks) > 1 and len(chunks[-1]) < min_words:  # no tiny trailing chunk
        tail = chunks.pop()
        chunks[-1] += tail
    return chunks
