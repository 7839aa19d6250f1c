"""Retrievers: which K passages a question reads, and their scores q(x)·d(z) (docs/DESIGN.md §6b).

Owns the two retrievers a pipeline may hold, each with `search(question, qv, k)` -> (scores (k,),
passages), `scores(qv, passages)`, a `label` every Answer carries, a `status` for the page's status
line (None: nothing to say), and `index` (what the rest of the app reads the corpus from):

- `DenseRetriever`: the paper's, the top K of the dense index by inner product;
- `BM25WhileBuilding`: while the dense index is built in the background (knowledge/building.py),
  BM25's top K, scored by the dense encoders; its `index` is a `PendingIndex`, the corpus without
  the vectors.

RagPipeline holds one and swaps in the dense one, in one assignment, when the build completes;
a question keeps the retriever it started with. The `retriever` setting picks among three over
the dense one (`choose`): itself, `BM25Only` (BM25's top K) and `Hybrid` (both lists fused by
reciprocal rank); the last two score their passages with the dense encoders too, so p(z|x) means
the same whichever retriever picked the passages (docs/DESIGN.md §6c).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from rag_demo.knowledge.bm25 import BM25Retriever
from rag_demo.knowledge.building import IndexBuild
from rag_demo.knowledge.corpus import Passage
from rag_demo.knowledge.index import PassageIndex

DENSE = "dense"
RETRIEVERS = ("dense", "bm25", "hybrid")  # the `retriever` setting's values (config.Decoding)
# Reciprocal rank fusion (Cormack, Clarke and Büttcher, SIGIR 2009): score(d) = Σ_r 1 / (c + rank_r(d)),
# c = 60 as in that paper; each list is read to FUSE_DEPTH, so the fused top K is the same prefix for every K.
RRF_C = 60
FUSE_DEPTH = 100


class DenseRetriever:
    """The top K passages of a dense index by inner product q(x)·d(z), the paper's retriever."""

    label = DENSE
    status = None  # nothing for the status line: this is the retriever the page is about

    def __init__(self, index: PassageIndex) -> None:
        self.index = index

    def search(self, question: str, qv: np.ndarray, k: int) -> tuple[np.ndarray, list[Passage]]:
        """Scores (k,) and passages, best first, for one question vector qv (1, D)."""
        scores, passages = self.index.search(qv, k)  # (1, k)
        return scores[0], passages[0]

    def scores(self, qv: np.ndarray, passages: list[Passage]) -> np.ndarray:
        """q(x)·d(z) (K,) of given passages of this index, as `search` would score them."""
        rows = [self.index.corpus.position(p.id) for p in passages]
        return (self.index.vectors(rows) @ qv[0]).astype(np.float32)  # (K,)


class BM25WhileBuilding:
    """While the dense index is built: BM25 picks the K passages, the dense encoders score them.

    p(z|x) comes from q(x)·d(z), the dense scores, over BM25's K passages, not from BM25's own
    scores: a softmax needs a scale, and BM25's scores have none that holds across questions and
    corpora (they grow with the question's length and its words' rarity), while the dense scores
    are the ones every other answer uses, so the prior temperature, the "may not hold the answer"
    cue and "answer without a passage" keep their meaning, and it is how `eval --retrievers bm25`
    scores BM25's passages, so that eval measures what the app serves meanwhile. d(z) is the
    finished index's own vector where the build has done that passage's chunk, else the K passages
    are embedded on the fly (K of them: milliseconds against the answer's seconds).
    """

    def __init__(self, build: IndexBuild, bm25: BM25Retriever | None = None) -> None:
        self.build = build
        self.bm25 = bm25 if bm25 is not None else BM25Retriever(build.corpus)
        self.index = PendingIndex(build)

    @property
    def label(self) -> str:
        if self.build.error is not None:
            return "bm25 (dense index failed)"
        return f"bm25 (dense index building: {self.build.percent}%)"

    @property
    def status(self) -> str:
        b = self.build
        if b.error is not None:
            return (f"The dense index of {b.corpus.name} could not be built ({b.error}): BM25 retrieves the "
                    "passages (matching words, not meaning). Restart the app to try again.")
        return (f"The dense index is being built: {b.done:,} of {b.total:,} passages embedded ({b.percent}%). "
                "Meanwhile BM25 retrieves the passages (matching words, not meaning); answers switch to the "
                "dense index when it is complete.")

    def search(self, question: str, qv: np.ndarray, k: int) -> tuple[np.ndarray, list[Passage]]:
        """BM25's top k (its ranking, best first), scored q(x)·d(z) with qv (1, D)."""
        _, hits = self.bm25.search([question], k)  # BM25's own scores are not on the dense scale
        return self.scores(qv, hits[0]), hits[0]

    def scores(self, qv: np.ndarray, passages: list[Passage]) -> np.ndarray:
        rows = [self.build.corpus.position(p.id) for p in passages]
        vecs, final = self.build.vectors(rows)  # (K, D), (K,)
        if not final.all():
            missing = [i for i, ok in enumerate(final) if not ok]
            vecs[missing] = self.build.encoder.encode_passages([passages[i] for i in missing], show_bar=False)
        return (vecs @ qv[0]).astype(np.float32)  # (K,)


