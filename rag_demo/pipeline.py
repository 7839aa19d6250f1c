"""The question-answering pipeline: question in, `Answer` out, in four numbered steps.

    1 encode    the question with the mode's question encoder
    2 retrieve  the top K passages from the FAISS index, with scores and p(z|x)
    3 generate  RAG-Sequence | RAG-Token | closed-book (engine.py)
    4 attribute per-token posterior over the K passages (engine.py)

Owns `Answer` (what the CLI prints and the UI renders; neither recomputes anything) and
`RagPipeline` (a loaded stack + an index + default settings). Swapping the index is the
paper's hot-swap: same models, different knowledge.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from .config import MODE_TITLES, RagSettings, StackSpec, check_mode, check_question  # noqa: F401 - MODE_TITLES re-exported
from .corpus import Corpus, Passage, load_vital_articles
from .engine import Generation, closed_book, rag_sequence, rag_token
from .index import IndexInfo, PassageIndex, load_or_build_index
from .marginalize import doc_log_prior
from .stacks import LoadedStack, load_stack


@dataclass
class RetrievedDoc:
    rank: int  # 1-based
    id: str
    title: str
    text: str
    url: str | None
    score: float  # retrieval inner product q(x)·d(z)
    prior: float  # p(z|x) = softmax over the K retrieved docs


@dataclass
class Answer:
    question: str
    mode: str
    text: str
    tokens: list[str]  # the text each displayed token adds (special tokens left out)
    token_ids: list[int]
    docs: list[RetrievedDoc]
    token_doc_posteriors: list[list[float]]  # (T, K): row i is p(z | ...) for token i (see docs/DESIGN.md §3.5)
    doc_posterior: list[float] | None  # RAG-Sequence: p(z | x, y); RAG-Token: mean of the token rows
    sequence_logprob: float  # log p(y|x) under the mode's model, every generated token counted
    decoding: str
    timings: dict[str, float]  # seconds: encode, retrieve, generate, attribute, total
    stack: str
    corpus: str
    candidates: list[dict] = field(default_factory=list)  # RAG-Sequence: [{"text", "logprob"}]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def top_doc_per_token(self) -> list[int]:
        """Index (0-based into docs) of the passage each token leans on most."""
        return [max(range(len(row)), key=row.__getitem__) for row in self.token_doc_posteriors]


class RagPipeline:
    """A loaded stack, an index, and default settings. Thread-compatible for reads."""

    def __init__(self, stack: LoadedStack, index: PassageIndex, settings: RagSettings | None = None,
                 index_info: IndexInfo | None = None):
        self.stack = stack
        self.index = index
        self.settings = settings or RagSettings()
        self.index_info = index_info

    @classmethod
    def load(
        cls,
        spec: StackSpec | None = None,
        corpus: Corpus | None = None,
        settings: RagSettings | None = None,
        progress: Callable[[str], None] | None = None,
        rebuild_index: bool = False,
    ) -> "RagPipeline":
        """Load the stack's models, then the index for `corpus` (Vital Articles by default)."""
        spec = spec or StackSpec()
        stack = load_stack(spec, progress)
        if progress:
            progress(f"Models loaded in {stack.load_seconds:.1f} s")
        corpus = corpus if corpus is not None else load_vital_articles()
        pipe = cls(stack, None, settings)  # type: ignore[arg-type]
        pipe.index, pipe.index_info = pipe.build_index(corpus, progress, rebuild_index)
        return pipe

    def build_index(self, corpus: Corpus, progress: Callable[[str], None] | None = None, rebuild: bool = False):
        """(index, info) for `corpus` under this stack's passage encoder, cached on disk."""
        if progress:
            progress(f"Loading the index of {corpus.name} ({len(corpus)} passages) ...")
        bar = (lambda done, total: progress(f"Embedding passages: {done}/{total}")) if progress else None
        index, info = load_or_build_index(corpus, self.stack.ctx_encoder, self.stack.spec.cache_dir, bar, rebuild)
        if progress:
            how = "loaded from cache" if info.source == "cache" else "built and cached"
            progress(f"Index {how} in {info.seconds:.1f} s ({info.n_passages} passages)")
        return index, info

    def with_index(self, index: PassageIndex, info: IndexInfo | None = None) -> "RagPipeline":
        """Same models, another index: the hot-swap (no retraining)."""
        return RagPipeline(self.stack, index, self.settings, info)

    def with_corpus(self, corpus: Corpus, progress: Callable[[str], None] | None = None) -> "RagPipeline":
        index, info = self.build_index(corpus, progress)
        return self.with_index(index, info)

    # -- answering --------------------------------------------------------------
    def answer(self, question: str, mode: str = "token", settings: RagSettings | None = None, **overrides) -> Answer:
        """Answer one question in one mode. Per-call overrides (k=..., num_beams=...) fall back
        to `settings`, then to the pipeline's defaults."""
        return self.answer_modes(question, [mode], settings, **overrides)[mode]

    def answer_modes(self, question: str, modes: list[str], settings: RagSettings | None = None,
                     **overrides) -> dict[str, Answer]:
        """Answer in several modes; retrieval is shared by modes with the same question encoder."""
        q = check_question(question)
        modes = [check_mode(m) for m in modes]
        s = (settings or self.settings).merged(**overrides)
        if s.k > len(self.index):
            raise ValueError(
                f"k={s.k} is more than the {len(self.index)} passages of corpus {self.index.corpus.name!r}: "
                f"choose k from 1 to {len(self.index)}."
            )
        retrieved: dict[int, tuple] = {}
        out = {}
        for mode in modes:
            mm = self.stack.modes[mode]
            if mode == "closed-book":
                out[mode] = self._closed_book(q, mm, s)
                continue
            key = id(mm.question_encoder)
            if key not in retrieved:
                retrieved[key] = self._retrieve(q, mm, s.k)
            docs, scores, timings = retrieved[key]
            out[mode] = self._rag(q, mode, mm, docs, scores, dict(timings), s)
        return out

    def _retrieve(self, q: str, mm, k: int):
        t0 = time.perf_counter()
        qv = mm.question_encoder.encode_questions([q])  # step 1: encode (1, D)
        t1 = time.perf_counter()
        scores, passages = self.index.search(qv, k)  # step 2: retrieve (1, K)
        t2 = time.perf_counter()
        return passages[0], torch.from_numpy(scores[0].copy()), {"encode": t1 - t0, "retrieve": t2 - t1}

    def _rag(self, q: str, mode: str, mm, passages: list[Passage], scores: torch.Tensor, timings: dict,
             s: RagSettings) -> Answer:
        gen = mm.generator
        logits = scores * mm.score_scale  # (K,) the retrieval logits p(z|x) is a softmax of
        prior = doc_log_prior(logits).exp()  # (K,)
        prompts = [gen.prompt(q, p, s.max_doc_tokens) for p in passages]
        run = rag_token if mode == "token" else rag_sequence
        g = run(gen, prompts, logits, s)  # steps 3 and 4: generate, attribute
        docs = [
            RetrievedDoc(i + 1, p.id, p.title, p.text, p.url, float(scores[i]), float(prior[i]))
            for i, p in enumerate(passages)
        ]
        return self._answer(q, mode, gen, g, docs, timings)

    def _closed_book(self, q: str, mm, s: RagSettings) -> Answer:
        gen = mm.generator
        g = closed_book(gen, gen.prompt(q, None, s.max_doc_tokens), s)
        return self._answer(q, "closed-book", gen, g, [], {"encode": 0.0, "retrieve": 0.0})

    def _answer(self, q, mode, gen, g: Generation, docs: list[RetrievedDoc], timings: dict) -> Answer:
        shown = [i for i, t in enumerate(g.tokens) if not gen.is_special(t)]
        pieces = gen.token_pieces(g.tokens)
        post = g.posteriors[shown].tolist() if g.posteriors is not None else []  # (T', K)
        if g.doc_posterior is not None:
            doc_post = g.doc_posterior.tolist()
        else:
            doc_post = g.posteriors.mean(0).tolist() if g.posteriors is not None and len(g.tokens) else None
        timings = {**timings, **g.timings}
        timings["total"] = sum(timings.values())
        return Answer(
            question=q, mode=mode, text=gen.decode(g.tokens),
            tokens=[pieces[i] for i in shown], token_ids=[g.tokens[i] for i in shown],
            docs=docs, token_doc_posteriors=post, doc_posterior=doc_post,
            sequence_logprob=g.logprob, decoding=g.decoding, timings=timings,
            stack=self.stack.name, corpus=self.index.corpus.name,
            candidates=[{"text": gen.decode(t), "logprob": lp} for t, lp in g.candidates],
        )
