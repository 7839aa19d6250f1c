"""The RAG engine: RAG-Token, RAG-Sequence (thorough and fast) and closed-book over any generator.

Owns steps 3 (generate) and 4 (attribute) of the pipeline for one question whose K doc
prompts and retrieval scores are already known. Works on token ids only, so the parity tests
can feed it exactly what they feed transformers' RAG classes.

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

from .budget import RunControl
from .config import RagSettings
from .decoding import Contrast, Hyp, Rows, SpanConstraint, Step, as_rule, score_candidates, score_pairs, search
from .generators import Generator
from .marginalize import (
    doc_log_prior,
    rag_sequence_logprob,
    rag_sequence_logprob_hf,
    rag_token_logprob,
    sequence_posteriors,
    token_posteriors,
)


Echo = Callable[[list[int]], bool]  # does this answer (token ids) only repeat the question?


@dataclass
class Generation:
    """What one mode produced for one question (token level; the pipeline adds text)."""

    tokens: list[int]  # the answer's generated ids (EOS included if emitted, no start token)
    logprob: float  # log p(y|x) under the mode's model
    decoding: str  # what ran, e.g. "greedy", "beam=4", "thorough, greedy"
    doc_lp: torch.Tensor | None = None  # (K, T) log p(y_t | x, z, y_<t)
    posteriors: torch.Tensor | None = None  # (T, K) per-token doc posterior
    doc_posterior: torch.Tensor | None = None  # (K,) RAG-Sequence: p(z | x, y)
    # RAG-Sequence, and RAG-Token with RagSettings.token_drafts: (tokens, log p(y|x) as the mode ranked them)
    candidates: list[tuple[list[int], float]] = field(default_factory=list)
    bounded: set[int] = field(default_factory=set)  # candidates whose number is an upper bound (rank_by_rag_token)
    prior: torch.Tensor | None = None  # (K,) the log p(z|x) every formula above used
    question_lp: torch.Tensor | None = None  # (K,) log p_G(x|z) when RagSettings.question_weight used it
    timings: dict[str, float] = field(default_factory=dict)  # seconds: generate, attribute
    stopped: str = "eos"  # why the answer ended: "eos", "max_new_tokens", "time_limit", "cancelled"
    inspection: Inspection | None = None  # RAG modes: the token inspector's tables (`inspect_answer`)


@dataclass
class Inspection:
    """What each doc would have said at every step of the answer (the token inspector, #12).

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
    K, T = first_lp.shape[0], len(tokens)
    top_ids, top_lp = torch.zeros((K, T, n), dtype=torch.long), torch.zeros((K, T, n))  # (K, T, n)
    mix_ids = torch.zeros((T, n), dtype=torch.long) if prior is not None else None  # (T, n)
    mix_lp = torch.zeros((T, n)) if prior is not None else None  # (T, n)

    def record(a: int, lp: torch.Tensor) -> None:  # lp (K, l, V): positions a..a+l-1
        v, i = lp.topk(n, dim=-1)  # (K, l, n)
        top_lp[:, a: a + lp.shape[1]], top_ids[:, a: a + lp.shape[1]] = v, i
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
    return Inspection(top_ids, top_lp, mix_ids, mix_lp)


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


def prefill_and_prior(gen: Generator, prompts: list[list[int]], doc_scores: torch.Tensor, s: RagSettings,
                      question_tail: tuple[int, int] | None = None):
    """Prefill the K doc prompts and form the doc log-prior; -> (first_lp (K, V), state,
    log p(z|x) (K,), log p_G(x|z) (K,) or None).

    log p(z|x) = log_softmax_z( (doc_scores_z + lambda * log p_G(x|z)) / T ),
    doc_scores = scale * q(x)·d(z) (the retriever's logits), T = s.prior_temperature (the retrieval
    temperature: it tempers the reader's vote too, or a vote of tens of nats would leave the slider
    nothing to flatten), lambda =
    s.question_weight and log p_G(x|z) = sum_i log p_G(x_i | prompt before x_i, z): the
    generator's own likelihood of the question's tokens after passage z (Sachan et al. 2022,
    "UPR"), read from the prefill's logits at the question's positions (question_tail, from
    `gen.question_tail`), so it costs no extra pass. lambda = 0, or no question_tail (an
    encoder-decoder reads the question, it does not predict it): the retriever's prior alone.
    """
    use_q = bool(s.question_weight) and question_tail is not None
    n_q, n_after = question_tail if use_q else (0, 0)
    first_lp, state = gen.prefill(prompts, score_last=n_q + n_after) if use_q else gen.prefill(prompts)  # (K, V)
    T = s.prior_temperature
    if not use_q:
        return first_lp, state, doc_log_prior(torch.as_tensor(doc_scores, dtype=torch.float32) / T), None  # (K,)
    question_lp = state.prompt_lp[:, :n_q].sum(-1)  # (K,) log p_G(x|z)
    # the doc log-prior enters here: the retriever's logits plus lambda times the reader's vote
    prior = doc_log_prior((torch.as_tensor(doc_scores, dtype=torch.float32) + s.question_weight * question_lp) / T)  # (K,)
    return first_lp, state, prior, question_lp


def _begin(gen: Generator, prompts: list[list[int]], doc_scores: torch.Tensor, s: RagSettings,
           control: RunControl | None, question_tail: tuple[int, int] | None, contrast_prompt: list[int] | None):
    """What both RAG modes start with: the generator (gated by `control`) and its stop check, the
    answer's end tokens (EOS, and in the short style the end of the phrase), the K prompts'
    prefill and log p(z|x) (`prefill_and_prior`: first_lp (K, V), state, prior (K,), question_lp
    (K,) or None), and the closed-book row's prefill for context contrast (or None)."""
    gen, stop = _controlled(gen, control)
    ends = gen.stop_token_ids(s.answer_style)
    first_lp, state0, prior, question_lp = prefill_and_prior(gen, prompts, doc_scores, s, question_tail)  # (K, V), (K,)
    return gen, stop, ends, first_lp, state0, prior, question_lp, _contrast_prefill(gen, contrast_prompt, s)


def _decoding_name(s: RagSettings) -> str:
    return "greedy" if s.num_beams == 1 else f"beam={s.num_beams}"


def rag_token(gen: Generator, prompts: list[list[int]], doc_scores: torch.Tensor, s: RagSettings,
              control: RunControl | None = None, spans: list[list[int]] | None = None,
              question_tail: tuple[int, int] | None = None, on_partial: OnPartial | None = None,
              echo: Echo | None = None, contrast_prompt: list[int] | None = None,
              titles: list[list[int]] | None = None) -> Generation:
    """RAG-Token: search over p(y_i|x,y_<i) = sum_z p(z|x) p(y_i|x,z,y_<i), K caches per beam.

    prompts: K doc-conditioned inputs, doc_scores (K,) retrieval scores; control: deadline,
    cancel check and step gate of this request (see budget.RunControl); spans: the K passages'
    token ids when decoding is extractive (RagSettings.extractive): the answer then copies a
    span of any of the K passages. question_tail: where the question sits in the prompts
    (`prefill_and_prior`: p(z|x) with the reader's vote when RagSettings.question_weight > 0).
    on_partial: streaming, a `Partial` after every decoding step. echo(tokens): does this answer
    only repeat the question (RagSettings.echo_retries; `_without_echoes`)? contrast_prompt: the
    question without passages (the closed-book prompt), for RagSettings.context_contrast. titles:
    each doc's title as an answer (RagSettings.title_candidates), joining its drafts (token_drafts).
    """
    t0 = time.perf_counter()
    gen, stop, ends, first_lp, state0, prior, question_lp, cb = _begin(gen, prompts, doc_scores, s, control,
                                                                       question_tail, contrast_prompt)
    K = len(prompts)
    # Beam search scores its winner afterwards from the prefill state, so it decodes on a copy;
    # greedy records attribution as it goes and may consume the state (copying it costs more
    # than a decoding step for BART's cross-attention cache).
    # An echo retried, and each doc's drafts (token_drafts), decode again from the prefill state,
    # so the first search runs on a copy then too.
    drafts = s.token_drafts and not s.context_contrast  # contrast decoding has its own rule for choosing tokens
    state = gen.select(state0, torch.arange(K)) if s.num_beams > 1 or _retries(s, echo) or drafts else state0
    rows = Rows(gen, state, per_beam=K, prior=prior, contrast=_contrast_rows(gen, cb, s, 1, ends))
    # extractive: one copy group, the passages holding at least copy_min_prior of p(z|x)
    allowed = SpanConstraint(spans, [copy_sources(prior, s.copy_min_prior)], ends) if spans is not None else None
    step = None
    if on_partial is not None:
        def step(st: Step) -> None:
            doc_lp = None if st.row_lp is None else st.row_lp[0, :, : len(st.tokens[0])]  # (K, t)
            on_partial(Partial("token", st.tokens, doc_lp, prior, st.done))
    hyps = search(rows, first_lp, 1, s.num_beams, s.max_new_tokens, ends, gen.pad_token_id,
                  s.length_penalty, stop, allowed, step, top_n=INSPECT_TOP)
    redo = _redo(gen, state0, first_lp, rows, s, ends, stop, allowed, step, top_n=INSPECT_TOP, contrast0=cb)
    mixture = _without_echoes(hyps, echo, s, redo, rows)[0]
    best, doc_lp, candidates, bounded, cut = _best(mixture), None, [], set(), None
    if drafts and not rows.stopped:
        # more candidates for the same model: each doc's own drafts join the mixture's search,
        # and all are ranked by their exact RAG-Token log p(y|x) (search only approximates the argmax)
        groups, drafts_stopped = _doc_drafts(gen, prompts, state0, first_lp, s, ends, stop, spans, echo, cb, None,
                                             titles)
        cands = _dedupe(mixture + [h for group in groups for h in group if h.tokens])
        if _retries(s, echo):  # as a search does: an echo competes only when every candidate is one
            cands = [h for h in cands if not echo(h.tokens)] or cands
        ranked = None if drafts_stopped else rank_by_rag_token(gen, state0, first_lp, [h.tokens for h in cands],
                                                                prior, stop)
        if ranked is not None:
            win, doc_lp, scores, bounded = ranked
            best, candidates = cands[win], [(h.tokens, sc) for h, sc in zip(cands, scores)]
        else:  # the deadline or a cancel came first: the mixture's own answer stands
            cut = drafts_stopped or (stop() if stop is not None else None) or "stopped"
    t1 = time.perf_counter()
    if best.top is not None:  # greedy recorded the inspector's tables while decoding
        inspection = Inspection(*best.top)
    else:  # beam search or a doc's draft: one teacher-forced pass from the prefill state (decoding ran on a copy)
        inspection = inspect_answer(gen, state0, first_lp, best.tokens, prior)
    if doc_lp is None and best.row_lp is not None:  # greedy recorded each doc's log-prob of every chosen token
        doc_lp = best.row_lp  # (K, T)
    elif doc_lp is None:  # beam search: one teacher-forced pass of the answer under each doc
        doc_lp = score_candidates(gen, state0, first_lp, [best.tokens], gen.pad_token_id)[0][:, 0]  # (K, T)
    # (with token_drafts the ranking already scored the winner under every doc)
    logprob = float(rag_token_logprob(doc_lp, prior))
    name = _decoding_name(s) + (", with each doc's drafts" if candidates else
                                f" (drafts stopped: {cut})" if cut else "")
    out = Generation(best.tokens, logprob, name, doc_lp, token_posteriors(doc_lp, prior), candidates=candidates,
                     prior=prior, question_lp=question_lp, inspection=inspection, bounded=bounded)
    out.timings = {"generate": t1 - t0, "attribute": time.perf_counter() - t1}
    out.stopped = _stopped(best.tokens, rows.stopped, ends, s)
    return out


def copy_sources(log_prior: torch.Tensor, floor: float) -> list[int]:
    """The passages a RAG-Token answer may copy from (RagSettings.copy_min_prior): those with
    p(z|x) >= floor, and the most likely one whatever its p(z|x). log_prior (K,) log p(z|x)."""
    p = log_prior.exp()  # (K,)
    top = int(torch.argmax(p))
    return [z for z in range(p.shape[0]) if z == top or float(p[z]) >= floor]


def _doc_drafts(gen: Generator, prompts: list[list[int]], state0, first_lp: torch.Tensor, s: RagSettings, ends, stop,
                spans: list[list[int]] | None, echo: Echo | None, cb, step,
                titles: list[list[int]] | None = None) -> tuple[list[list[Hyp]], str | None]:
    """Each doc's own answers: a search under p(y|x,z) for each of the K docs alone (extractive:
    copying its own passage), echoes retried per doc; -> (K groups of Hyps, best first; why the
    request's deadline or cancel cut them short, or None). RAG-Sequence's candidates, and
    RAG-Token's extra ones (RagSettings.token_drafts): within one question the two modes read the
    same prompts with the same settings, so a generator that shares work (generators.SharedPrefill)
    runs the drafts once, for whichever mode asks first. titles (RagSettings.title_candidates): doc
    z's title as one more answer of doc z, its log p(title|x,z) teacher-forced, unless it echoes
    the question or doc z already drafted it."""
    def run() -> tuple[list[list[Hyp]], str | None]:
        K = first_lp.shape[0]
        rows = Rows(gen, gen.select(state0, torch.arange(K)), per_beam=1, prior=None,
                    contrast=_contrast_rows(gen, cb, s, K, ends))
        allowed = SpanConstraint(spans, [[z] for z in range(K)], ends) if spans is not None else None
        hyps = search(rows, first_lp, K, s.num_beams, s.max_new_tokens, ends, gen.pad_token_id,
                      s.length_penalty, stop, allowed, step)
        # a retried draft does not stream: its group number would name the wrong doc in the Partial
        hyps = _without_echoes(hyps, echo, s, _redo(gen, state0, first_lp, rows, s, ends, stop, allowed, None,
                                                    contrast0=cb), rows)
        todo = [] if rows.stopped else [(z, t) for z, t in enumerate(titles or []) if t and not (
            echo is not None and echo(t)) and not any(h.tokens == t for h in hyps[z])]
        if todo:  # every title under its own doc, in one teacher-forced batch
            lp, _ = score_pairs(gen, state0, first_lp, [z for z, _ in todo], [t for _, t in todo],
                                gen.pad_token_id)  # (N, T)
            for i, (z, t) in enumerate(todo):
                hyps[z] = [*hyps[z], Hyp(t, float(lp[i, : len(t)].sum()), z)]  # log p(title | x, z)
        return hyps, rows.stopped

    share = getattr(gen, "shared", None)
    if share is None:
        return run()
    key = ("drafts", tuple(map(tuple, prompts)), tuple(map(tuple, spans or [])), tuple(map(tuple, titles or [])),
           s.num_beams, s.max_new_tokens,
           s.length_penalty, s.answer_style, s.echo_retries, s.context_contrast, tuple(ends))
    return share(key, run)


def rank_by_rag_token(gen: Generator, state0, first_lp: torch.Tensor, cands: list[list[int]], prior: torch.Tensor,
                      stop=None) -> tuple[int, torch.Tensor, list[float], set[int]] | None:
    """The candidate with the highest RAG-Token log p(y|x) = sum_i log sum_z p(z|x) p(y_i|x,z,y_<i),
    found exactly without scoring every candidate under every doc (branch and bound).

    Docs are teacher-forced in order of p(z|x), each over the candidates still in the race.
    After docs S: lower bound L_c = sum_i log sum_{z in S} p(z|x) q_zi (the docs not yet read add
    mass), upper bound U_c = sum_i log(sum_{z in S} p(z|x) q_zi + sum_{z not in S} p(z|x)) (each
    adds at most its prior); a candidate with U_c < max L leaves the race. When one is left, it
    is scored under the remaining docs for its attribution. With the offline stack's peaked p(z|x)
    the race is usually decided by the top one or two docs.

    state0: K prefilled rows, first_lp (K, V), C candidates (token ids), prior (K,) log p(z|x)
    -> (winner, its (K, T) log p(y_t|x,z,y_<t), per candidate its exact log p(y|x) or, for one
    that left the race, the upper bound it had then, the set of those); None when `stop()` cut it
    short.
    """
    K, C = first_lp.shape[0], len(cands)
    lengths = torch.tensor([len(c) for c in cands])  # (C,)
    T = max(1, int(lengths.max()))
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)  # (C, T)
    lp = torch.full((K, C, T), float("nan"))  # (K, C, T) filled doc by doc
    acc = torch.full((C, T), float("-inf"))  # (C, T) log sum_{z read} p(z|x) q_zi
    rest = torch.tensor(1.0)  # prior mass of the docs not read yet
    bound = torch.full((C,), float("inf"))  # (C,) each candidate's last upper bound
    alive, read = list(range(C)), []
    seen = torch.zeros(C, dtype=torch.long)  # (C,) docs each candidate was scored under
    for z in torch.argsort(prior, descending=True).tolist():
        if stop is not None and stop():
            return None
        l, _ = score_candidates(gen, gen.select(state0, torch.tensor([z])), first_lp[z : z + 1],
                                [cands[c] for c in alive], gen.pad_token_id)  # (1, C', T')
        idx, t = torch.tensor(alive), l.shape[2]
        lp[z, idx, :t] = l[0]
        acc[idx, :t] = torch.logaddexp(acc[idx, :t], prior[z] + l[0])  # (C', T')  the prior enters per token
        read.append(z)
        seen[idx] += 1
        rest = (rest - prior[z].exp()).clamp(min=0.0)
        lower = torch.where(mask, acc, 0.0).sum(-1)  # (C,)
        upper = torch.where(mask, torch.logaddexp(acc, rest.log()), 0.0).sum(-1)  # (C,)
        best = max(alive, key=lambda c: float(lower[c]))
        bound[idx] = upper[idx]
        alive = [c for c in alive if c == best or float(upper[c]) >= float(lower[best])]
        if len(alive) == 1:
            break
    win = max(alive, key=lambda c: float(lower[c]))
    todo = [z for z in range(K) if z not in read]
    if todo and len(cands[win]):  # the winner under the docs the race did not need
        l, _ = score_candidates(gen, gen.select(state0, torch.tensor(todo)), first_lp[todo], [cands[win]],
                                gen.pad_token_id)  # (K', 1, T')
        lp[todo, win, : l.shape[2]] = l[:, 0]
    doc_lp = lp[:, win, : len(cands[win])]  # (K, T)
    exact = float(rag_token_logprob(doc_lp, prior))
    bounded = {c for c in range(C) if c != win and int(seen[c]) < K}  # the others were read under every doc
    scores = [exact if c == win else float(bound[c]) if c in bounded else float(lower[c]) for c in range(C)]
    return win, doc_lp, scores, bounded


