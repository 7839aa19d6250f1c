"""The lexical baseline retriever: BM25 over the same passages the dense index holds.

Owns `BM25Retriever`, the baseline the paper compares dense retrieval against (DPR, Karpukhin
et al. 2020, table 2). Scoring is Lucene's BM25 (k1 = 1.5, b = 0.75) from the `bm25s` package:
chosen over `rank-bm25` because it is maintained (rank-bm25's last release is from 2022),
needs only numpy, and scores a query against 11k passages with one sparse-matrix lookup
(milliseconds) where rank-bm25 loops over every document in Python.

A passage is indexed as "title text" (the generator sees the title too). Tokens: lowercase
words of 2+ characters, English stop words removed, no stemming.

`search` returns the same shape as `PassageIndex.search` so the evaluation treats both
retrievers alike. BM25 scores are not on the dense scale, so they are never fed to the
generator's doc softmax: `evaluate.py` rescores BM25's passages with the dense question
encoder to get p(z|x) (only which K passages are retrieved differs).
"""
from __future__ import annotations

import time

import numpy as np

from rag_demo.knowledge.corpus import Corpus, Passage

STOPWORDS = "en"


def _tokenize(texts: list[str]) -> list[list[str]]:
    import bm25s

    return bm25s.tokenize(texts, stopwords=STOPWORDS, return_ids=False, show_progress=False)


class BM25Retriever:
    """BM25 (Lucene variant, k1=1.5, b=0.75) over a corpus's passages, built in memory."""

    def __init__(self, corpus: Corpus, k1: float = 1.5, b: float = 0.75) -> None:
        import bm25s

        if not len(corpus):
            raise ValueError(f"the corpus is empty: {corpus.name!r} has no passages; add documents with text.")
        t0 = time.perf_counter()
        self.corpus = corpus
        self.name = "BM25"
        self.k1, self.b = k1, b
        self._bm25 = bm25s.BM25(k1=k1, b=b, method="lucene")
        self._bm25.index(_tokenize([f"{p.title} {p.text}" for p in corpus.passages]), show_progress=False)
        self.build_seconds = time.perf_counter() - t0

    def __len__(self) -> int:
        return len(self.corpus)

    def search(self, questions: list[str], k: int) -> tuple[np.ndarray, list[list[Passage]]]:
        """Top-k passages for each question: BM25 scores (B, k) and passages B x k, best first.

        A question with no indexed word scores 0 everywhere; its k passages are then arbitrary.
        """
        if not 1 <= k <= len(self):
            raise ValueError(
                f"k={k} is out of range for corpus {self.corpus.name!r} of {len(self)} passages: use 1 to {len(self)}."
            )
        tokens = [t or ["<no-words>"] for t in _tokenize(list(questions))]  # bm25s needs one token per query
        ids, scores = self._bm25.retrieve(tokens, k=k, show_progress=False, n_threads=1)  # (B, k), (B, k)
        return np.asarray(scores, dtype=np.float32), [[self.corpus.passages[int(i)] for i in row] for row in ids]
