"""The question-answering pipeline: question in, `Answer` out, in four numbered steps.

    1 encode    the question with the mode's question encoder
    2 retrieve  the top K passages from the FAISS index, with scores and p(z|x)
      2b focus  (optional) the sentences of each passage the generator reads (focus.py), and
                the question as it reads it: cased as the passages write its words (truecase.py)
    3 generate  RAG-Sequence | RAG-Token | closed-book (engine.py)
    4 attribute per-token posterior over the K passages (engine.py)

Owns `Answer` (what the CLI prints and the UI renders; neither recomputes anything) and
`RagPipeline` (a loaded stack + an index + default settings). Swapping the index is the
paper's hot-swap: same models, different knowledge.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import queue
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator

import torch

from rag_demo.confidence import judge, load_model
from rag_demo.config import RagSettings, StackSpec, check_mode, check_question
from rag_demo.knowledge.ann import expected_recall, settings_for
from rag_demo.knowledge.bm25 import BM25Retriever
from rag_demo.knowledge.building import IndexBuild
from rag_demo.knowledge.corpus import Corpus, Passage, load_vital_articles
from rag_demo.knowledge.hf_format import Knowledge
from rag_demo.knowledge.index import IndexInfo, PassageIndex, load_cached_index, load_or_build_index
from rag_demo.knowledge.retrievers import BM25WhileBuilding, DenseRetriever, choose
from rag_demo.models.cost import Cost, CostFit, CostModel, Speed, Timed, model_dims
from rag_demo.models.generators import SharedPrefill
from rag_demo.models.stacks import LoadedStack, load_stack
from rag_demo.rag.engine import Generation, Partial, closed_book, rag_sequence, rag_token
from rag_demo.rag.hooks import PAPER
from rag_demo.rag.marginalize import logprob_without_each, rag_sequence_logprob, rag_token_logprob, token_posteriors
from rag_demo.reader.aided import AidedReader, prompt
from rag_demo.reader.focus import focus_passages
from rag_demo.reader.language import language_of
from rag_demo.reader.text import occurs_in
from rag_demo.reader.truecase import recase

Progress = Callable[[float | None, str], None]  # (fraction done or None, message)
# A corpus this small embeds in seconds: load() builds its index before answering, as it always did
# (the demo's uploads and fixture corpora); larger ones answer with BM25 while it is built.
BACKGROUND_MIN_PASSAGES = 1000
# The passages ranked just after the K read (K+1 .. K+NEAR_MISSES), shown greyed as "just missed".
NEAR_MISSES = 5


@dataclass(frozen=True)
class Run:
    """How one question runs among others (all optional).

    cancelled: polled between decoding steps; once True every mode stops where it is ("cancelled").
    seconds: each mode's own share of wall-clock time, counted from when that mode starts; past
    it the mode stops where it is ("time_limit"), and the next mode starts with its own share.
    share: wraps a generator so that its model calls take turns with other requests' (the
    server's StepGate)."""

    cancelled: Callable[[], bool] | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    share: Callable[[Any], Any] | None = None

    def stop_for(self, mode: str) -> Callable[[], str | None]:
        """The engine's stop check of one mode, its share counted from now."""
        deadline = time.monotonic() + self.seconds[mode] if mode in self.seconds else None

        def stop() -> str | None:
            if self.cancelled is not None and self.cancelled():
                return "cancelled"
            if deadline is not None and time.monotonic() > deadline:
                return "time_limit"
            return None
        return stop

    def gated(self, gen):
        return gen if self.share is None else self.share(gen)


@dataclass(frozen=True)
class AnswerEvent:
    """One step of a question's answers: a mode's answer so far (`final` False: the dict of
    RagPipeline.partial_answer, after a decoding step) or its finished `Answer`."""

    mode: str
    final: bool
    answer: Any  # Answer when final, else a partial dict


Listen = Callable[[dict], None]  # gets each partial answer dict


@dataclass
class RetrievedDoc:
    rank: int  # 1-based
    id: str
    title: str
    text: str
    url: str | None
    score: float  # retrieval inner product q(x)·d(z)
    prior: float  # p(z|x) as every formula used it: the retriever's, with the generator's vote when that aid is on
    retriever_prior: float  # the retriever's own p(z|x) = softmax_z(scale · q(x)·d(z) / T) over the K
    # RagSettings.question_weight > 0 on a decoder-only generator: log p_G(question | passage),
    # the generator's own log-likelihood of the question's tokens after this passage
    question_logprob: float | None = None
    # RagSettings.passage_sentences > 0: the indices of the sentences (corpus.split_sentences) the
    # generator read; None: it read the whole passage
    read_sentences: list[int] | None = None