def rag_sequence(gen: Generator, prompts: list[list[int]], doc_scores: torch.Tensor, s: RagSettings,
                 hf_compat_score: bool = False, control: RunControl | None = None,
                 spans: list[list[int]] | None = None, question_tail: tuple[int, int] | None = None,
                 on_partial: OnPartial | None = None, echo: Echo | None = None,
                 contrast_prompt: list[int] | None = None, titles: list[list[int]] | None = None) -> Generation:
    """RAG-Sequence: p(y|x) = sum_z p(z|x) prod_i p(y_i|x,z,y_<i).

    Candidates come from a search under each doc. "thorough": every candidate is rescored
    under every doc and marginalised. "fast" (paper 2.5): p(y|x,z) is taken as 0 for docs
    whose search did not produce y, so no extra passes; the winner is then scored under all
    docs once, for its log p(y|x) (the candidates list keeps the fast scores that ranked them)
    and the attribution.

    hf_compat_score: rank thorough candidates with transformers' RAG-Sequence score instead of
    ours (BOS excluded, prior added at the second token; huggingface/transformers#9312). Only
    the parity checks against the reference turn it on. spans: the K passages' token ids when
    decoding is extractive: each doc's search copies a span of its own passage. question_tail,
    on_partial: as in `rag_token` (here the Partial holds the K drafts, one per doc); echo: as in
    `rag_token`, each doc's draft retried on its own; contrast_prompt: as in `rag_token`, each doc's
    search contrasted with its own copy of the closed-book row. titles: each doc's title as one more
    of its candidates (RagSettings.title_candidates; `_doc_drafts`).
    """
    t0 = time.perf_counter()
    gen, stop, ends, first_lp, state0, prior, question_lp, cb = _begin(gen, prompts, doc_scores, s, control,
                                                                       question_tail, contrast_prompt)
    K = len(prompts)
    step = None
    if on_partial is not None:
        def step(st: Step) -> None:
            on_partial(Partial("sequence", st.tokens, None, prior, st.done))
    hyps, stopped = _doc_drafts(gen, prompts, state0, first_lp, s, ends, stop, spans, echo, cb, step, titles)
    cands = _dedupe([h for group in hyps for h in group])
    if on_partial is not None and s.sequence_decoding == "thorough" and not stopped:
        on_partial(Partial("sequence", [group[0].tokens if group else [] for group in hyps], None, prior,
                           [True] * K, phase="rescoring"))
    name = f"{s.sequence_decoding}, {_decoding_name(s)}"
    lp = None
    if s.sequence_decoding == "thorough" and not stopped:
        lp, mask = score_candidates(gen, state0, first_lp, [h.tokens for h in cands], gen.pad_token_id,
                                    stop=stop)  # (K, C, T)
        if stop is not None and (reason := stop()):  # rescoring cut short: its numbers are incomplete
            stopped, lp = reason, None
    if lp is not None:
        scores = _sequence_scores(lp, prior, mask, gen, cands, hf_compat_score)  # (C,)
        win = int(torch.argmax(scores))
        t1 = time.perf_counter()
        doc_lp = lp[:, win, : len(cands[win].tokens)]  # (K, T)
        logprob = float(scores[win])  # log p(y|x): the candidate's score over all K docs
    else:  # fast decoding, or thorough stopped by its deadline: no rescoring passes
        if s.sequence_decoding == "thorough":
            name = f"fast (thorough stopped: {stopped}), {_decoding_name(s)}"
        scores = _fast_scores(hyps, cands, prior)  # (C,)
        win = int(torch.argmax(scores))
        t1 = time.perf_counter()
        lp, _ = score_candidates(gen, state0, first_lp, [cands[win].tokens], gen.pad_token_id)  # (K, 1, T)
        doc_lp = lp[:, 0]  # (K, T)
        # the fast score chose the winner, but leaves out the docs that did not produce it: the
        # answer's log p(y|x) is the sum over all K (the posteriors below divide by it)
        logprob = float(rag_sequence_logprob(doc_lp, prior))  # ()
    post = sequence_posteriors(doc_lp, prior)  # (T, K)
    out = Generation(
        cands[win].tokens, logprob, name, doc_lp, post, post[-1],
        [(h.tokens, float(sc)) for h, sc in zip(cands, scores)], prior=prior, question_lp=question_lp,
        inspection=inspect_answer(gen, state0, first_lp, cands[win].tokens, None),
    )
    out.timings = {"generate": t1 - t0, "attribute": time.perf_counter() - t1}
    out.stopped = _stopped(out.tokens, stopped, ends, s)
    return out


