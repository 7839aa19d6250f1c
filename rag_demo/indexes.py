"""The index a pipeline reads: loaded or built (cached on disk), built in the background while BM25
answers, swapped in one assignment when complete; and steps 1-2 over it, encode and retrieve.

    1 encode    the question with the mode's question encoder (of the settings' weights)
    2 retrieve  the top K passages, with scores q(x)·d(z) (and the ones K cut off)

Swapping the index is the paper's hot-swap: same models, different knowledge.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from rag_demo.config import RagSettings, check_mode, check_question
from rag_demo.knowledge.ann import expected_recall, settings_for
from rag_demo.knowledge.bm25 import BM25Retriever
from rag_demo.knowledge.building import IndexBuild
from rag_demo.knowledge.corpus import Corpus, Passage
from rag_demo.knowledge.index import IndexInfo, PassageIndex, load_cached_index, load_or_build_index
from rag_demo.knowledge.retrievers import BM25WhileBuilding, DenseRetriever, choose
from rag_demo.models.stacks import LoadedStack

Progress = Callable[[float | None, str], None]  # (fraction done or None, message)


@dataclass
class Retrieval:
    """Steps 1-2 for one question: the top K passages, best first."""

    passages: list[Passage]
    scores: torch.Tensor  # (K,) retrieval inner products q(x)·d(z)
    timings: dict[str, float]  # seconds: encode, retrieve
    retriever: str = "dense"  # the label of the retriever that chose them (Answer.retriever)
    near: list[Passage] = field(default_factory=list)  # ranked K+1 .. K+extra: what K cut off
    near_scores: list[float] = field(default_factory=list)  # their q(x)·d(z)

    def near_misses(self) -> list[dict]:
        """Answer.near_misses: the passages just after the K read, with their ranks and scores."""
        k = len(self.passages)
        return [{"rank": k + i + 1, "id": p.id, "title": p.title, "text": p.text, "url": p.url, "score": float(sc)}
                for i, (p, sc) in enumerate(zip(self.near, self.near_scores))]


class Indexes:
    """The retriever a pipeline reads (dense over its index, or BM25 while that index is built), with
    the stack whose encoders it uses; `settings()` gives the pipeline's default K and retriever."""

    def __init__(self, stack: LoadedStack, index: PassageIndex | None, settings: Callable[[], RagSettings],
                 info: IndexInfo | None = None) -> None:
        self.stack, self.settings, self.info = stack, settings, info
        self.build: IndexBuild | None = None  # a dense index being built in the background
        self.retriever: Any = DenseRetriever(index)
        self._bm25: BM25Retriever | None = None  # the corpus's BM25 index, made when a setting first asks for it
        self._bm25_lock = threading.Lock()

    @property
    def index(self) -> Any:
        """The dense `PassageIndex`, or while it is built a `PendingIndex` (the corpus and its size;
        what needs the vectors is refused, saying so)."""
        return self.retriever.index

    def build_index(self, corpus: Corpus, progress: Progress | None = None, rebuild: bool = False,
                    span: tuple[float, float] = (0.0, 1.0)) -> tuple[PassageIndex, IndexInfo]:
        """(index, info) for `corpus` under the stack's passage encoder, cached on disk; progress
        fractions run over `span`."""
        say = progress or (lambda frac, msg: None)
        lo, hi = span
        spec, encoder = self.stack.spec, self.stack.ctx_encoder
        ann = settings_for(spec.index_kind, len(corpus), encoder.dim, spec.index_rerank)
        say(lo, f"Loading the index of {corpus.name} ({len(corpus):,} passages; {ann.kind}: {expected_recall(ann)}) ...")

        def bar(done: int, total: int) -> None:
            say(lo + (hi - lo) * done / max(total, 1), f"Embedding passages of {corpus.name}: {done:,}/{total:,}")

        index, info = load_or_build_index(corpus, encoder, spec.cache_dir, bar, rebuild, ann)
        say(hi, f"Index {info.how} in {info.seconds:.1f} s ({info.n_passages:,} passages)")
        return index, info

    def in_background(self, corpus: Corpus, progress: Progress | None = None, rebuild: bool = False,
                      build_gate: str | None = None) -> IndexBuild | None:
        """Useful at once, exact soon: the dense index of `corpus` from the disk cache when it is
        intact (-> None: dense retrieval at once); else BM25 over `corpus` retrieves
        (`BM25WhileBuilding`: every Answer says so in `retriever`) while a background thread builds
        the dense index, which then replaces it in one assignment, no restart (-> that build, also
        `self.build`)."""
        say = progress or (lambda frac, msg: None)
        spec, encoder = self.stack.spec, self.stack.ctx_encoder
        ann = settings_for(spec.index_kind, len(corpus), encoder.dim, spec.index_rerank)
        say(0.5, f"Loading the index of {corpus.name} ({len(corpus):,} passages) ...")
        cached = None if rebuild else load_cached_index(corpus, encoder, spec.cache_dir, ann)
        if cached is not None:
            index, self.info = cached
            self.retriever = DenseRetriever(index)
            say(1.0, f"Index {self.info.how} in {self.info.seconds:.1f} s ({len(corpus):,} passages)")
            return None
        say(0.6, f"No dense index cached: indexing the {len(corpus):,} passages for BM25 (seconds), to answer "
                 "while the dense index is built ...")
        build = IndexBuild(corpus, encoder, spec.cache_dir, ann, rebuild, build_gate)
        self._bm25 = BM25Retriever(corpus)  # serves now, and the bm25 and hybrid settings once the dense index is built
        self.retriever = BM25WhileBuilding(build, self._bm25)
        self.build = build
        build.on_ready(self._dense_ready)
        build.start()
        say(0.9, f"Answering with BM25 while the dense index of {corpus.name} is built in the background")
        return build

    def _dense_ready(self, index: PassageIndex, info: IndexInfo) -> None:
        self.info = info
        self.retriever = DenseRetriever(index)  # one assignment: a question in flight keeps its retriever

    def building(self) -> bool:
        """Whether a dense index is being built in the background (answers retrieve with BM25)."""
        return self.build is not None and self.build.running

    def bm25(self) -> BM25Retriever:
        """The BM25 index of this corpus, made on first use (a second or two for Vital Articles)."""
        with self._bm25_lock:
            if self._bm25 is None or self._bm25.corpus is not self.index.corpus:
                self._bm25 = BM25Retriever(self.index.corpus)
            return self._bm25

    def check_k(self, k: int) -> None:
        if k > len(self.index):
            raise ValueError(
                f"k={k} is more than the {len(self.index)} passages of corpus {self.index.corpus.name!r}: "
                f"choose k from 1 to {len(self.index)}."
            )

    def retrieve(self, question: str, mode: str = "token", k: int | None = None, retriever: str | None = None,
                 extra: int = 0, weights: str = "base") -> Retrieval:
        """Steps 1-2: encode the question with `mode`'s question encoder (of `weights`: the trained
        tower or the base one), then the top k passages (k and the retriever, "dense", "bm25" or
        "hybrid", default to the pipeline's settings) with their scores q(x)·d(z); `extra` more,
        ranked after them, go to `Retrieval.near`."""
        q = check_question(question)
        mm = self.stack.modes_for(weights)[check_mode(mode)]
        k = self.settings().decoding.k if k is None else k
        self.check_k(k)
        # this question's, even if the dense index completes meanwhile
        chosen = choose(self.retriever, retriever or self.settings().decoding.retriever, self.bm25)
        depth = min(k + max(extra, 0), len(self.index))
        t0 = time.perf_counter()
        qv = mm.question_encoder.encode_questions([q])  # step 1: encode (1, D)
        t1 = time.perf_counter()
        scores, passages = chosen.search(q, qv, depth)  # step 2: retrieve (depth,)
        t2 = time.perf_counter()
        return Retrieval(passages[:k], torch.from_numpy(scores[:k].copy()), {"encode": t1 - t0, "retrieve": t2 - t1},
                         chosen.label, list(passages[k:]), [float(x) for x in scores[k:]])

    def passage_scores(self, question: str, mode: str, passages: list[Passage], weights: str = "base") -> torch.Tensor:
        """Retrieval scores q(x)·d(z) (K,) of given passages of this index (e.g. BM25's picks)
        under `mode`'s question encoder (of `weights`), as `retrieve` would have scored them."""
        encoder = self.stack.modes_for(weights)[check_mode(mode)].question_encoder
        qv = encoder.encode_questions([check_question(question)])  # (1, D)
        return torch.from_numpy(self.retriever.scores(qv, passages))  # (K,)