@dataclass
class Answer:
    question: str
    mode: str
    text: str
    tokens: list[str]  # the text each displayed token adds (special tokens left out)
    token_ids: list[int]
    docs: list[RetrievedDoc]
    token_doc_posteriors: list[list[float]]  # (T, K): row i is p(z | ...) for token i (docs/DESIGN.md §3.5)
    top_docs: list[int]  # (T,) 0-based index into docs of the passage token i leans on most (row argmax)
    doc_posterior: list[float] | None  # RAG-Sequence: p(z | x, y); RAG-Token: mean of the token rows shown
    sequence_logprob: float  # log p(y|x) under the mode's model, every generated token counted
    decoding: str
    timings: dict[str, float]  # seconds: encode, retrieve, generate, attribute, total
    stack: str
    corpus: str
    # RAG-Sequence, RAG-Token with token_drafts: [{"text", "logprob"}], "upper_bound": True where the number is one
    candidates: list[dict] = field(default_factory=list)
    stopped: str = "eos"  # why it ended: "eos", "max_new_tokens", "time_limit" (Budget), "cancelled"
    # what a stop (time limit, cancel) made this mode run instead of what its settings name, "" when
    # nothing: "fast_ranking" (thorough RAG-Sequence's rescoring skipped, the fast ranking stands),
    # "no_drafts" (RAG-Token's passage drafts not weighed, the mixture's own answer stands)
    fell_back: str = ""
    # RAG modes, the token inspector: per shown token i, {"p_token": [p(y_i | x, z, y_<i) for
    # each doc z], "top": per doc its top next tokens [[text, p], ...], "mix": RAG-Token's mixture's
    # [[text, p], ...] or None}; recorded by the engine (engine.Inspection), nothing recomputed
    inspector: list[dict] = field(default_factory=list)
    # RAG modes: per retrieved passage z, how much log p(y|x) of this answer drops when z is taken
    # away (p(z|x) renormalised over the rest; marginalize.logprob_without_each, no model pass);
    # None where nothing would be left (K = 1). The faithfulness check of the attributions.
    passage_drop: list[float | None] = field(default_factory=list)
    # the question as the generator read it (RagSettings.recase_question); "" when as typed
    read_question: str = ""
    # what ran: the preset ("paper" or "aided", and its title), every knob, the aids that were on,
    # the knobs changed from the preset (RagSettings.to_dict)
    settings: dict = field(default_factory=dict)
    # honest cues shown with the answer: [{"kind": "may_lack_answer" | "not_in_passages" | "not_english", "text"}]
    cues: list = field(default_factory=list)
    # which retriever chose the passages: "dense", or while the dense index is built in the
    # background "bm25 (dense index building: 40%)"; "" when the caller gave them (answer_from) or
    # none were read (closed-book)
    retriever: str = ""
    # the probability that this answer is right, from its own numbers (`signals`) and the model
    # calibrated on questions nobody here wrote (rag_demo/confidence.py); None: no model for this
    # stack, preset and mode
    confidence: float | None = None
    signals: dict = field(default_factory=dict)
    # the seconds this mode was expected to take, priced before it ran from its own prompts and what
    # the generator kept then (models.cost.CostModel.expected; timings["total"] is what it took)
    expected_seconds: float | None = None
    # the passages the retriever ranked just after the K read (K+1 ..): [{"rank", "id", "title",
    # "text", "url", "score"}], what a larger K would have added; [] for closed-book and given passages
    near_misses: list = field(default_factory=list)
    # what the generator keeps for later questions, as this answer left it: {"passages": ...,
    # "hidden_states": ...}, each {"bytes", "max_bytes", "hits", "misses"} (hits and misses since
    # it loaded); {} for a generator that keeps nothing (BART)
    kept: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


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


def kept_by(gen) -> dict:
    """Answer.kept: the generator's caches for later questions (`Generator.kept_caches`), as they stand."""
    return {name: {"bytes": st.bytes, "max_bytes": st.max_bytes, "hits": st.hits, "misses": st.misses}
            for name, st in ((name, cache.stats()) for name, cache in gen.kept_caches().items())}


