"""Training examples: a pair's question with the passages the retriever finds for it, and the
answer as one of them writes it.

The retriever finds each pair's passages exactly as it finds a visitor's (the question tower,
then inner products with the fixed index). A pair is kept only when a passage in its top `depth`
holds an answer (DPR's has_answer): the reader can then learn to read it, the question tower to
rank it. The target is that answer as the passage spells it ("the Beatles", not "The Beatles"),
so the generator learns to copy.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from rag_demo.questions import has_answer, passage_text
from rag_demo.splits import hash_fraction
from rag_demo.training.pairs import Pair


@dataclass
class Example:
    """One pair, retrieved: what a training step reads."""

    question: str
    target: str  # the answer as the first passage holding it writes it
    kind: str
    source: str
    qvec: np.ndarray  # (D,) the frozen encoder's question vector
    pool: list[int] = field(default_factory=list)  # passage rows, the frozen retriever's top `depth`
    hit: int = 0  # rank (1-based) of the first passage in the pool holding the answer

    def heldout(self, share: float) -> bool:
        """Whether this example is in the `share` of examples, by a hash of the question, that a run
        never trains on: its own held-out loss (as nanoGPT estimates a validation loss), and the
        retriever stage's choice of epoch. All of them are from the train split."""
        return hash_fraction("heldout|" + self.question) < share


def surface(answer: str, text: str) -> str:
    """`answer` as `text` writes it (case, accents kept), or `answer` where it is not there verbatim."""
    m = re.search(r"(?<!\w)" + re.escape(answer) + r"(?!\w)", text, flags=re.IGNORECASE)
    return m.group(0) if m else answer


def make_examples(pairs: list[Pair], encoder, index, depth: int, qmap=None) -> list[Example]:
    """The pairs whose top `depth` passages (the encoder's question vectors, through the question
    map `qmap` when given, searched in `index`) hold an answer, as Examples, in the pairs' order.
    Each keeps the encoder's own vector: the map is applied again at every training step."""
    if not pairs:
        return []
    qv = encoder.encode_questions([p.question for p in pairs])  # (N, D)
    searched = qv
    if qmap is not None:
        import torch

        with torch.no_grad():
            searched = qmap(torch.as_tensor(qv)).numpy()  # (N, D)
    _, rows = index.search_rows(searched, depth)  # (N, depth)
    out = []
    for pair, vec, row in zip(pairs, qv, rows):
        row = [int(r) for r in row]
        texts = [passage_text(index.corpus.passages[r]) for r in row]
        hit = next((i for i, t in enumerate(texts) if has_answer(t, pair.answers)), None)
        if hit is None:
            continue
        answer = next(a for a in pair.answers if has_answer(texts[hit], [a]))
        target = surface(answer, texts[hit]).strip().rstrip(".")
        out.append(Example(pair.question, target, pair.kind, pair.source, vec, row, hit + 1))
    return out


@dataclass
class Prepared:
    """One reader-stage example as token ids: what a training step reads, on any device, with no
    retriever or corpus at hand (the retrieval is fixed while the generator trains).

        prompts[z]  the paper preset's prompt of passage z, one of the retriever's top K    (K, S_z)
        prior[z]    log p(z|x) = log_softmax_z (c · q(x)·d(z)) over those K                  (K,)
        target      " {answer}." then the generator's end of turn                           (T,)"""

    question: str
    answer: str
    kind: str
    source: str
    prompts: list[list[int]]
    prior: list[float]
    target: list[int]

    def heldout(self, share: float) -> bool:
        return hash_fraction("heldout|" + self.question) < share


def target_ids(tokenizer, answer: str, end_of_turn: int) -> list[int]:
    """The tokens a trained generator should write after the short-answer cue: the answer as a
    phrase with its full stop, then the end of its turn, so it learns where an answer ends
    (a year's "1948." is no stop by itself: models/stopping.StopRule)."""
    return tokenizer.encode(f" {answer.strip().rstrip('.')}.", add_special_tokens=False) + [int(end_of_turn)]


def prepare(examples: list[Example], gen, passages, embeddings: np.ndarray, k: int, scale: float,
            end_of_turn: int, qmap=None) -> list[Prepared]:
    """Each example's top k passages (its pool, as the retriever ranked them) as the paper preset's
    prompts, the doc prior over them, and the target's ids ending with `end_of_turn`."""
    from rag_demo.config import Decoding, ReaderAids
    from rag_demo.reader.reading import prompt

    out = []
    for ex in examples:
        q = np.asarray(ex.qvec, dtype=np.float32)  # (D,)
        if qmap is not None:
            import torch

            with torch.no_grad():
                q = qmap(torch.as_tensor(q)).numpy()  # (D,)
        rows = ex.pool[:k]
        s = scale * (np.asarray(embeddings[rows], dtype=np.float32) @ q)  # (K,)
        prior = s - (s.max() + np.log(np.exp(s - s.max()).sum()))  # (K,) log_softmax
        prompts = [list(prompt(gen, ex.question, passages[int(r)], Decoding(), ReaderAids())) for r in rows]
        out.append(Prepared(ex.question, ex.target, ex.kind, ex.source, prompts, [float(x) for x in prior],
                            target_ids(gen.tokenizer, ex.target, end_of_turn)))
    return out