def closed_book(gen: Generator, prompt: list[int], s: RagSettings, control: RunControl | None = None,
                on_partial: OnPartial | None = None, echo: Echo | None = None) -> Generation:
    """The generator alone, no documents (the paper's parametric-only baseline). on_partial,
    echo: as in `rag_token`."""
    t0 = time.perf_counter()
    gen, stop = _controlled(gen, control)
    ends = gen.stop_token_ids(s.answer_style)  # EOS, and in the short style the end of the phrase
    first_lp, state0 = gen.prefill([prompt])  # (1, V)
    state = gen.select(state0, torch.arange(1)) if _retries(s, echo) else state0  # a retry decodes from the prefill again
    rows = Rows(gen, state, per_beam=1, prior=None)
    step = None
    if on_partial is not None:
        def step(st: Step) -> None:
            on_partial(Partial("closed-book", st.tokens, None, None, st.done))
    hyps = search(rows, first_lp, 1, s.num_beams, s.max_new_tokens, ends, gen.pad_token_id,
                  s.length_penalty, stop, None, step)
    best = _best(_without_echoes(hyps, echo, s, _redo(gen, state0, first_lp, rows, s, ends, stop, None, step), rows)[0])
    out = Generation(best.tokens, best.logprob, _decoding_name(s))
    out.timings = {"generate": time.perf_counter() - t0, "attribute": 0.0}
    out.stopped = _stopped(best.tokens, rows.stopped, ends, s)
    return out