class RagPipeline:
    """A loaded stack, a retriever (its index), and default settings. Thread-compatible for reads."""

    def __init__(self, stack: LoadedStack, index: PassageIndex, settings: RagSettings | None = None,
                 index_info: IndexInfo | None = None):
        self.stack = stack
        self.index = index  # the retriever: dense over this index (index_in_background may swap it)
        self.index_build: IndexBuild | None = None  # a dense index being built in the background
        self.settings = settings or RagSettings.for_stack(stack.name)
        self.index_info = index_info
        self.cost_model = CostModel()  # replaced by a calibrated one at warm_up()
        self.speed = Speed()  # how much slower than at warm-up the generator runs now
        self._estimates: dict[tuple, Cost] = {}
        self._bm25: BM25Retriever | None = None  # the corpus's BM25 index, made when a setting first asks for it
        self.confidence_model = load_model()  # assets/confidence.json (None: answers carry no confidence)
        self.cost_fit = CostFit.load()  # assets/cost_fit.json: how answers usually run, against the worst case
        self._bm25_lock = threading.Lock()

    @classmethod
    def load(
        cls,
        spec: StackSpec | None = None,
        corpus: Corpus | None = None,
        settings: RagSettings | None = None,
        progress: Progress | None = None,
        rebuild_index: bool = False,
        knowledge: Knowledge | None = None,
        background_index: bool = False,
        slow_build: float = 0.0,
    ) -> "RagPipeline":
        """Load the stack's models, then the index for `corpus` (Vital Articles by default), or
        use `knowledge` (a loaded knowledge dataset: its vectors and FAISS index as they are).
        `background_index`: a corpus of BACKGROUND_MIN_PASSAGES or more whose index is not
        cached is answered from at once, with BM25, while its dense index is built
        (`index_in_background`); `slow_build`: seconds per passage that build waits (tests only).

        progress(fraction or None, message) is called before each slow step and while passages
        are embedded (models 0-0.5, index 0.5-1.0): what the CLI prints and the app's status shows.
        """
        spec = spec or StackSpec()
        say = progress or (lambda frac, msg: None)
        say(0.02, f"Loading the {spec.name} stack's models ...")
        steps = iter((0.05, 0.2, 0.3, 0.4))  # load_stack says what it loads before each model
        stack = load_stack(spec, lambda msg: say(next(steps, 0.45), msg))
        say(0.5, f"Models loaded in {stack.load_seconds:.1f} s")
        if knowledge is not None:
            if corpus is not None:
                raise ValueError("both a corpus and a knowledge dataset were given: pass one of them.")
            knowledge.check_encoder(stack.ctx_encoder, spec.name)
            say(1.0, f"Using the knowledge dataset {knowledge.dataset_path} ({len(knowledge.index):,} passages)")
            return cls(stack, knowledge.index, settings, knowledge.info())
        if corpus is None:
            say(0.5, "Loading the Wikipedia Vital Articles passages ...")
            corpus = load_vital_articles(cache_dir=spec.cache_dir)
        pipe = cls(stack, None, settings)  # type: ignore[arg-type]
        if background_index and (len(corpus) >= BACKGROUND_MIN_PASSAGES or slow_build):
            pipe.index_in_background(corpus, progress, rebuild_index, slow_build)
        else:
            pipe.index, pipe.index_info = pipe.build_index(corpus, progress, rebuild_index, span=(0.5, 1.0))
        return pipe

    def build_index(self, corpus: Corpus, progress: Progress | None = None, rebuild: bool = False,
                    span: tuple[float, float] = (0.0, 1.0)):
        """(index, info) for `corpus` under this stack's passage encoder, cached on disk;
        progress fractions run over `span`."""
        say = progress or (lambda frac, msg: None)
        lo, hi = span
        spec, encoder = self.stack.spec, self.stack.ctx_encoder
        ann = settings_for(spec.index_kind, len(corpus), encoder.dim, spec.index_rerank)
        say(lo, f"Loading the index of {corpus.name} ({len(corpus):,} passages; {ann.kind}: {expected_recall(ann)}) ...")

        def bar(done: int, total: int) -> None:
            say(lo + (hi - lo) * done / max(total, 1), f"Embedding passages of {corpus.name}: {done:,}/{total:,}")

        index, info = load_or_build_index(corpus, encoder, spec.cache_dir, bar, rebuild, ann)
        how = "loaded from cache" if info.source == "cache" else "built and cached"
        say(hi, f"Index {how} in {info.seconds:.1f} s ({info.n_passages:,} passages)")
        return index, info

    @property
    def index(self) -> Any:
        """The retriever's index: the dense `PassageIndex`, or while it is built a `PendingIndex`
        (the corpus and its size; what needs the vectors is refused, saying so)."""
        return self.retriever.index

    @index.setter
    def index(self, index: PassageIndex) -> None:
        self.retriever = DenseRetriever(index)

    def index_in_background(self, corpus: Corpus, progress: Progress | None = None, rebuild: bool = False,
                            slow_build: float = 0.0) -> IndexBuild | None:
        """Useful at once, exact soon: the dense index of `corpus` from the disk cache when it is
        intact (-> None: the pipeline retrieves densely at once); else BM25 over `corpus` retrieves
        (`BM25WhileBuilding`: every Answer says so in `retriever`) while a background thread builds
        the dense index, which then replaces it in one assignment, no restart (-> that build,
        also `self.index_build`). The build pauses while the pipeline warms up."""
        say = progress or (lambda frac, msg: None)
        spec, encoder = self.stack.spec, self.stack.ctx_encoder
        ann = settings_for(spec.index_kind, len(corpus), encoder.dim, spec.index_rerank)
        say(0.5, f"Loading the index of {corpus.name} ({len(corpus):,} passages) ...")
        cached = None if rebuild else load_cached_index(corpus, encoder, spec.cache_dir, ann)
        if cached is not None:
            self.index, self.index_info = cached
            say(1.0, f"Index loaded from cache in {self.index_info.seconds:.1f} s ({len(corpus):,} passages)")
            return None
        say(0.6, f"No dense index cached: indexing the {len(corpus):,} passages for BM25 (seconds), to answer "
                 "while the dense index is built ...")
        build = IndexBuild(corpus, encoder, spec.cache_dir, ann, rebuild, slow_build)
        self._bm25 = BM25Retriever(corpus)  # serves now, and the bm25 and hybrid settings once the dense index is built
        self.retriever = BM25WhileBuilding(build, self._bm25)
        self.index_build = build
        build.on_ready(self._dense_ready)
        build.start()
        say(0.9, f"Answering with BM25 while the dense index of {corpus.name} is built in the background")
        return build

    def _dense_ready(self, index: PassageIndex, info: IndexInfo) -> None:
        self.index_info = info
        self.retriever = DenseRetriever(index)  # one assignment: a question in flight keeps its retriever

    def index_building(self) -> bool:
        """Whether a dense index is being built in the background (answers retrieve with BM25)."""
        return self.index_build is not None and self.index_build.running

    def retrieval_status(self) -> str | None:
        """What the status line says about retrieval: None while the dense index serves; how far
        its build is (and that BM25 retrieves meanwhile) while it is built."""
        return self.retriever.status

    def with_index(self, index: PassageIndex, info: IndexInfo | None = None) -> "RagPipeline":
        """Same models, another index: the hot-swap (no retraining)."""
        pipe = RagPipeline(self.stack, index, self.settings, info)
        pipe.cost_model, pipe.speed = self.cost_model, self.speed
        pipe.confidence_model, pipe.cost_fit = self.confidence_model, self.cost_fit
        if self._bm25 is not None and getattr(index, "corpus", None) is self.index.corpus:
            pipe._bm25 = self._bm25  # the same passages: the same BM25 index
        return pipe

    def bm25(self) -> BM25Retriever:
        """The BM25 index of this pipeline's corpus, made on first use (a second or two for Vital Articles)."""
        with self._bm25_lock:
            if self._bm25 is None or self._bm25.corpus is not self.index.corpus:
                self._bm25 = BM25Retriever(self.index.corpus)
            return self._bm25

    def with_corpus(self, corpus: Corpus, progress: Progress | None = None) -> "RagPipeline":
        index, info = self.build_index(corpus, progress)
        return self.with_index(index, info)

    # -- answering --------------------------------------------------------------
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
        self._check_k(s.decoding.k)
        run = run or Run()
        if not partials:
            return self._events(q, modes, s, run, None)
        return _threaded(lambda listen, gone: self._events(q, modes, s, replace(run, cancelled=_either(run.cancelled,
                                                                                                       gone)), listen))

    def _events(self, q: str, modes: list[str], s: RagSettings, run: Run, listen: Listen | None
                ) -> Iterator[AnswerEvent]:
        # closed-book first: the cheapest (one prompt, no passage), so its card is done first; its
        # prompt is its own, so running it before the RAG modes changes no answer
        if "closed-book" in modes:
            yield AnswerEvent("closed-book", True, self._closed_book(q, s, run, listen))
        for group in self.modes_by_encoder(modes):
            r = self.retrieve(q, group[0], s.decoding.k, s.decoding.retriever, extra=NEAR_MISSES)
            for event in self._from_passages(q, group, r.passages, r.scores, s, r.timings, run, listen, r.retriever):
                event.answer.near_misses = r.near_misses()
                yield event

    def modes_by_encoder(self, modes: list[str]) -> list[list[str]]:
        """The RAG modes among `modes` grouped by question encoder, in order: modes of one group
        retrieve the same passages with the same scores (offline: one group; paper: two)."""
        groups: dict[int, list[str]] = {}
        for mode in modes:
            if mode != "closed-book":
                groups.setdefault(id(self.stack.modes[mode].question_encoder), []).append(mode)
        return list(groups.values())

    def _check_k(self, k: int) -> None:
        if k > len(self.index):
            raise ValueError(
                f"k={k} is more than the {len(self.index)} passages of corpus {self.index.corpus.name!r}: "
                f"choose k from 1 to {len(self.index)}."
            )

    # -- the stages, each a public entry point ---------------------------------
    def retrieve(self, question: str, mode: str = "token", k: int | None = None, retriever: str | None = None,
                 extra: int = 0) -> Retrieval:
        """Steps 1-2: encode the question with `mode`'s question encoder, then the top k passages
        (k and the retriever, "dense", "bm25" or "hybrid", default to the pipeline's settings)
        with their scores q(x)·d(z); `extra` more, ranked after them, go to `Retrieval.near`."""
        q = check_question(question)
        mm = self.stack.modes[check_mode(mode)]
        k = self.settings.decoding.k if k is None else k
        self._check_k(k)
        # this question's, even if the dense index completes meanwhile
        chosen = choose(self.retriever, retriever or self.settings.decoding.retriever, self.bm25)
        depth = min(k + max(extra, 0), len(self.index))
        t0 = time.perf_counter()
        qv = mm.question_encoder.encode_questions([q])  # step 1: encode (1, D)
        t1 = time.perf_counter()
        scores, passages = chosen.search(q, qv, depth)  # step 2: retrieve (depth,)
        t2 = time.perf_counter()
        return Retrieval(passages[:k], torch.from_numpy(scores[:k].copy()), {"encode": t1 - t0, "retrieve": t2 - t1},
                         chosen.label, list(passages[k:]), [float(x) for x in scores[k:]])

    def passage_scores(self, question: str, mode: str, passages: list[Passage]) -> torch.Tensor:
        """Retrieval scores q(x)·d(z) (K,) of given passages of this index (e.g. BM25's picks)
        under `mode`'s question encoder, as `retrieve` would have scored them."""
        qv = self.stack.modes[check_mode(mode)].question_encoder.encode_questions([check_question(question)])  # (1, D)
        return torch.from_numpy(self.retriever.scores(qv, passages))  # (K,)

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
        return {e.mode: e.answer for e in self._from_passages(q, modes, passages, scores, s, timings, run or Run(), None)}

    def _from_passages(self, q: str, modes: list[str], passages: list[Passage], scores: torch.Tensor, s: RagSettings,
                       timings: dict | None, run: Run, listen: Listen | None, retrieved_by: str = ""
                       ) -> Iterator[AnswerEvent]:
        """Steps 2b-4 of the RAG modes over these passages, each mode's Answer as an event."""
        shared: dict[int, SharedPrefill] = {}
        fed_for: dict[int, tuple[list[Passage], list[list[int]], float]] = {}  # question encoder -> step 2b
        pairs = [(p.title, p.text) for p in passages]
        # step 2b: the question as the generator reads it, cased as the passages write its words (truecase.py)
        qg = recase(q, pairs) if s.aids.recase_question else q
        for mode in modes:
            # step 2b: the part of each passage the generator reads (focus.py; all of it by default)
            mm = self.stack.modes[mode]
            key = id(mm.question_encoder)
            if key not in fed_for:
                t0 = time.perf_counter()
                fed, kept = passages, [[] for _ in passages]
                if s.aids.passage_sentences:
                    qv = mm.question_encoder.encode_questions([q])[0]  # (D,)
                    fed, kept = focus_passages(qv, passages, self.stack.ctx_encoder, s.aids.passage_sentences)
                fed_for[key] = (fed, kept, time.perf_counter() - t0)
        # each mode priced before any runs, over the prompts it will read, from what the generators keep now
        expected = {m: self._expected(m, modes, [prompt(self.stack.modes[m].generator, qg, p, s.decoding, s.aids)
                                                 for p in fed_for[id(self.stack.modes[m].question_encoder)][0]], s)
                    for m in modes}
        for mode in modes:
            mm = self.stack.modes[mode]
            if id(mm.generator) not in shared:  # its model calls timed: the estimates follow the speed
                shared[id(mm.generator)] = SharedPrefill(Timed(mm.generator, self.cost_model, self.speed))
            gen = shared[id(mm.generator)]
            fed, kept, focus_s = fed_for[id(mm.question_encoder)]
            # the retriever's logits scale * q(x)·d(z) over the K passages; the doc log-prior is made
            # from them in the engine (rag.engine.prefill), where a reader aid may add the generator's vote
            logits = torch.as_tensor(scores, dtype=torch.float32) * mm.score_scale  # (K,)
            prompts = [prompt(gen, qg, p, s.decoding, s.aids) for p in fed]
            engine = rag_token if mode == "token" else rag_sequence
            reader = AidedReader(s.aids, s.decoding, gen, qg, fed, prompts, pairs) if s.aids_on() else PAPER

            retriever = torch.softmax(logits / s.decoding.prior_temperature, 0)  # (K,) the retriever's own p(z|x)

            def docs_of(log_prior: torch.Tensor, question_lp: torch.Tensor | None) -> list[RetrievedDoc]:
                prior = log_prior.exp()  # (K,) p(z|x) as the engine used it
                return [
                    RetrievedDoc(i + 1, p.id, p.title, p.text, p.url, float(scores[i]), float(prior[i]),
                                 float(retriever[i]),
                                 read_sentences=kept[i] if s.aids.passage_sentences else None,
                                 question_logprob=None if question_lp is None else float(question_lp[i]))
                    for i, p in enumerate(passages)
                ]

            emit = self._emitter(q, gen, listen, lambda part: docs_of(part.prior, None))
            if listen is not None:
                listen(self.reading(q, mode, len(passages)))
            g = engine(run.gated(gen), prompts, logits, s.decoding, reader, run.stop_for(mode), emit)  # steps 3 and 4
            docs = docs_of(g.prior, g.question_lp)
            t = dict(timings or {"encode": 0.0, "retrieve": 0.0})
            if s.aids.passage_sentences:
                t["focus"] = focus_s
            answer = self._answer(q, mode, gen, g, docs, t, s, qg, cues(q, mm, scores))
            answer.retriever, answer.expected_seconds = retrieved_by, expected[mode]
            yield AnswerEvent(mode, True, answer)

    def _closed_book(self, q: str, s: RagSettings, run: Run, listen: Listen | None) -> Answer:
        gen = Timed(self.stack.modes["closed-book"].generator, self.cost_model, self.speed)
        emit = self._emitter(q, gen, listen, lambda part: [])
        if listen is not None:
            listen(self.reading(q, "closed-book", 0))
        qg = recase(q) if s.aids.recase_question else q  # no passages: only the first letter and "?"
        cb = prompt(gen, qg, None, s.decoding, s.aids)
        expected = self._expected("closed-book", ["closed-book"], [cb], s)
        reader = AidedReader(s.aids, s.decoding, gen, qg, [], [cb], closed_book=True) if s.aids_on() else PAPER
        g = closed_book(run.gated(gen), cb, s.decoding, reader, run.stop_for("closed-book"), emit)
        answer = self._answer(q, "closed-book", gen, g, [], {"encode": 0.0, "retrieve": 0.0}, s, qg, cues(q))
        answer.expected_seconds = expected
        return answer

    def expect(self, question: str, modes: list[str], settings: RagSettings | None = None) -> dict[str, float]:
        """Seconds each mode is expected to take for `question` as answers usually run (not the
        worst case `estimate` prices for the budget): its passages retrieved (milliseconds) and its
        prompts priced with what the generator keeps now, so a re-ask is priced as one."""
        q = check_question(question)
        s = settings or self.settings
        out: dict[str, float] = {}
        for group in self.modes_by_encoder(modes):
            r = self.retrieve(q, group[0], min(s.decoding.k, len(self.index)), s.decoding.retriever)
            qg = recase(q, [(p.title, p.text) for p in r.passages]) if s.aids.recase_question else q
            fed = r.passages
            if s.aids.passage_sentences:  # priced over the sentences it will read (focus.py)
                qv = self.stack.modes[group[0]].question_encoder.encode_questions([q])[0]  # (D,)
                fed = focus_passages(qv, r.passages, self.stack.ctx_encoder, s.aids.passage_sentences)[0]
            for m in group:
                gen = self.stack.modes[m].generator
                out[m] = self._expected(m, modes, [prompt(gen, qg, p, s.decoding, s.aids) for p in fed], s)
        if "closed-book" in modes:
            gen = self.stack.modes["closed-book"].generator
            qg = recase(q) if s.aids.recase_question else q
            out["closed-book"] = self._expected("closed-book", modes, [prompt(gen, qg, None, s.decoding, s.aids)], s)
        return {m: out[m] for m in modes if m in out}

    def _expected(self, mode: str, modes: list[str], prompts: list, s: RagSettings) -> float:
        """The seconds `mode` is expected to take over these prompts (`CostModel.expected`), at the
        speed the generator runs now, priced from what it keeps now."""
        gen = self.stack.modes[mode].generator
        drafts = "none"
        if mode == "token" and s.aids.token_drafts and not s.aids.context_contrast:
            shared = "sequence" in modes and self.stack.modes["sequence"].generator is gen
            drafts = "shared" if shared else "own"
        d = s.decoding
        return self.speed.factor * self.cost_model.expected(
            model_dims(gen), mode, len(prompts), d.num_beams, d.max_new_tokens, max(len(p) for p in prompts),
            self.cost_fit, s.preset, thorough=d.sequence_decoding == "thorough", drafts=drafts,
            cached_tokens=gen.cached_tokens(prompts), prompts_kept=gen.prompts_kept(prompts))

    def _emitter(self, q: str, gen, listen: Listen | None,
                 docs_of: Callable[[Partial], list[RetrievedDoc]]) -> Callable[[Partial], None] | None:
        """The engine's streaming hook: each Partial made into `partial_answer`'s dict and handed
        to `listen` (None when nobody listens: no work per step)."""
        if listen is None:
            return None
        return lambda part: listen(self.partial_answer(q, gen, part, docs_of(part)))

    def reading(self, q: str, mode: str, k: int) -> dict:
        """The partial dict of a mode whose prompts are being read (before its first token)."""
        return {"question": q, "mode": mode, "partial": True, "phase": "reading", "k": k, "text": "", "tokens": [],
                "token_ids": [], "docs": [], "token_doc_posteriors": [], "top_docs": [], "drafts": [],
                "stack": self.stack.name, "corpus": self.index.corpus.name}

    def partial_answer(self, q: str, gen, part: Partial, docs: list[RetrievedDoc]) -> dict:
        """An answer being decoded, as a JSON-able dict shaped like Answer.to_dict() plus
        "partial": True, "phase" and "drafts": "text"/"tokens" are the answer so far (RAG-Token
        coloured by the attribution so far, `token_doc_posteriors` (t, K): exactly the final
        answer's first t rows); RAG-Sequence's "drafts" are the K passages' own candidates being
        written ({"rank", "title", "text", "done"}), its "text" the draft of the passage with the
        highest p(z|x) until the candidates are rescored."""
        tokens = part.tokens[0] if part.mode != "sequence" else part.tokens[int(torch.argmax(part.prior))]
        shown = [i for i, t in enumerate(tokens) if not gen.is_special(t)]
        pieces = gen.token_pieces(tokens)
        rows: list[list[float]] = []
        if part.doc_lp is not None and part.prior is not None and len(tokens):
            post = token_posteriors(part.doc_lp, part.prior)[shown]  # (t', K)
            rows = post.tolist()
        drafts = []
        if part.mode == "sequence":
            drafts = [{"rank": d.rank, "title": d.title, "text": gen.decode(t), "done": done}
                      for d, t, done in zip(docs, part.tokens, part.done)]
        return {
            "question": q, "mode": part.mode, "partial": True, "phase": part.phase,
            "text": gen.decode(tokens), "tokens": [pieces[i] for i in shown], "token_ids": [tokens[i] for i in shown],
            "docs": [dataclasses.asdict(d) for d in docs], "token_doc_posteriors": rows,
            "top_docs": [max(range(len(r)), key=r.__getitem__) for r in rows], "drafts": drafts,
            "stack": self.stack.name, "corpus": self.index.corpus.name,
        }

    def _answer(self, q, mode, gen, g: Generation, docs: list[RetrievedDoc], timings: dict, s: RagSettings,
                read_q: str = "", cues: list | None = None) -> Answer:
        shown = [i for i, t in enumerate(g.tokens) if not gen.is_special(t)]
        pieces = gen.token_pieces(g.tokens)
        post = g.posteriors[shown] if g.posteriors is not None else None  # (T', K)
        if g.doc_posterior is not None:
            doc_post = g.doc_posterior.tolist()
        elif g.posteriors is not None and len(g.tokens):  # RAG-Token: the mean of the rows shown (EOS and
            rows = post if len(shown) else g.posteriors  # other special tokens left out), all rows if none is
            doc_post = rows.mean(0).tolist()
        else:
            doc_post = None
        timings = {**timings, **g.timings}
        timings["total"] = sum(timings.values())
        text = gen.decode(g.tokens)
        answer = Answer(
            question=q, mode=mode, text=text,
            tokens=[pieces[i] for i in shown], token_ids=[g.tokens[i] for i in shown],
            docs=docs, token_doc_posteriors=post.tolist() if post is not None else [],
            top_docs=post.argmax(-1).tolist() if post is not None and len(shown) else [],
            doc_posterior=doc_post,
            sequence_logprob=g.logprob, decoding=g.decoding, timings=timings,
            stack=self.stack.name, corpus=self.index.corpus.name,
            candidates=_ranked_candidates(gen, g),
            stopped=g.stopped, fell_back=g.fell_back, inspector=self._inspector(gen, g, shown),
            passage_drop=self._drops(mode, g),
            read_question="" if read_q == q else read_q, settings=s.to_dict(),
            cues=(cues or []) + unread(text, docs, g.stopped), kept=kept_by(gen),
        )
        self._judge(answer)
        return answer

    def _judge(self, a: Answer) -> None:
        """Set the answer's signals and confidence, and add the "probably wrong" cue below the
        model's threshold (rag_demo/confidence.py)."""
        view = {"mode": a.mode, "stack": a.stack, "settings": a.settings, "text": a.text, "token_ids": a.token_ids,
                "question": a.question, "inspector": a.inspector,
                "sequence_logprob": a.sequence_logprob, "stopped": a.stopped, "candidates": a.candidates,
                "doc_posterior": a.doc_posterior,
                "docs": [{"prior": d.prior, "score": d.score, "title": d.title, "text": d.text} for d in a.docs]}
        a.signals, a.confidence, cue = judge(view, self.confidence_model)
        if cue is not None:
            a.cues.insert(0, cue)

    @staticmethod
    def _drops(mode: str, g: Generation) -> list[float | None]:
        """Answer.passage_drop: log p(y|x) over all K docs minus log p(y|x) without each doc."""
        if g.doc_lp is None or g.prior is None or mode not in ("token", "sequence"):
            return []
        full = (rag_token_logprob if mode == "token" else rag_sequence_logprob)(g.doc_lp, g.prior)  # ()
        without = logprob_without_each(g.doc_lp, g.prior, mode)  # (K,)
        return [float(full - w) if torch.isfinite(w) else None for w in without]

    @staticmethod
    def _inspector(gen, g: Generation, shown: list[int]) -> list[dict]:
        """Answer.inspector from the engine's Inspection and per-doc log-probs, shown tokens only."""
        ins = g.inspection
        if ins is None or g.doc_lp is None:
            return []
        pieces: dict[int, str] = {}

        def named(ids: torch.Tensor, lps: torch.Tensor) -> list[list]:
            return [[pieces.setdefault(i, gen.piece(i)), float(p)]
                    for i, p in zip(ids.tolist(), lps.exp().tolist())]

        out = []
        for t in shown:
            out.append({
                "p_token": g.doc_lp[:, t].exp().tolist(),  # (K,)
                "top": [named(ins.doc_top_ids[z, t], ins.doc_top_lp[z, t]) for z in range(ins.doc_top_ids.shape[0])],
                "mix": named(ins.mix_top_ids[t], ins.mix_top_lp[t]) if ins.mix_top_ids is not None else None,
            })
        return out

    # -- what a request costs -----------------------------------------------------
    WARM_UP_QUESTION = "What is the capital of France?"

    def estimate(self, question: str, modes: list[str], settings: RagSettings | None = None,
                 passages: list[Passage] | None = None, **overrides) -> Cost:
        """Time and peak extra memory of answering `question` in `modes`, before running it
        (models.cost.CostModel; worst case: every answer runs to max_new_tokens, passages take their
        whole max_doc_tokens, none is in the generator's passage cache). The modes run one after
        another: seconds add, memory peaks once. Computed once per question, settings and cost
        model: the server's checks before and after the queue ask for the same estimate.
        `passages` (a question answered again on known passages, e.g. one taken away): priced as
        their own prompts, without the passage tokens whose keys and values are kept now."""
        q = check_question(question)
        s = (settings or self.settings).merged(**overrides)
        if passages is not None:  # what is kept changes from one request to the next: not memoised
            return self._estimate(q, modes, s, passages)
        key = (q, tuple(modes), s, id(self.cost_model), len(self.index), round(self.speed.factor, 1))
        if key not in self._estimates:
            if len(self._estimates) > 256:  # a bounded memo: a new question seldom repeats an old one
                self._estimates.clear()
            self._estimates[key] = self._estimate(q, modes, s)
        return dataclasses.replace(self._estimates[key])  # a copy: callers mark it heavy

    def _estimate(self, q: str, modes: list[str], s: RagSettings, passages: list[Passage] | None = None) -> Cost:
        pairs = [(p.title, p.text) for p in passages or []]
        q = recase(q, pairs) if s.aids.recase_question else q  # "?" added: what the generator reads
        k = min(s.decoding.k, len(self.index)) if passages is None else len(passages)
        seconds, peak, per_mode = 0.0, 0, {}
        longest = Passage("estimate", "Title", "word " * (4 * s.decoding.max_doc_tokens))
        lengths: dict[tuple[int, bool], tuple[int, int]] = {}  # (generator, with a passage) -> (prompt, kept) tokens
        for mode in [check_mode(m) for m in modes]:
            gen = self.stack.modes[mode].generator
            key = (id(gen), mode != "closed-book")
            if key not in lengths:  # RAG-Token and RAG-Sequence share a generator and its prompt
                if key[1] and passages is not None:  # these passages' own prompts, less what is kept of them
                    prompts = [prompt(gen, q, p, s.decoding, s.aids) for p in passages]
                    lengths[key] = (max(len(p) for p in prompts), gen.cached_tokens(prompts))
                else:  # the longest a passage can make it
                    lengths[key] = (len(prompt(gen, q, longest if key[1] else None, s.decoding, s.aids)), 0)
            prompt_tokens, cached = lengths[key]
            drafts = "none"
            if mode == "token" and s.aids.token_drafts and not s.aids.context_contrast:
                # the same generator answering RAG-Sequence in this request drafts for both (rag.engine.doc_searches)
                shared = "sequence" in modes and self.stack.modes["sequence"].generator is gen
                drafts = "shared" if shared else "own"
            # the aids that run the model again: echo retries decode again, context contrast reads the
            # prompt without passages beside every row (reader/retries.py, reader/contrast.py)
            contrast = (len(prompt(gen, q, None, s.decoding, s.aids)) if s.aids.context_contrast and key[1] else 0)
            sec, byt = self.cost_model.request(model_dims(gen), mode, k, s.decoding.num_beams, s.decoding.max_new_tokens, prompt_tokens,
                                               thorough=s.decoding.sequence_decoding == "thorough", drafts=drafts,
                                               cached_tokens=cached, retries=s.aids.echo_retries,
                                               contrast_tokens=contrast)
            sec *= self.speed.factor  # at the speed the generator runs now
            per_mode[mode] = sec
            seconds += sec
            peak = max(peak, byt)
        return Cost(seconds, peak, per_mode)

    def check_budget(self, question: str, modes: list[str], settings: RagSettings | None, budget: Any,
                     **overrides) -> Cost:
        """The request's Cost (`heavy` set from the budget), or a ValueError that says what was
        asked, what it would cost and what to change."""
        s = (settings or self.settings).merged(**overrides)
        cost = self.estimate(question, modes, s)
        cost.heavy = cost.seconds > budget.heavy_seconds
        over = []
        if cost.seconds > budget.max_seconds:
            over.append(f"{cost.seconds:.0f} s of generation (limit {budget.max_seconds:.0f} s)")
        if cost.peak_bytes > budget.max_request_bytes:
            over.append(f"{cost.peak_bytes / 2**30:.1f} GB of memory (limit {budget.max_request_bytes / 2**30:.1f} GB)")
        if over:
            asked = (f"K={s.decoding.k}, beams={s.decoding.num_beams}, max new tokens={s.decoding.max_new_tokens}, "
                     f"RAG-Sequence {s.decoding.sequence_decoding}, modes {', '.join(modes)}")
            raise ValueError(
                f"This request ({asked}) would need about {' and '.join(over)}, over this server's budget: "
                + lower_what(s, modes)
            )
        return cost

    def warm_up(self, progress: Callable[[str], None] | None = None) -> float:
        """Answer one question in every mode (first-call allocations, lazy inits) and calibrate the
        cost model on this CPU; -> seconds taken. After this a first real question is as fast as
        any other. A background index build waits meanwhile: the calibration measures this CPU,
        not the CPU shared with the build."""
        with self.index_build.paused() if self.index_build is not None else contextlib.nullcontext():
            return self._warm_up(progress)

    def _warm_up(self, progress: Callable[[str], None] | None = None) -> float:
        t0 = time.perf_counter()
        if progress:
            progress("Warming up: one question in every mode ...")
        k = min(self.settings.decoding.k, len(self.index))
        self.answers(self.WARM_UP_QUESTION, list(self.stack.modes), k=k)
        if progress:
            progress("Calibrating the cost model on this CPU ...")
        self.cost_model = self.cost_model.calibrate(self.stack.modes["token"].generator)
        self.speed = Speed()  # measured afresh against the calibrated model: this is the machine's own speed
        self.answers(self.WARM_UP_QUESTION, ["token"], k=k)
        self.speed.settle()
        return time.perf_counter() - t0


