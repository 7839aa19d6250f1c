"""What a request costs, before it runs: the worst case the server's budget counts
(`estimate`, `check_budget`) and what a card expects (`expect`), both from models/cost.py's
CostModel at the speed the generator runs now. `RagPipeline` (pipeline.py) holds one `Pricing`.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from rag_demo.config import RagSettings, check_mode, check_question
from rag_demo.knowledge.corpus import Passage
from rag_demo.models.cost import Cost, model_dims
from rag_demo.reader.reading import drafts_of, passages_read, prompt, question_read


class Pricing:
    """A pipeline's prices: read from its stack, index, cost model, speed and cost fit, with a memo
    of the estimates made."""

    def __init__(self, pipe: Any) -> None:
        self.pipe = pipe
        self._estimates: dict[tuple, Cost] = {}

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
        s = (settings or self.pipe.settings).merged(**overrides)
        if passages is not None:  # what is kept changes from one request to the next: not memoised
            return self._estimate(q, modes, s, passages)
        key = (q, tuple(modes), s, id(self.pipe.cost_model), len(self.pipe.index), round(self.pipe.speed.factor, 1))
        if key not in self._estimates:
            if len(self._estimates) > 256:  # a bounded memo: a new question seldom repeats an old one
                self._estimates.clear()
            self._estimates[key] = self._estimate(q, modes, s)
        return dataclasses.replace(self._estimates[key])  # a copy: callers mark it heavy

    def _estimate(self, q: str, modes: list[str], s: RagSettings, passages: list[Passage] | None = None) -> Cost:
        q = question_read(s.aids, q, passages or [])  # "?" added: what the generator reads
        k = min(s.decoding.k, len(self.pipe.index)) if passages is None else len(passages)
        seconds, peak, per_mode = 0.0, 0, {}
        longest = Passage("estimate", "Title", "word " * (4 * s.decoding.max_doc_tokens))
        lengths: dict[tuple[int, bool], tuple[int, int]] = {}  # (generator, with a passage) -> (prompt, kept) tokens
        models = self.pipe.stack.modes_for(s.decoding.weights)
        for mode in [check_mode(m) for m in modes]:
            gen = models[mode].generator
            key = (id(gen), mode != "closed-book")
            if key not in lengths:  # RAG-Token and RAG-Sequence share a generator and its prompt
                if key[1] and passages is not None:  # these passages' own prompts, less what is kept of them
                    prompts = [prompt(gen, q, p, s.decoding, s.aids) for p in passages]
                    lengths[key] = (max(len(p) for p in prompts), gen.cached_tokens(prompts))
                else:  # the longest a passage can make it
                    lengths[key] = (len(prompt(gen, q, longest if key[1] else None, s.decoding, s.aids)), 0)
            prompt_tokens, cached = lengths[key]
            drafts = "none"
            if mode == "token" and drafts_of(s.aids):
                # the same generator answering RAG-Sequence in this request drafts for both (rag.engine.doc_searches)
                shared = "sequence" in modes and models["sequence"].generator is gen
                drafts = "shared" if shared else "own"
            # the aids that run the model again: echo retries decode again, context contrast reads the
            # prompt without passages beside every row (reader/retries.py, reader/contrast.py)
            contrast = (len(prompt(gen, q, None, s.decoding, s.aids)) if s.aids.context_contrast and key[1] else 0)
            sec, byt = self.pipe.cost_model.request(model_dims(gen), mode, k, s.decoding.num_beams,
                                                    s.decoding.max_new_tokens, prompt_tokens,
                                               thorough=s.decoding.sequence_decoding == "thorough", drafts=drafts,
                                               cached_tokens=cached, retries=s.aids.echo_retries,
                                               contrast_tokens=contrast)
            sec *= self.pipe.speed.factor  # at the speed the generator runs now
            per_mode[mode] = sec
            seconds += sec
            peak = max(peak, byt)
        return Cost(seconds, peak, per_mode)

    def check_budget(self, question: str, modes: list[str], settings: RagSettings | None, budget: Any,
                     passages: list[Passage] | None = None, **overrides) -> Cost:
        """The request's Cost (`heavy` set from the budget), or a ValueError that says what was
        asked, what it would cost and what to change; `passages`: answered over these (a passage
        taken away, a card answered again), priced with their own prompts."""
        s = (settings or self.pipe.settings).merged(**overrides)
        cost = self.estimate(question, modes, s, passages)
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

    def expect(self, question: str, modes: list[str], settings: RagSettings | None = None) -> dict[str, float]:
        """Seconds each mode is expected to take for `question` as answers usually run (not the
        worst case `estimate` prices for the budget): its passages retrieved (milliseconds) and its
        prompts priced with what the generator keeps now, so a re-ask is priced as one."""
        q = check_question(question)
        s = settings or self.pipe.settings
        out: dict[str, float] = {}
        models = self.pipe.stack.modes_for(s.decoding.weights)
        for group in self.pipe.modes_by_encoder(modes, s.decoding.weights):
            r = self.pipe.retrieve(q, group[0], min(s.decoding.k, len(self.pipe.index)), s.decoding.retriever,
                              weights=s.decoding.weights)
            qg = question_read(s.aids, q, r.passages)
            encoder = models[group[0]].question_encoder  # priced over what it will read
            fed = passages_read(s.aids, lambda: encoder.encode_questions([q])[0], r.passages, self.pipe.stack.ctx_encoder)[0]
            for m in group:
                gen = models[m].generator
                out[m] = self.expected_for(m, modes, [prompt(gen, qg, p, s.decoding, s.aids) for p in fed], s)
        if "closed-book" in modes:
            gen = models["closed-book"].generator
            qg = question_read(s.aids, q)
            out["closed-book"] = self.expected_for("closed-book", modes, [prompt(gen, qg, None, s.decoding, s.aids)], s)
        return {m: out[m] for m in modes if m in out}

    def expected_for(self, mode: str, modes: list[str], prompts: list, s: RagSettings) -> float:
        """The seconds `mode` is expected to take over these prompts (`CostModel.expected`), at the
        speed the generator runs now, priced from what it keeps now."""
        models = self.pipe.stack.modes_for(s.decoding.weights)
        gen = models[mode].generator
        drafts = "none"
        if mode == "token" and drafts_of(s.aids):
            shared = "sequence" in modes and models["sequence"].generator is gen
            drafts = "shared" if shared else "own"
        d = s.decoding
        return self.pipe.speed.factor * self.pipe.cost_model.expected(
            model_dims(gen), mode, len(prompts), d.num_beams, d.max_new_tokens, max(len(p) for p in prompts),
            self.pipe.cost_fit, s.preset, thorough=d.sequence_decoding == "thorough", drafts=drafts,
            cached_tokens=gen.cached_tokens(prompts), prompts_kept=gen.prompts_kept(prompts))


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