def _controlled(gen: Generator, control: RunControl | None):
    """(the generator, gated if the request has a gate; the stop check or None)."""
    if control is None:
        return gen, None
    return control.wrap(gen), control.stop_reason


def _stopped(tokens: list[int], early: str | None, ends: list[int], s: RagSettings) -> str:
    """Why an answer ended: its own end (EOS, or a short answer's stop token), a stop reason, or
    the token limit."""
    if tokens and as_rule(ends).ends_at(tokens, len(tokens) - 1):
        return "eos"
    if early:
        return early
    return "max_new_tokens" if len(tokens) >= s.max_new_tokens else "eos"


def _retries(s: RagSettings, echo: Echo | None) -> bool:
    """Might decoding retry echoes (so its first search must leave the prefill state intact)?"""
    return echo is not None and s.echo_retries > 0


def _contrast_prefill(gen: Generator, prompt: list[int] | None, s: RagSettings):
    """RagSettings.context_contrast: the closed-book prompt's prefill (state with one row, first
    log-probs (1, V)), which every contrasted search copies; None when off or not greedy."""
    if prompt is None or not s.context_contrast or s.num_beams > 1:
        return None
    lp0, state0 = gen.prefill([prompt])  # (1, V)
    return state0, lp0


def _contrast_rows(gen: Generator, cb, s: RagSettings, n: int, ends) -> Contrast | None:
    """A search's n closed-book rows (one per group) from `_contrast_prefill`'s output, or None;
    `ends`: the search's end tokens, where the contrast steps aside."""
    return None if cb is None else Contrast.start(gen, cb[0], cb[1], s.context_contrast, n, ends)


