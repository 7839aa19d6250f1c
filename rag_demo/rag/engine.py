"""The paper's algorithms: RAG-Token, RAG-Sequence (thorough and fast) and closed-book (Lewis et al.
2020, §2), over any generator, with the reader's hooks marked where the aids attach.

For one question whose K passage prompts and retrieval scores are known, this module runs
steps 3 (generate) and 4 (attribute) of the pipeline on token ids, so the parity tests can feed
it exactly what they feed transformers' RAG classes. With `reader=PAPER` (rag_demo.rag.hooks)
every hook leaves the algorithm as the paper writes it; rag_demo/reader/ attaches the aids.

    RAG-Token      p(y|x) = Π_i Σ_z p(z|x) p(y_i | x, z, y_<i)   the prior at every token
    RAG-Sequence   p(y|x) = Σ_z p(z|x) Π_i p(y_i | x, z, y_<i)   the prior once per answer
    closed-book    p(y|x) = Π_i p(y_i | x, y_<i)                 no passages

Attribution (docs/DESIGN.md §3.5): greedy decoding records each doc's log-prob of every chosen
token as it goes (no second pass); beam search and fast RAG-Sequence score the final answer in
one teacher-forced pass under each doc, reusing the prefill KV cache; thorough RAG-Sequence
already has that pass (its rescoring) and reuses it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from rag_demo.config import Decoding
from rag_demo.models.generators import Generator, GenState
from rag_demo.models.stopping import as_rule
from rag_demo.rag.decoding import Hyp, Rows, Step, score_candidates, search
from rag_demo.rag.hooks import PAPER, Prefilled, Reader, Search, Stop
from rag_demo.rag.marginalize import (
    rag_sequence_logprob,
    rag_token_logprob,
    sequence_posteriors,
    token_posteriors,
)


@dataclass
class Generation:
    """What one mode produced for one question (token level; the pipeline adds text)."""

    tokens: list[int]  # the answer's generated ids (EOS included if emitted, no start token)
    logprob: float  # log p(y|x) under the mode's model
    decoding: str  # what ran, e.g. "greedy", "beam=4", "thorough, greedy"
    doc_lp: torch.Tensor | None = None  # (K, T) log p(y_t | x, z, y_<t)
    posteriors: torch.Tensor | None = None  # (T, K) per-token doc posterior
    doc_posterior: torch.Tensor | None = None  # (K,) RAG-Sequence: p(z | x, y)
    # RAG-Sequence, and RAG-Token when a reader aid weighed more: (tokens, log p(y|x) as the mode ranked them)
    candidates: list[tuple[list[int], float]] = field(default_factory=list)
    prior: torch.Tensor | None = None  # (K,) the log p(z|x) every formula above used
    # what the reader's hooks add, by name (the prior's and the chooser's extras; paper: nothing)
    extras: dict = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)  # seconds: generate, attribute
    stopped: str = "eos"  # why the answer ended: "eos", "max_new_tokens", "time_limit", "cancelled"
    inspection: Inspection | None = None  # RAG modes: the token inspector's tables (`inspect_answer`)
    # what a stop made the mode run instead of what its settings name ("" when nothing):
    # FAST_RANKING, NO_DRAFTS
    fell_back: str = ""


# Generation.fell_back: thorough RAG-Sequence stopped before its rescoring, so the fast ranking stands
FAST_RANKING = "fast_ranking"
# Generation.fell_back: RAG-Token's passage drafts were not weighed, so the mixture's own answer stands
NO_DRAFTS = "no_drafts"


@dataclass
class Inspection:
    """What each doc would have said at every step of the answer (the token inspector).

    doc_top_ids / doc_top_lp (K, T, n): the n most likely next tokens under p(. | x, z, y_<t)
    and their log-probs, for every doc z and answer position t; mix_top_ids / mix_top_lp (T, n):
    the same under RAG-Token's mixture sum_z p(z|x) p(. | x, z, y_<t) (None for RAG-Sequence,
    whose model mixes whole answers, not next tokens)."""

    doc_top_ids: torch.Tensor  # (K, T, n)
    doc_top_lp: torch.Tensor  # (K, T, n)
    mix_top_ids: torch.Tensor | None = None  # (T, n)
    mix_top_lp: torch.Tensor | None = None  # (T, n)


INSPECT_TOP = 3  # next tokens per doc and position the token inspector shows


@torch.inference_mode()
def inspect_answer(gen: Generator, state: GenState, first_lp: torch.Tensor, tokens: list[int],
                   prior: torch.Tensor | None, n: int = INSPECT_TOP) -> Inspection:
    """One teacher-forced pass of the answer y under each of the K prefilled docs (the prefill
    state is copied, not consumed): at every position t the top-n of p(. | x, z, y_<t) per doc,
    and, given the log-prior (K,), the top-n of the RAG-Token mixture
    log sum_z exp(log p(z|x) + log p(. | x, z, y_<t)). Costs T-1 tokens through K rows."""
    return inspect_and_score(gen, state, first_lp, tokens, prior, n)[0]


@torch.inference_mode()
def inspect_and_score(gen: Generator, state: GenState, first_lp: torch.Tensor, tokens: list[int],
                      prior: torch.Tensor | None, n: int = INSPECT_TOP) -> tuple[Inspection, torch.Tensor]:
    """`inspect_answer`, and from the same pass each doc's log-prob of every answer token,
    (K, T): what `score_candidates` of the answer alone gives, without a second pass."""
    K, T = first_lp.shape[0], len(tokens)
    top_ids, top_lp = torch.zeros((K, T, n), dtype=torch.long), torch.zeros((K, T, n))  # (K, T, n)
    mix_ids = torch.zeros((T, n), dtype=torch.long) if prior is not None else None  # (T, n)
    mix_lp = torch.zeros((T, n)) if prior is not None else None  # (T, n)
    doc_lp = torch.zeros((K, T))  # (K, T) log p(y_t | x, z, y_<t)
    ids = torch.tensor(tokens, dtype=torch.long)  # (T,)

    def record(a: int, lp: torch.Tensor) -> None:  # lp (K, l, V): positions a..a+l-1
        v, i = lp.topk(n, dim=-1)  # (K, l, n)
        top_lp[:, a: a + lp.shape[1]], top_ids[:, a: a + lp.shape[1]] = v, i
        want = ids[a: a + lp.shape[1]].view(1, -1, 1).expand(K, -1, 1)  # (K, l, 1) the answer's tokens
        doc_lp[:, a: a + lp.shape[1]] = lp.gather(2, want).squeeze(2)  # (K, l)
        if prior is not None:
            mixed = torch.logsumexp(prior.view(K, 1, 1) + lp, dim=0)  # (l, V): log p(. | x, y_<t) of RAG-Token
            mv, mi = mixed.topk(n, dim=-1)  # (l, n)
            mix_lp[a: a + lp.shape[1]], mix_ids[a: a + lp.shape[1]] = mv, mi

    if T:
        record(0, first_lp.float().unsqueeze(1))  # position 0: the prefill's own next-token log-probs
    if T > 1:
        st = gen.select(state, torch.arange(K))  # a copy: the answer's tokens are fed to it
        for a, lp in gen.advance_slices(st, torch.tensor([tokens[:-1]] * K)):  # (K, l, V)
            record(a + 1, lp)
    return Inspection(top_ids, top_lp, mix_ids, mix_lp), doc_lp


@dataclass
class Partial:
    """An answer while it is being decoded (streaming), handed to `on_partial` after every step.

    mode: "token", "sequence" or "closed-book". tokens: RAG-Sequence, one draft per doc (the
    candidate each passage's own search is writing); otherwise one list, the answer so far
    (beam search: its current best hypothesis). doc_lp: RAG-Token greedy, each doc's log-prob
    of every token so far (K, t), so the attribution of a partial answer is the final one's
    prefix. prior: log p(z|x) (K,) as the engine uses it. done: per draft, whether it ended.
    phase: "decoding", or "rescoring" (thorough RAG-Sequence, drafts done, scoring each under
    every doc)."""

    mode: str
    tokens: list[list[int]]
    doc_lp: torch.Tensor | None
    prior: torch.Tensor | None
    done: list[bool]
    phase: str = "decoding"


OnPartial = Callable[[Partial], None]


def prefill(gen: Generator, prompts: list[list[int]], doc_scores: torch.Tensor, d: Decoding, reader: Reader,
            stop: Stop | None = None) -> Prefilled:
    """Run the K passage prompts (steps 3's start) and form the doc log-prior.

    log p(z|x) = log_softmax_z(doc_scores_z / T): doc_scores = scale · q(x)·d(z), the retriever's
    logits; T = d.prior_temperature. The reader's `prior` hook may add its own evidence read
    from the same prefill (the paper's prior is the retriever's alone)."""
    first_lp, state = gen.prefill(prompts, keep_prompt_logprobs=reader.keep_prompt_logprobs)  # (K, V)
    logits = torch.as_tensor(doc_scores, dtype=torch.float32)  # (K,)
    # the doc log-prior enters here, once, for every formula below
    prompt_lp = state.prompt_lp if reader.keep_prompt_logprobs else None  # (K, n) the prompt tokens the hook asked for
    prior, extras = reader.prior(logits, prompt_lp, d.prior_temperature)  # (K,)
    return Prefilled(gen, prompts, first_lp, state, prior, gen.stop_token_ids(d.answer_style), d, stop, reader,
                     extras)


def rag_token(gen: Generator, prompts: list[list[int]], doc_scores: torch.Tensor, d: Decoding,
              reader: Reader = PAPER, stop: Stop | None = None, on_partial: OnPartial | None = None) -> Generation:
    """RAG-Token: a search over the mixture p(y_i|x,y_<i) = Σ_z p(z|x) p(y_i|x,z,y_<i), K caches per beam.

    prompts: K passage-conditioned inputs; doc_scores (K,): the retriever's logits; stop: asked
    between steps, a reason (deadline, cancel) ends decoding where it is; on_partial: streaming,
    a `Partial` after every decoding step. The answer is the search's best beam unless the
    reader's `choose_token` weighs more candidates."""
    t0 = time.perf_counter()
    q = prefill(gen, prompts, doc_scores, d, reader, stop)
    K = len(prompts)
    # The prefill state is read again afterwards (beam search scores its winner from it; a reader
    # hook may decode again from it). Beam search never writes the state it is given (its first
    # reorder copies each row once per beam); greedy records attribution as it goes and writes it,
    # so it runs on a copy only when a hook needs the state (copying BART's cross-attention cache
    # costs more than a step).
    state = gen.select(q.state0, torch.arange(K)) if d.num_beams == 1 and reader.keeps_prefill else q.state0
    rows = Rows(gen, state, per_beam=K, prior=q.prior, processors=reader.processors(q, "mixture", [0]))
    step = _streaming(on_partial, "token", q.prior)
    hyps = search(rows, q.first_lp, 1, d, q.ends, stop, step, top_n=INSPECT_TOP)  # one group of B beams
    mixture = reader.review(Search(q, "mixture", rows, step, INSPECT_TOP), hyps)[0]
    choice = reader.choose_token(q, mixture) if not rows.stopped else PAPER.choose_token(q, mixture)
    best = choice.best
    t1 = time.perf_counter()
    doc_lp = choice.doc_lp  # (K, T) when the choice scored the answer under every doc
    if doc_lp is None and best.row_lp is not None:  # greedy recorded each doc's log-prob of every chosen token
        doc_lp = best.row_lp  # (K, T)
    if best.top is not None:  # greedy recorded the inspector's tables while decoding
        inspection = Inspection(*best.top)
    elif doc_lp is None and best.tokens:  # beam search: one teacher-forced pass gives both
        inspection, doc_lp = inspect_and_score(gen, q.state0, q.first_lp, best.tokens, q.prior)  # doc_lp (K, T)
    else:  # another candidate: one teacher-forced pass from the prefill state
        inspection = inspect_answer(gen, q.state0, q.first_lp, best.tokens, q.prior)
    if doc_lp is None:  # an empty answer: scored as before (its pad position)
        doc_lp = score_candidates(gen, q.state0, q.first_lp, [best.tokens], gen.pad_token_id)[0][:, 0]  # (K, T)
    logprob = float(rag_token_logprob(doc_lp, q.prior))  # Σ_i log Σ_z p(z|x) p(y_i|x,z,y_<i)
    out = Generation(best.tokens, logprob, _decoding_name(d) + choice.note, doc_lp, token_posteriors(doc_lp, q.prior),
                     candidates=choice.candidates, prior=q.prior, inspection=inspection, fell_back=choice.fell_back,
                     extras={**q.extras, **choice.extras})
    out.timings = {"generate": t1 - t0, "attribute": time.perf_counter() - t1}
    out.stopped = _stopped(best.tokens, rows.stopped, q.ends, d)
    return out


def doc_searches(q: Prefilled, on_step=None) -> tuple[list[list[Hyp]], str | None]:
    """RAG-Sequence's candidates: a search under p(y|x,z) for each of the K passages alone (its
    group z), each group's hypotheses best first (the sets H_z), with the reader's own candidates
    of each passage added; -> (H_z for each z, why a stop cut them short or None).

    The two RAG modes read the same prompts with the same generator; a generator that shares
    work within a question (models.generators.SharedPrefill) runs these searches once for both,
    for equal readers and decodings."""
    def run() -> tuple[list[list[Hyp]], str | None]:
        K = q.first_lp.shape[0]
        groups = list(range(K))
        # a beam search copies the rows at its first reorder; greedy would write the shared state
        state = q.state0 if q.d.num_beams > 1 else q.gen.select(q.state0, torch.arange(K))
        rows = Rows(q.gen, state, per_beam=1, prior=None, processors=q.reader.processors(q, "per_doc", groups))
        hyps = search(rows, q.first_lp, K, q.d, q.ends, q.stop, on_step)
        hyps = q.reader.review(Search(q, "per_doc", rows), hyps)  # a search run again does not stream
        if not rows.stopped:
            hyps = q.reader.candidates(q, hyps)
        return hyps, rows.stopped

    share = getattr(q.gen, "shared", None)
    if share is None:
        return run()
    d = q.d
    key = ("doc_searches", tuple(map(tuple, q.prompts)), d.num_beams, d.max_new_tokens, d.length_penalty,
           d.answer_style, tuple(q.ends), q.reader.key)
    return share(key, run)


def rag_sequence(gen: Generator, prompts: list[list[int]], doc_scores: torch.Tensor, d: Decoding,
                 reader: Reader = PAPER, stop: Stop | None = None, on_partial: OnPartial | None = None
                 ) -> Generation:
    """RAG-Sequence: p(y|x) = Σ_z p(z|x) Π_i p(y_i|x,z,y_<i).

    Candidates come from a search under each passage (`doc_searches`). "thorough": every
    candidate is rescored under every passage and marginalised. "fast" (paper §2.5): p(y|x,z) is
    taken as 0 for passages whose search did not produce y, so no extra passes; the winner is
    then scored under all passages once, for its log p(y|x) (the candidates list keeps the fast
    scores that ranked them) and the attribution.

    Thorough candidates are ranked by `reader.sequence_scores` (the paper's marginal; the parity
    checks give a reader with transformers' convention, measure/reference.py). Other arguments as
    in `rag_token`; the Partial holds the K drafts, one per passage."""
    t0 = time.perf_counter()
    q = prefill(gen, prompts, doc_scores, d, reader, stop)
    K = len(prompts)
    hyps, stopped = doc_searches(q, _streaming(on_partial, "sequence", q.prior))
    cands = dedupe([h for group in hyps for h in group])
    if on_partial is not None and d.sequence_decoding == "thorough" and not stopped:
        on_partial(Partial("sequence", [group[0].tokens if group else [] for group in hyps], None, q.prior,
                           [True] * K, phase="rescoring"))
    name = f"{d.sequence_decoding}, {_decoding_name(d)}"
    lp, inspection, fell_back = None, None, ""
    if d.sequence_decoding == "thorough" and not stopped:
        lp, mask = score_candidates(gen, q.state0, q.first_lp, [h.tokens for h in cands], gen.pad_token_id,
                                    stop=stop)  # (K, C, T)
        if stop is not None and (reason := stop()):  # rescoring cut short: its numbers are incomplete
            stopped, lp = reason, None
    if lp is not None:  # thorough: every candidate under every passage
        scores = reader.sequence_scores(lp.permute(1, 0, 2), q.prior, mask, gen, [h.tokens for h in cands])  # (C,)
        win = int(torch.argmax(scores))
        t1 = time.perf_counter()
        doc_lp = lp[:, win, : len(cands[win].tokens)]  # (K, T)
        logprob = float(scores[win])  # log p(y|x): the candidate's score over all K docs
    else:  # fast decoding, or thorough stopped by its deadline: no rescoring passes
        if d.sequence_decoding == "thorough":
            name, fell_back = f"fast (thorough stopped: {stopped}), {_decoding_name(d)}", FAST_RANKING
        scores = _fast_scores(hyps, cands, q.prior)  # (C,)
        win = int(torch.argmax(scores))
        t1 = time.perf_counter()
        if cands[win].tokens:  # the inspector's pass scores the winner under every doc too
            inspection, doc_lp = inspect_and_score(gen, q.state0, q.first_lp, cands[win].tokens, None)  # (K, T)
        else:
            lp, _ = score_candidates(gen, q.state0, q.first_lp, [cands[win].tokens], gen.pad_token_id)  # (K, 1, T)
            doc_lp = lp[:, 0]  # (K, T)
        # the fast score chose the winner, but leaves out the docs that did not produce it: the
        # answer's log p(y|x) is the sum over all K (the posteriors below divide by it)
        logprob = float(rag_sequence_logprob(doc_lp, q.prior))  # ()
    post = sequence_posteriors(doc_lp, q.prior)  # (T, K)
    out = Generation(
        cands[win].tokens, logprob, name, doc_lp, post, post[-1],
        [(h.tokens, float(sc)) for h, sc in zip(cands, scores)], prior=q.prior, extras=dict(q.extras),
        inspection=inspection or inspect_answer(gen, q.state0, q.first_lp, cands[win].tokens, None),
        fell_back=fell_back,
    )
    out.timings = {"generate": t1 - t0, "attribute": time.perf_counter() - t1}
    out.stopped = _stopped(out.tokens, stopped, q.ends, d)
    return out


def closed_book(gen: Generator, prompt: list[int], d: Decoding, reader: Reader = PAPER, stop: Stop | None = None,
                on_partial: OnPartial | None = None) -> Generation:
    """The generator alone, no passages (the paper's parametric-only baseline):
    log p(y|x) = Σ_i log p(y_i | x, y_<i), the search's own score. Arguments as in `rag_token`."""
    t0 = time.perf_counter()
    first_lp, state0 = gen.prefill([prompt])  # (1, V)
    q = Prefilled(gen, [prompt], first_lp, state0, None, gen.stop_token_ids(d.answer_style), d, stop, reader)
    # a hook may search again from state0: greedy, which writes its state, runs on a copy
    state = gen.select(state0, torch.arange(1)) if reader.keeps_prefill and d.num_beams == 1 else state0
    rows = Rows(gen, state, per_beam=1, prior=None, processors=reader.processors(q, "closed_book", [0]))
    step = _streaming(on_partial, "closed-book", None)
    hyps = search(rows, first_lp, 1, d, q.ends, stop, step)
    best = reader.review(Search(q, "closed_book", rows, step), hyps)[0][0]
    out = Generation(best.tokens, best.logprob, _decoding_name(d))
    out.timings = {"generate": time.perf_counter() - t0, "attribute": 0.0}
    out.stopped = _stopped(best.tokens, rows.stopped, q.ends, d)
    return out


def _streaming(on_partial: OnPartial | None, mode: str, prior: torch.Tensor | None):
    """The search's on_step for streaming: each Step made into this mode's Partial (None: nobody listens)."""
    if on_partial is None:
        return None

    def step(st: Step) -> None:
        doc_lp = None
        if mode == "token" and st.row_lp is not None:
            doc_lp = st.row_lp[0, :, : len(st.tokens[0])]  # (K, t) greedy: each doc's log-prob of every token
        on_partial(Partial(mode, st.tokens, doc_lp, prior, st.done))
    return step


def _decoding_name(d: Decoding) -> str:
    return "greedy" if d.num_beams == 1 else f"beam={d.num_beams}"


def _stopped(tokens: list[int], early: str | None, ends: list[int], d: Decoding) -> str:
    """Why an answer ended: its own end (EOS, or a short answer's stop token), a stop reason, or
    the token limit."""
    if tokens and as_rule(ends).ends_at(tokens, len(tokens) - 1):
        return "eos"
    if early:
        return early
    return "max_new_tokens" if len(tokens) >= d.max_new_tokens else "eos"


def dedupe(hyps: list[Hyp]) -> list[Hyp]:
    """Distinct candidates in first-seen order (the reference dedupes the same way)."""
    seen: dict[tuple[int, ...], Hyp] = {}
    for h in hyps:
        seen.setdefault(tuple(h.tokens), h)
    return list(seen.values())


def _fast_scores(hyps: list[list[Hyp]], cands: list[Hyp], prior: torch.Tensor) -> torch.Tensor:
    """Fast decoding: log Σ_{z that produced y} p(z|x) p(y|x,z), from the searches' own scores."""
    index = {tuple(h.tokens): i for i, h in enumerate(cands)}
    terms: list[list[torch.Tensor]] = [[] for _ in cands]
    for z, group in enumerate(hyps):
        for h in group:
            terms[index[tuple(h.tokens)]].append(prior[z] + h.logprob)
    return torch.stack([torch.logsumexp(torch.stack(t), 0) for t in terms])  # (C,)