def lower_what(s: RagSettings, modes: list[str]) -> str:
    """What to change to bring a request under the budget: the knobs that price it, those set."""
    lower = ["K", "the beam size", "max new tokens"] + ([f"echo retries ({s.aids.echo_retries})"]
                                                       if s.aids.echo_retries else [])
    acts = ["lower " + ", ".join(lower[:-1]) + " or " + lower[-1]]
    if s.aids.context_contrast:
        acts.append("turn context-aware decoding off (0)")
    if "sequence" in modes and s.decoding.sequence_decoding == "thorough":
        acts.append("use fast RAG-Sequence decoding")
    return (acts[0] if len(acts) == 1 else ", ".join(acts[:-1]) + ", or " + acts[-1]) + "."


def cues(question: str, mm: Any = None, scores: Any = None) -> list[dict]:
    """What a learner should be told beside an answer: that the question does not look English
    (the models read English only), and, for a RAG answer, that its passages may not hold the
    answer (the best retrieval score is below the retriever's calibrated `doubt_below`)."""
    out = []
    lang = language_of(question)
    if lang != "English":
        out.append({"kind": "not_english", "text": f"This question seems to be in {lang}: the models here read English only, "
                    "so the answer is likely a guess. Ask in English."})
    if mm is not None and mm.doubt_below is not None and len(scores):
        best = float(max(scores))
        if best < mm.doubt_below:
            out.append({"kind": "may_lack_answer", "text": f"Retrieval cue: the passages may not hold the answer. "
                        f"The best one matches the question at {best:.2f}, below {mm.doubt_below:.2f}, where the "
                        "retrieved passages mostly lacked the answer. The generator answers anyway."})
    return out