def _redo(gen: Generator, state0, first_lp: torch.Tensor, rows: Rows, s: RagSettings, ends, stop,
          allowed: SpanConstraint | None, step, top_n: int = 0, contrast0=None
          ) -> Callable[[list[int], list[list[int]]], list[Hyp]]:
    """`_without_echoes`' redo for a search laid out like `rows`: greedy again over the given groups
    only, from their rows of the prefill state (state0, first_lp (G*r, V)), with `banned` first
    tokens (and fresh closed-book rows from contrast0, `_contrast_prefill`); a stop it meets is
    recorded on `rows`."""
    def redo(groups: list[int], banned: list[list[int]]) -> list[Hyp]:
        idx = rows.rows_of(torch.tensor(groups))  # (G'*r,) the groups' prefill rows
        again = Rows(gen, gen.select(state0, idx), per_beam=rows.per_beam, prior=rows.prior,
                     contrast=_contrast_rows(gen, contrast0, s, len(groups), ends))
        sub = allowed.subset(groups) if allowed is not None else None
        found = search(again, first_lp[idx], len(groups), 1, s.max_new_tokens, ends, gen.pad_token_id,
                       s.length_penalty, stop, sub, step, top_n=top_n, first_banned=banned)
        rows.stopped = rows.stopped or again.stopped
        return [group[0] for group in found]
    return redo


