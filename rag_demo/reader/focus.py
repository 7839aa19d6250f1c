"""Which part of each retrieved passage the generator reads (`RagSettings.passage_sentences`).

Owns the choice, per passage, of the n sentences the stack's own
retriever finds closest to the question: the question encoder embeds the question, the passage
encoder embeds each sentence formatted as a passage ("title: sentence"), and the n best by inner
product are kept in passage order. This is step 2b of the pipeline, between retrieve and
generate. Retrieval scores, p(z|x) and the passages the UI shows are unchanged; only the text in
the generator's prompt is shorter (fewer distracting sentences for a small reader, and a shorter
prefill). A passage with n sentences or fewer is fed whole. Sentences are split by the rule
that cuts documents into passages (chunking.split_sentences).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from rag_demo.knowledge.corpus import Passage

from rag_demo.knowledge.chunking import split_sentences
from rag_demo.models.encoders import Encoder

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
