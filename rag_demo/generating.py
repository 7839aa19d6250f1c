"""Steps 2b-4 of a question over its passages, as `Answer`s: what the generator reads (the aids'
step 2b), the engine's decoding (step 3: rag.engine) and the attribution (step 4), then what a
card shows beside it (answer.py: candidates, the inspector, passage drops, cues) and the
confidence (confidence.py). A `RagPipeline` (pipeline.py) holds one `Generating`.

    2b read       the question as the generator reads it, each passage's sentences, the prompts
    3 generate    RAG-Sequence | RAG-Token | closed-book (rag/engine.py)
    4 attribute   per-token posterior over the K passages (rag/engine.py)
"""
from __future__ import annotations

import time
from typing import Any, Iterator

import torch

from rag_demo.answer import (
    Answer, AnswerEvent, Listen, RetrievedDoc, cues, inspector_rows, kept_by, passage_drops, ranked_candidates, unread,
)
from rag_demo.confidence import judge, outside_fit
from rag_demo.config import RagSettings
from rag_demo.knowledge.corpus import Passage
from rag_demo.models.cost import Timed
from rag_demo.models.generators import SharedPrefill
from rag_demo.rag.engine import Generation, rag_sequence, rag_token
from rag_demo.rag.engine import closed_book as run_closed_book
from rag_demo.reader.reading import QUESTION_LP, passages_read, prompt, question_read, reader_for
from rag_demo.runs import Run
from rag_demo.streaming import emitter, reading