def _without_echoes(hyps: list[list[Hyp]], echo: Echo | None, s: RagSettings,
                    redo: Callable[[list[int], list[list[int]]], list[Hyp]], rows: Rows) -> list[list[Hyp]]:
    """RagSettings.echo_retries: answers that only repeat the question, decoded again.

    hyps: each group's hypotheses, best first. Beam search: a group drops its echoes when it has
    another hypothesis; a group whose every hypothesis echoes is retried like greedy's, with the
    first tokens of all of them banned. Greedy: the groups whose answer echoes run again,
    `redo(groups, banned)` -> one Hyp each (a greedy search), with the first token of every echo
    they produced so far banned at the first step; at most s.echo_retries rounds, and not after
    the request was stopped. A group keeps its first answer that is not an echo; a group that
    echoes every time keeps its original hypotheses (the model's own choice). Scores are
    untouched: each Hyp's log-probs are the model's, whatever was banned."""
    if echo is None or not s.echo_retries:
        return hyps
    if s.num_beams > 1:
        out, echoing = [], {}
        for g, group in enumerate(hyps):
            fine = [h for h in group if not echo(h.tokens)]
            out.append(fine or group)
            if group and not fine:
                echoing[g] = group
    else:
        out = list(hyps)
        echoing = {g: group[:1] for g, group in enumerate(hyps) if group and echo(group[0].tokens)}
    banned: dict[int, list[int]] = {g: [] for g in echoing}
    for _ in range(s.echo_retries):
        # an empty answer has no first token to ban
        echoing = {g: firsts for g, hs in echoing.items() if (firsts := [h.tokens[0] for h in hs if h.tokens])}
        if not echoing or rows.stopped:
            break
        for g, firsts in echoing.items():
            banned[g].extend(t for t in dict.fromkeys(firsts) if t not in banned[g])
        todo = sorted(echoing)
        found = redo(todo, [banned[g] for g in todo])
        if rows.stopped:  # a retry cut short by the deadline: keep the whole answers already made
            break
        echoing = {}
        for g, h in zip(todo, found):
            h.group = g
            if echo(h.tokens):
                echoing[g] = [h]
            else:
                out[g] = [h]
    return out