def unread(text: str, docs: list, stopped: str = "eos") -> list[dict]:
    """The cue of a RAG answer none of whose passages holds its words (as a run of tokens): the
    generator wrote it from its weights, or rephrased; nothing for a cut or empty answer."""
    answer = text.strip().rstrip(".")
    if not docs or not answer or stopped in ("time_limit", "cancelled"):
        return []
    if any(occurs_in(answer, f"{d.title} {d.text}") for d in docs):
        return []
    return [{"kind": "not_in_passages", "text": "No passage contains these words: the generator wrote this answer "
             "from its own weights (or rephrased a passage). Check it against the passages below."}]


def _either(a: Callable[[], bool] | None, b: Callable[[], bool]) -> Callable[[], bool]:
    return b if a is None else (lambda: a() or b())


def _threaded(events: Callable[[Listen, Callable[[], bool]], Iterator[AnswerEvent]]) -> Iterator[AnswerEvent]:
    """Run `events(listen, gone)` in a worker thread and hand on, here, its partial answers (what
    `listen` got) and its events, in order. The worker runs with this thread's context (gradio's
    progress lives in it); its error is raised here. Stopping early sets `gone`: the decoding
    stops at its next step and the worker is waited for."""
    box: queue.Queue = queue.Queue()
    gone = threading.Event()
    done = object()

    def work() -> None:
        try:
            for event in events(lambda d: box.put(AnswerEvent(d["mode"], False, d)), gone.is_set):
                box.put(event)
                if gone.is_set():  # nobody waits for the modes left
                    break
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, raised there
            box.put(e)
        finally:
            box.put(done)

    worker = threading.Thread(target=contextvars.copy_context().run, args=(work,), daemon=True,
                              name="rag-answer")
    worker.start()
    try:
        while (item := box.get()) is not done:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        gone.set()
        worker.join()


def _ranked_candidates(gen, g: Generation) -> list[dict]:
    """Answer.candidates: the candidates the engine weighed, best score first, one a text (two
    tokenizations of the same words, a passage's copy and its title, show once: the better); a
    RAG-Token candidate left behind by the ranking's branch and bound carries its upper bound."""
    rows = sorted(((gen.decode(t), lp, i in g.bounded) for i, (t, lp) in enumerate(g.candidates)),
                  key=lambda r: -r[1])
    out, seen = [], set()
    for text, lp, bounded in rows:
        if text.strip() not in seen:
            seen.add(text.strip())
            out.append({"text": text, "logprob": lp, **({"upper_bound": True} if bounded else {})})
    return out