class Generating:
    """Steps 2b-4 for a pipeline (its stack, index, cost model, speed and confidence model)."""

    def __init__(self, pipe: Any) -> None:
        self.pipe = pipe

    def where(self) -> tuple[str, str]:
        """(stack, corpus): the provenance every answer dict names."""
        return self.pipe.stack.name, self.pipe.index.corpus.name

    def from_passages(self, q: str, modes: list[str], passages: list[Passage], scores: torch.Tensor, s: RagSettings,
                       timings: dict | None, run: Run, listen: Listen | None, retrieved_by: str = ""
                       ) -> Iterator[AnswerEvent]:
        """Steps 2b-4 of the RAG modes over these passages, each mode's Answer as an event."""
        shared: dict[int, SharedPrefill] = {}
        fed_for: dict[int, tuple[list[Passage], list[list[int]] | None, float]] = {}  # question encoder -> step 2b
        pairs = [(p.title, p.text) for p in passages]
        # step 2b: the question and the passages as the generator reads them (reader/reading.py)
        qg = question_read(s.aids, q, passages)
        models = self.pipe.stack.modes_for(s.decoding.weights)
        for mode in modes:
            mm = models[mode]
            key = id(mm.question_encoder)
            if key not in fed_for:
                t0 = time.perf_counter()
                encoder = mm.question_encoder
                fed, kept = passages_read(s.aids, lambda: encoder.encode_questions([q])[0], passages,  # (D,)
                                          self.pipe.stack.ctx_encoder)
                fed_for[key] = (fed, kept, time.perf_counter() - t0)
        # each mode priced before any runs, over the prompts it will read, from what the generators keep now
        expected = {m: self.pipe.pricing.expected_for(m, modes, [prompt(models[m].generator, qg, p, s.decoding, s.aids)
                                                 for p in fed_for[id(models[m].question_encoder)][0]], s)
                    for m in modes}
        for mode in modes:
            mm = models[mode]
            if id(mm.generator) not in shared:  # its model calls timed: the estimates follow the speed
                shared[id(mm.generator)] = SharedPrefill(Timed(mm.generator, self.pipe.cost_model, self.pipe.speed))
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

            emit = emitter(q, gen, listen, lambda part: docs_of(part.prior, None), self.where())
            if listen is not None:
                listen(reading(q, mode, len(passages), self.where()))
            gated = run.gated(gen)
            try:
                g = engine(gated, prompts, logits, s.decoding, reader, run.stop_for(mode), emit)  # steps 3 and 4
            finally:
                leave(gated)
            docs = docs_of(g.prior, g.extras.get(QUESTION_LP))
            t = dict(timings or {"encode": 0.0, "retrieve": 0.0})
            if kept is not None:  # sentences were chosen: the time it took
                t["focus"] = focus_s
            answer = self.make_answer(q, mode, gen, g, docs, t, s, qg, cues(q, mm, scores))
            answer.retriever, answer.expected_seconds = retrieved_by, expected[mode]
            answer.time_share_s = run.seconds.get(mode)
            yield AnswerEvent(mode, True, answer)

    def closed_book(self, q: str, s: RagSettings, run: Run, listen: Listen | None) -> Answer:
        gen = Timed(self.pipe.stack.modes_for(s.decoding.weights)["closed-book"].generator, self.pipe.cost_model, self.pipe.speed)
        emit = emitter(q, gen, listen, lambda part: [], self.where())
        if listen is not None:
            listen(reading(q, "closed-book", 0, self.where()))
        qg = question_read(s.aids, q)  # no passages: only the first letter and "?"
        cb = prompt(gen, qg, None, s.decoding, s.aids)
        expected = self.pipe.pricing.expected_for("closed-book", ["closed-book"], [cb], s)
        reader = reader_for(s.aids, s.decoding, gen, qg, [], [cb], closed_book=True)
        gated = run.gated(gen)
        try:
            g = run_closed_book(gated, cb, s.decoding, reader, run.stop_for("closed-book"), emit)
        finally:
            leave(gated)
        answer = self.make_answer(q, "closed-book", gen, g, [], {"encode": 0.0, "retrieve": 0.0}, s, qg, cues(q))
        answer.expected_seconds = expected
        answer.time_share_s = run.seconds.get("closed-book")
        return answer

    def make_answer(self, q, mode, gen, g: Generation, docs: list[RetrievedDoc], timings: dict, s: RagSettings,
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
            stack=self.pipe.stack.name, corpus=self.pipe.index.corpus.name,
            candidates=ranked_candidates(gen, g),
            stopped=g.stopped, fell_back=g.fell_back, inspector=inspector_rows(gen, g, shown),
            passage_drop=passage_drops(mode, g),
            read_question="" if read_q == q else read_q, settings=s.to_dict(),
            cues=(cues or []) + unread(text, docs, g.stopped), kept=kept_by(gen),
        )
        self.judge(answer)
        return answer

    def judge(self, a: Answer) -> None:
        """Set the answer's signals and confidence, and add the "probably wrong" cue below the
        model's threshold (rag_demo/confidence.py)."""
        view = {"mode": a.mode, "stack": a.stack, "settings": a.settings, "text": a.text, "token_ids": a.token_ids,
                "question": a.question, "inspector": a.inspector,
                "sequence_logprob": a.sequence_logprob, "stopped": a.stopped, "candidates": a.candidates,
                "doc_posterior": a.doc_posterior,
                "docs": [{"prior": d.prior, "score": d.score, "title": d.title, "text": d.text} for d in a.docs]}
        a.signals, a.confidence, cue = judge(view, self.pipe.confidence_model)
        model = self.pipe.confidence_model
        a.confidence_model = None if model is None else model.quoted(a.stack, a.settings["preset"], a.mode)
        if a.confidence_model is not None:
            weights = getattr(self.pipe.stack, "weights", None)
            rag = a.mode != "closed-book"  # closed-book reads no K, retriever or corpus
            corpus = f"{self.pipe.index.corpus.name} ({len(self.pipe.index):,} passages)" if rag else ""
            a.confidence_model["outside"] = outside_fit(model.about if rag else {}, a.settings.get("k") if rag else None,
                                                        (a.retriever or "") if rag else "", corpus,
                                                        weights is None or weights.measured)
        if cue is not None:
            a.cues.insert(0, cue)


def leave(gen: Any) -> None:
    """Tell a shared model (runs.Run.share) that this mode will ask for no more steps, so no batch
    waits for it."""
    done = getattr(gen, "leave", None)
    if callable(done):
        done()
