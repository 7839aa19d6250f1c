"""Which part of each retrieved passage the generator reads (`RagSettings.passage_sentences`).

Owns sentence splitting and the choice, per passage, of the n sentences the stack's own
retriever finds closest to the question: the question encoder embeds the question, the passage
encoder embeds each sentence formatted as a passage ("title: sentence"), and the n best by inner
product are kept in passage order. This is step 2b of the pipeline, between retrieve and
generate. Retrieval scores, p(z|x) and the passages the UI shows are unchanged; only the text in
the generator's prompt is shorter (fewer distracting sentences for a small reader, and a shorter
prefill). A passage with n sentences or fewer is fed whole.
"""
from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING

import numpy as np

from .corpus import Passage

if TYPE_CHECKING:  # annotations only: the UI imports split_sentences, and must not import torch
    from .encoders import Encoder

# A sentence ends at . ! or ? (optionally closed by a quote or bracket) followed by white space
# and a capital letter, digit, quote or bracket.
_BOUNDARY = re.compile(r"(?<=[.!?])[\"')\]]?\s+(?=[\"'(\[]?[A-Z0-9])")
# ...unless the word before the period is an initial or a short title ("J.", "U.S.", "St.", "Dr.").
_ABBREVIATION = re.compile(r"(?:\b[A-Z]|\b(?:[A-Z]\.)+[A-Z]|\b(?:St|Mr|Mrs|Ms|Dr|Jr|Sr|Mt|Ft|No|Co|Inc|Ltd|vs|c|ca)|\b[a-z])\.$")


def split_sentences(text: str) -> list[str]:
    """The sentences of `text`, each stripped; their concatenation with spaces is the text up to white space."""
    pieces: list[str] = []
    start = 0
    for m in _BOUNDARY.finditer(text):
        if _ABBREVIATION.search(text[start : m.start()]):
            continue  # "J. R. R. Tolkien", "St. Louis": not a sentence end
        pieces.append(text[start : m.start()].strip())
        start = m.end()
    pieces.append(text[start:].strip())
    return [p for p in pieces if p]


def closest_sentences(
    question_vec: np.ndarray, passages: list[Passage], encoder: Encoder, n: int
) -> list[list[int]]:
    """For each passage, the indices (ascending) of its n sentences with the highest
    q(x)·d(title: sentence), or all its sentences if it has n or fewer. question_vec: (D,)."""
    sentences = [split_sentences(p.text) for p in passages]
    todo = [(i, j) for i, sents in enumerate(sentences) if len(sents) > n for j in range(len(sents))]
    chosen = [list(range(len(s))) for s in sentences]
    if not todo:
        return chosen
    units = [Passage(id=f"{passages[i].id}~{j}", title=passages[i].title, text=sentences[i][j]) for i, j in todo]
    vecs = encoder.encode_passages(units, show_bar=False)  # (S, D) every sentence of the long passages
    sims = vecs @ question_vec  # (S,)
    by_passage: dict[int, list[tuple[float, int]]] = {}
    for (i, j), sim in zip(todo, sims.tolist()):
        by_passage.setdefault(i, []).append((sim, j))
    for i, scored in by_passage.items():
        best = sorted(scored, key=lambda t: (-t[0], t[1]))[:n]
        chosen[i] = sorted(j for _, j in best)
    return chosen


def focus_passages(
    question_vec: np.ndarray, passages: list[Passage], encoder: Encoder, n: int
) -> tuple[list[Passage], list[list[int]]]:
    """(the passages with only their n closest sentences as text, the sentence indices kept);
    n = 0 returns the passages unchanged with every sentence kept."""
    if n == 0:
        return list(passages), [list(range(len(split_sentences(p.text)))) for p in passages]
    chosen = closest_sentences(question_vec, passages, encoder, n)
    fed = []
    for p, keep in zip(passages, chosen):
        sents = split_sentences(p.text)
        fed.append(dataclasses.replace(p, text=" ".join(sents[j] for j in keep)) if len(keep) < len(sents) else p)
    return fed, chosen
