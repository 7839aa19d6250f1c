"""The question-answering pipeline: question in, `Answer`s (and their events) out, in four steps.

    1 encode    the question with the mode's question encoder          indexes.py
    2 retrieve  the top K passages from the index, with scores          indexes.py
    3 generate  RAG-Sequence | RAG-Token | closed-book (2b: what the     generating.py, rag/engine.py
                generator reads, as the reader aids set it)
    4 attribute per-token posterior over the K passages                 generating.py, rag/engine.py

`RagPipeline` composes those jobs around one loaded stack: `Indexes` (the index it reads, built in
the background and swapped in one assignment: the paper's hot-swap), `Generating` (steps 2b-4),
`Pricing` (what a request costs before it runs) and streaming.py (answers as they are decoded).
What an answer is lives in answer.py; how a request runs among others (`Run`) in runs.py.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import replace
from typing import Any, Callable, Iterator

import torch

from rag_demo.answer import Answer, AnswerEvent, Listen
from rag_demo.confidence import load_model
from rag_demo.config import RagSettings, check_mode, check_question
from rag_demo.generating import Generating
from rag_demo.indexes import Indexes, Progress, Retrieval
from rag_demo.loading import load_pipeline
from rag_demo.knowledge.corpus import Corpus, Passage
from rag_demo.knowledge.index import IndexInfo, PassageIndex
from rag_demo.knowledge.retrievers import DenseRetriever
from rag_demo.models.cost import CostFit, CostModel, Speed
from rag_demo.models.stacks import LoadedStack
from rag_demo.pricing import Pricing
from rag_demo.runs import Run
from rag_demo.streaming import either, threaded

__all__ = ["RagPipeline", "Retrieval", "Run"]

# The passages ranked just after the K read (K+1 .. K+NEAR_MISSES), shown greyed as "just missed".
NEAR_MISSES = 5


class RagPipeline:
    """A loaded stack, the index it reads, and default settings. Thread-compatible for reads."""

    def __init__(self, stack: LoadedStack, index: PassageIndex | None, settings: RagSettings | None = None,
                 index_info: IndexInfo | None = None):
        self.stack = stack
        self.settings = settings or RagSettings.for_stack(stack.name)
        self.indexes = Indexes(stack, index, lambda: self.settings, index_info)
        self.generating = Generating(self)
        self.pricing = Pricing(self)
        self.cost_model = CostModel()  # replaced by a calibrated one at warm_up()
        self.speed = Speed()  # how much slower than at warm-up the generator runs now
        self.confidence_model = load_model()  # assets/confidence.json (None: answers carry no confidence)
        self.cost_fit = CostFit.load()  # assets/cost_fit.json: how answers usually run, against the worst case

    @classmethod
    def load(cls, *args, **kwargs) -> "RagPipeline":
        """A pipeline with its stack's models and its index loaded (loading.load_pipeline)."""
        return load_pipeline(cls, *args, **kwargs)

    # -- the index it reads (indexes.py) -------------------------------------
    @property
    def index(self) -> Any:
        """The dense `PassageIndex`, or while it is built a `PendingIndex` (indexes.Indexes.index)."""
        return self.indexes.index

    @index.setter
    def index(self, index: PassageIndex) -> None:
        self.indexes.retriever = DenseRetriever(index)

    @property
    def retriever(self) -> Any:
        return self.indexes.retriever

    @property
    def index_info(self) -> IndexInfo | None:
        return self.indexes.info

    @index_info.setter
    def index_info(self, info: IndexInfo | None) -> None:
        self.indexes.info = info

    @property
    def index_build(self) -> Any:
        return self.indexes.build

    def index_building(self) -> bool:
        return self.indexes.building()

    def retrieval_status(self) -> str | None:
        """What the status line says about retrieval: None while the dense index serves; how far
        its build is (and that BM25 retrieves meanwhile) while it is built."""
        return self.indexes.retriever.status

    def with_index(self, index: PassageIndex, info: IndexInfo | None = None) -> "RagPipeline":
        """Same models, another index: the hot-swap (no retraining)."""
        pipe = RagPipeline(self.stack, index, self.settings, info)
        pipe.cost_model, pipe.speed = self.cost_model, self.speed
        pipe.confidence_model, pipe.cost_fit = self.confidence_model, self.cost_fit
        if self.indexes._bm25 is not None and getattr(index, "corpus", None) is self.index.corpus:
            pipe.indexes._bm25 = self.indexes._bm25  # the same passages: the same BM25 index
        return pipe

    def with_corpus(self, corpus: Corpus, progress: Progress | None = None) -> "RagPipeline":
        return self.with_index(*self.indexes.build_index(corpus, progress))

    def retrieve(self, question: str, mode: str = "token", k: int | None = None, retriever: str | None = None,
                 extra: int = 0, weights: str = "base") -> Retrieval:
        """Steps 1-2 (indexes.Indexes.retrieve)."""
        return self.indexes.retrieve(question, mode, k, retriever, extra, weights)

    def passage_scores(self, question: str, mode: str, passages: list, weights: str = "base") -> Any:
        """The retriever's scores q(x)·d(z) of given passages (indexes.Indexes.passage_scores)."""
        return self.indexes.passage_scores(question, mode, passages, weights)

    # -- what a request costs (pricing.py) -------------------------------------
    @property
    def estimate(self):
        return self.pricing.estimate

    @property
    def check_budget(self):
        return self.pricing.check_budget

    @property
    def expect(self):
        return self.pricing.expect

    # -- answering ----------------------------------------------------------------
    def answer(self, question: str, mode: str = "token", settings: RagSettings | None = None,
               run: Run | None = None, **overrides) -> Answer:
        """Answer one question in one mode. Per-call overrides (k=..., num_beams=...) fall back
        to `settings`, then to the pipeline's defaults. `run`: when to stop and how to share the
        CPU (None runs unbounded, as the CLI does)."""
        return self.answers(question, [mode], settings, run, **overrides)[mode]

    def answers(self, question: str, modes: list[str], settings: RagSettings | None = None,
                run: Run | None = None, **overrides) -> dict[str, Answer]:
        """Every mode's final Answer (`answer_modes` without the events)."""
        out = {e.mode: e.answer for e in self.answer_modes(question, modes, settings, run, **overrides) if e.final}
        return {mode: out[mode] for mode in modes}

    def answer_modes(self, question: str, modes: list[str], settings: RagSettings | None = None,
                     run: Run | None = None, partials: bool = False, **overrides) -> Iterator[AnswerEvent]:
        """Answer in several modes, as events: each mode's final Answer as soon as it is done,
        closed-book first (the cheapest), then the RAG modes in order; with `partials` also its
        answer so far after every decoding step. Retrieval is shared by modes with the same
        question encoder, the prefill by modes with the same generator (answer_from_modes). The
        question and settings are checked before anything runs.

        With `partials` the decoding runs in a worker thread (this thread only hands its events
        on); closing the iterator early cancels the decoding at its next step."""
        q = check_question(question)
        modes = [check_mode(m) for m in modes]
        s = (settings or self.settings).merged(**overrides)
        self.indexes.check_k(s.decoding.k)
        run = run or Run()
        if not partials:
            return self._events(q, modes, s, run, None)
        return threaded(lambda listen, gone: self._events(q, modes, s, replace(run, cancelled=either(run.cancelled,
                                                                                                      gone)), listen))

    def _events(self, q: str, modes: list[str], s: RagSettings, run: Run, listen: Listen | None
                ) -> Iterator[AnswerEvent]:
        # closed-book first: the cheapest (one prompt, no passage), so its card is done first; its
        # prompt is its own, so running it before the RAG modes changes no answer
        if "closed-book" in modes:
            yield AnswerEvent("closed-book", True, self.generating.closed_book(q, s, run, listen))
        for group in self.modes_by_encoder(modes, s.decoding.weights):
            r = self.retrieve(q, group[0], s.decoding.k, s.decoding.retriever, extra=NEAR_MISSES,
                              weights=s.decoding.weights)
            for event in self.generating.from_passages(q, group, r.passages, r.scores, s, r.timings, run, listen,
                                                       r.retriever):
                event.answer.near_misses = r.near_misses()
                yield event

    def modes_by_encoder(self, modes: list[str], weights: str = "base") -> list[list[str]]:
        """The RAG modes among `modes` grouped by question encoder, in order: modes of one group
        retrieve the same passages with the same scores (offline: one group; paper: two)."""
        groups: dict[int, list[str]] = {}
        for mode in modes:
            if mode != "closed-book":
                groups.setdefault(id(self.stack.modes_for(weights)[mode].question_encoder), []).append(mode)
        return list(groups.values())

    def answer_from(self, question: str, mode: str, passages: list[Passage], scores: torch.Tensor,
                    settings: RagSettings | None = None, timings: dict | None = None,
                    run: Run | None = None, **overrides) -> Answer:
        """Steps 2b-4 on given passages and their retrieval scores q(x)·d(z) (K,): another
        retriever's picks, a passage taken away, an edited text. p(z|x) is the softmax of the
        scores times the stack's scale over the prior temperature, over these passages only."""
        return self.answer_from_modes(question, [mode], passages, scores, settings, timings, run, **overrides)[mode]

    def answer_from_modes(self, question: str, modes: list[str], passages: list[Passage], scores: torch.Tensor,
                          settings: RagSettings | None = None, timings: dict | None = None,
                          run: Run | None = None, **overrides) -> dict[str, Answer]:
        """`answer_from` in several RAG modes over the same passages; modes with the same
        generator share one prefill of the K prompts (generators.SharedPrefill)."""
        q = check_question(question)
        modes = [check_mode(m) for m in modes]
        if "closed-book" in modes:
            raise ValueError("mode='closed-book' uses no passages: call answer(question, 'closed-book').")
        if not passages or len(passages) != len(scores):
            raise ValueError(f"got {len(passages)} passages and {len(scores)} scores: pass one score per passage.")
        s = (settings or self.settings).merged(**overrides)
        return {e.mode: e.answer for e in self.generating.from_passages(q, modes, passages, scores, s, timings,
                                                                        run or Run(), None)}

    # -- warm-up ----------------------------------------------------------------
    WARM_UP_QUESTION = "What is the capital of France?"
    # first-call set-up does not grow with the question's size: two passages and three new tokens
    # leave the next question as fast as a full-size warm-up did, in half a cold start's warm-up
    # time (docs/results.md §3.2)
    WARM_UP_K, WARM_UP_TOKENS = 2, 3
    # the speed baseline's question: another one, since the first one's passages and states are
    # kept and a re-ask would run no model call to time
    SPEED_QUESTION = "Who wrote Hamlet?"

    def warm_up(self, progress: Callable[[str], None] | None = None) -> float:
        """Answer one question in every mode (first-call allocations, lazy inits) and calibrate the
        cost model on this CPU; -> seconds taken. After this a first real question is as fast as
        any other. A background index build waits meanwhile: the calibration measures this CPU,
        not the CPU shared with the build."""
        with self.index_build.paused() if self.index_build is not None else contextlib.nullcontext():
            t0 = time.perf_counter()
            if progress:
                progress("Warming up: one question in every mode ...")
            self.answers(self.WARM_UP_QUESTION, list(self.stack.modes), k=min(self.WARM_UP_K, len(self.index)),
                         max_new_tokens=self.WARM_UP_TOKENS)
            k = min(self.settings.decoding.k, len(self.index))
            if progress:
                progress("Calibrating the cost model on this CPU ...")
            self.cost_model = self.cost_model.calibrate(self.stack.modes["token"].generator)
            self.speed = Speed()  # measured afresh against the calibrated model: this is the machine's own speed
            self.answers(self.SPEED_QUESTION, ["token"], k=k)
            self.speed.settle()
            return time.perf_counter() - t0