class PendingIndex:
    """A pipeline's `index` while its dense index is built: the corpus and its size; what needs the
    vectors (a dense search, an edited copy) is refused with how far the build is."""

    def __init__(self, build: IndexBuild) -> None:
        self.build = build
        self.corpus = build.corpus

    def __len__(self) -> int:
        return len(self.corpus)

    @property
    def dim(self) -> int:
        return self.build.encoder.dim

    def _refuse(self, what: str) -> ValueError:
        if self.build.error is not None:
            return ValueError(f"{what} needs the dense index of {self.corpus.name!r}, which could not be built "
                              f"({self.build.error}): restart the app to build it again.")
        return ValueError(f"{what} needs the dense index of {self.corpus.name!r}, which is still being built "
                          f"({self.build.percent}% done): try again when the status line says it is complete.")

    def search(self, q: np.ndarray, k: int):
        raise self._refuse("a dense search")

    @property
    def embeddings(self) -> np.ndarray:
        raise self._refuse("the passage vectors")

    def with_edited_passage(self, passage_id: str, new_text: str, encoder, new_title: str | None = None):
        raise self._refuse("editing a passage (it re-embeds the passage into a copy of the index)")


def reciprocal_rank_fusion(rankings: list[list[str]], c: int = RRF_C) -> list[str]:
    """Ids ordered by their fused score Σ_r 1 / (c + rank_r(id)) over the ranked lists (ranks from 1;
    an id absent from a list adds nothing there); ties keep the order of first appearance.

    >>> reciprocal_rank_fusion([["a", "b", "c"], ["b", "c"]])  # a: 1/61, b: 1/62 + 1/61, c: 1/63 + 1/62
    ['b', 'c', 'a']
    """
    score: dict[str, float] = {}
    for ranked in rankings:
        for rank, ident in enumerate(ranked, start=1):
            score[ident] = score.get(ident, 0.0) + 1.0 / (c + rank)
    order = {ident: i for i, ident in enumerate(score)}  # first appearance
    return sorted(score, key=lambda ident: (-score[ident], order[ident]))


class BM25Only:
    """BM25's top K over the dense retriever's corpus, scored q(x)·d(z) by the dense encoders (as
    `BM25WhileBuilding` scores them): the lexical baseline as a choice of the `retriever` setting."""

    label = "bm25"
    status = None

    def __init__(self, dense: DenseRetriever, bm25: BM25Retriever) -> None:
        self.dense, self.bm25, self.index = dense, bm25, dense.index

    def search(self, question: str, qv: np.ndarray, k: int) -> tuple[np.ndarray, list[Passage]]:
        _, hits = self.bm25.search([question], k)  # BM25's own scores are not on the dense scale
        return self.dense.scores(qv, hits[0]), hits[0]

    def scores(self, qv: np.ndarray, passages: list[Passage]) -> np.ndarray:
        return self.dense.scores(qv, passages)


class Hybrid:
    """Dense and BM25 fused by reciprocal rank (`reciprocal_rank_fusion` of each one's top
    FUSE_DEPTH), scored q(x)·d(z) by the dense encoders: passages either retriever ranks high."""

    label = "hybrid"
    status = None

    def __init__(self, dense: DenseRetriever, bm25: BM25Retriever) -> None:
        self.dense, self.bm25, self.index = dense, bm25, dense.index

    def search(self, question: str, qv: np.ndarray, k: int) -> tuple[np.ndarray, list[Passage]]:
        depth = min(max(FUSE_DEPTH, k), len(self.index))
        _, dense_hits = self.dense.search(question, qv, depth)
        _, bm25_hits = self.bm25.search([question], depth)
        by_id = {p.id: p for p in [*dense_hits, *bm25_hits[0]]}
        fused = reciprocal_rank_fusion([[p.id for p in dense_hits], [p.id for p in bm25_hits[0]]])[:k]
        passages = [by_id[i] for i in fused]
        return self.dense.scores(qv, passages), passages

    def scores(self, qv: np.ndarray, passages: list[Passage]) -> np.ndarray:
        return self.dense.scores(qv, passages)


def choose(base, name: str, bm25: "Callable[[], BM25Retriever]"):
    """The retriever the `retriever` setting names, over the pipeline's own `base` retriever: dense
    is `base` itself; while the dense index is built (`base` is a `BM25WhileBuilding`) every name
    gets BM25's passages, labelled as such; `bm25()` makes (or returns) the BM25 index of the corpus."""
    if name not in RETRIEVERS:
        raise ValueError(f"retriever={name!r} is unknown: use one of {', '.join(RETRIEVERS)}.")
    if name == DENSE or not isinstance(base, DenseRetriever):
        return base
    return (BM25Only if name == "bm25" else Hybrid)(base, bm25())