def _best(hyps: list[Hyp]) -> Hyp:
    """The search's top hypothesis (searches return best first)."""
    return hyps[0]


def _dedupe(hyps: list[Hyp]) -> list[Hyp]:
    """Distinct candidates in first-seen order (the reference dedupes the same way)."""
    seen: dict[tuple[int, ...], Hyp] = {}
    for h in hyps:
        seen.setdefault(tuple(h.tokens), h)
    return list(seen.values())


def _sequence_scores(lp, prior, mask, gen: Generator, cands: list[Hyp], hf_compat: bool) -> torch.Tensor:
    """log p(y|x) for each candidate (C,), ours or (hf_compat) the reference's convention."""
    lp_c = lp.permute(1, 0, 2)  # (C, K, T)
    if not hf_compat:
        return rag_sequence_logprob(lp_c, prior.expand(len(cands), -1), mask)  # (C,)
    bos = getattr(gen.tokenizer, "bos_token_id", None)
    first_is_bos = bos is not None and all(h.tokens and h.tokens[0] == bos for h in cands)
    return rag_sequence_logprob_hf(lp_c, prior.expand(len(cands), -1), mask, first_is_bos)  # (C,)


def _fast_scores(hyps: list[list[Hyp]], cands: list[Hyp], prior: torch.Tensor) -> torch.Tensor:
    """Fast decoding: log sum_{z that produced y} p(z|x) p(y|x,z), from the searches' own scores."""
    index = {tuple(h.tokens): i for i, h in enumerate(cands)}
    terms: list[list[torch.Tensor]] = [[] for _ in cands]
    for z, group in enumerate(hyps):
        for h in group:
            terms[index[tuple(h.tokens)]].append(prior[z] + h.logprob)
    return torch.stack([torch.logsumexp(torch.stack(t), 0) for t in terms])  # (C,)
