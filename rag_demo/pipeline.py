"""The question-answering pipeline: question in, `Answer` out, in four numbered steps.

    1 encode    the question with the mode's question encoder
    2 retrieve  the top K passages from the FAISS index, with scores and p(z|x)
      2b focus  (optional) the sentences of each passage the generator reads (focus.py), and
                the question as it reads it: cased as the passages write its words (truecase.py)
    3 generate  RAG-Sequence | RAG-Token | closed-book (engine.py)
    4 attribute per-token posterior over the K passages (engine.py)

Owns `RagPipeline` (a loaded stack + an index + default settings) and the answer flow; what an
answer is lives in answer.py, what a request costs in pricing.py. Swapping the index is the
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

from rag_demo.answer import (
    Answer, AnswerEvent, Listen, RetrievedDoc, cues, inspector_rows, kept_by, passage_drops, ranked_candidates, unread,
)
from rag_demo.confidence import judge, load_model
from rag_demo.config import RagSettings, StackSpec, check_mode, check_question
from rag_demo.knowledge.ann import expected_recall, settings_for
from rag_demo.knowledge.bm25 import BM25Retriever
from rag_demo.knowledge.building import IndexBuild
from rag_demo.knowledge.corpus import Corpus, Passage, load_vital_articles
from rag_demo.knowledge.hf_format import Knowledge
from rag_demo.knowledge.index import IndexInfo, PassageIndex, load_cached_index, load_or_build_index
from rag_demo.knowledge.retrievers import BM25WhileBuilding, DenseRetriever, choose
from rag_demo.models.cost import Cost, CostFit, CostModel, Speed, Timed
from rag_demo.models.generators import SharedPrefill
from rag_demo.models.stacks import LoadedStack, load_stack
from rag_demo.pricing import Pricing
from rag_demo.rag.engine import Generation, Partial, closed_book, rag_sequence, rag_token
from rag_demo.rag.marginalize import token_posteriors
from rag_demo.reader.reading import QUESTION_LP, passages_read, prompt, question_read, reader_for
from rag_demo.runs import Run  # noqa: F401 - re-exported: the pipeline's callers name it here too

Progress = Callable[[float | None, str], None]  # (fraction done or None, message)
# A corpus this small embeds in seconds: load() builds its index before answering, as it always did
# (the demo's uploads and fixture corpora); larger ones answer with BM25 while it is built.
BACKGROUND_MIN_PASSAGES = 1000
# The passages ranked just after the K read (K+1 .. K+NEAR_MISSES), shown greyed as "just missed".
NEAR_MISSES = 5


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


class RagPipeline(Pricing):
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
        build_gate: str | None = None,
    ) -> "RagPipeline":
        """Load the stack's models, then the index for `corpus` (Vital Articles by default), or
        use `knowledge` (a loaded knowledge dataset: its vectors and FAISS index as they are).
        `background_index`: a corpus of BACKGROUND_MIN_PASSAGES or more whose index is not
        cached is answered from at once, with BM25, while its dense index is built
        (`index_in_background`); `build_gate`: a file that build waits for before it completes
        (tests only).

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
        if background_index and (len(corpus) >= BACKGROUND_MIN_PASSAGES or build_gate):
            pipe.index_in_background(corpus, progress, rebuild_index, build_gate)
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
                            build_gate: str | None = None) -> IndexBuild | None:
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
        build = IndexBuild(corpus, encoder, spec.cache_dir, ann, rebuild, build_gate)
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
        for group in self.modes_by_encoder(modes, s.decoding.weights):
            r = self.retrieve(q, group[0], s.decoding.k, s.decoding.retriever, extra=NEAR_MISSES,
                              weights=s.decoding.weights)
            for event in self._from_passages(q, group, r.passages, r.scores, s, r.timings, run, listen, r.retriever):
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

    def _check_k(self, k: int) -> None:
        if k > len(self.index):
            raise ValueError(
                f"k={k} is more than the {len(self.index)} passages of corpus {self.index.corpus.name!r}: "
                f"choose k from 1 to {len(self.index)}."
            )

    # -- the stages, each a public entry point ---------------------------------
    def retrieve(self, question: str, mode: str = "token", k: int | None = None, retriever: str | None = None,
                 extra: int = 0, weights: str = "base") -> Retrieval:
        """Steps 1-2: encode the question with `mode`'s question encoder (of `weights`: the trained
        tower or the base one), then the top k passages (k and the retriever, "dense", "bm25" or
        "hybrid", default to the pipeline's settings) with their scores q(x)·d(z); `extra` more,
        ranked after them, go to `Retrieval.near`."""
        q = check_question(question)
        mm = self.stack.modes_for(weights)[check_mode(mode)]
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

    def passage_scores(self, question: str, mode: str, passages: list[Passage], weights: str = "base") -> torch.Tensor:
        """Retrieval scores q(x)·d(z) (K,) of given passages of this index (e.g. BM25's picks)
        under `mode`'s question encoder (of `weights`), as `retrieve` would have scored them."""
        encoder = self.stack.modes_for(weights)[check_mode(mode)].question_encoder
        qv = encoder.encode_questions([check_question(question)])  # (1, D)
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
        fed_for: dict[int, tuple[list[Passage], list[list[int]] | None, float]] = {}  # question encoder -> step 2b
        pairs = [(p.title, p.text) for p in passages]
        # step 2b: the question and the passages as the generator reads them (reader/reading.py)
        qg = question_read(s.aids, q, passages)
        models = self.stack.modes_for(s.decoding.weights)
        for mode in modes:
            mm = models[mode]
            key = id(mm.question_encoder)
            if key not in fed_for:
                t0 = time.perf_counter()
                encoder = mm.question_encoder
                fed, kept = passages_read(s.aids, lambda: encoder.encode_questions([q])[0], passages,  # (D,)
                                          self.stack.ctx_encoder)
                fed_for[key] = (fed, kept, time.perf_counter() - t0)
        # each mode priced before any runs, over the prompts it will read, from what the generators keep now
        expected = {m: self._expected(m, modes, [prompt(models[m].generator, qg, p, s.decoding, s.aids)
                                                 for p in fed_for[id(models[m].question_encoder)][0]], s)
                    for m in modes}
        for mode in modes:
            mm = models[mode]
            if id(mm.generator) not in shared:  # its model calls timed: the estimates follow the speed
                shared[id(mm.generator)] = SharedPrefill(Timed(mm.generator, self.cost_model, self.speed))
            gen = shared[id(mm.generator)]
            fed, kept, focus_s = fed_for[id(mm.question_encoder)]
            # the retriever's logits scale * q(x)·d(z) over the K passages; the doc log-prior is made
            # from them in the engine (rag.engine.prefill), where a reader aid may add the generator's vote
            logits = torch.as_tensor(scores, dtype=torch.float32) * mm.score_scale  # (K,)
            prompts = [prompt(gen, qg, p, s.decoding, s.aids) for p in fed]
            engine = rag_token if mode == "token" else rag_sequence
            reader = reader_for(s.aids, s.decoding, gen, qg, fed, prompts, pairs)

            retriever = torch.softmax(logits / s.decoding.prior_temperature, 0)  # (K,) the retriever's own p(z|x)

            def docs_of(log_prior: torch.Tensor, question_lp: torch.Tensor | None) -> list[RetrievedDoc]:
                prior = log_prior.exp()  # (K,) p(z|x) as the engine used it
                return [
                    RetrievedDoc(i + 1, p.id, p.title, p.text, p.url, float(scores[i]), float(prior[i]),
                                 float(retriever[i]),
                                 read_sentences=None if kept is None else kept[i],
                                 question_logprob=None if question_lp is None else float(question_lp[i]))
                    for i, p in enumerate(passages)
                ]

            emit = self._emitter(q, gen, listen, lambda part: docs_of(part.prior, None))
            if listen is not None:
                listen(self.reading(q, mode, len(passages)))
            g = engine(run.gated(gen), prompts, logits, s.decoding, reader, run.stop_for(mode), emit)  # steps 3 and 4
            docs = docs_of(g.prior, g.extras.get(QUESTION_LP))
            t = dict(timings or {"encode": 0.0, "retrieve": 0.0})
            if kept is not None:  # sentences were chosen: the time it took
                t["focus"] = focus_s
            answer = self._answer(q, mode, gen, g, docs, t, s, qg, cues(q, mm, scores))
            answer.retriever, answer.expected_seconds = retrieved_by, expected[mode]
            yield AnswerEvent(mode, True, answer)

    def _closed_book(self, q: str, s: RagSettings, run: Run, listen: Listen | None) -> Answer:
        gen = Timed(self.stack.modes_for(s.decoding.weights)["closed-book"].generator, self.cost_model, self.speed)
        emit = self._emitter(q, gen, listen, lambda part: [])
        if listen is not None:
            listen(self.reading(q, "closed-book", 0))
        qg = question_read(s.aids, q)  # no passages: only the first letter and "?"
        cb = prompt(gen, qg, None, s.decoding, s.aids)
        expected = self._expected("closed-book", ["closed-book"], [cb], s)
        reader = reader_for(s.aids, s.decoding, gen, qg, [], [cb], closed_book=True)
        g = closed_book(run.gated(gen), cb, s.decoding, reader, run.stop_for("closed-book"), emit)
        answer = self._answer(q, "closed-book", gen, g, [], {"encode": 0.0, "retrieve": 0.0}, s, qg, cues(q))
        answer.expected_seconds = expected
        return answer

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
            candidates=ranked_candidates(gen, g),
            stopped=g.stopped, fell_back=g.fell_back, inspector=inspector_rows(gen, g, shown),
            passage_drop=passage_drops(mode, g),
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

    WARM_UP_QUESTION = "What is the capital of France?"

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


