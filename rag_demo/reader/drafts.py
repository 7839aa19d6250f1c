"""RAG-Token weighs each passage's drafts (ReaderAids.token_drafts) and each passage's title
(ReaderAids.title_candidates): more candidates for the same model, ranked by its exact log p(y|x).

RAG-Token's search over the mixture Σ_z p(z|x) p(y_i|x,z,y_<i) only approximates its argmax, and
with extractive copies it can only say what the likely passages hold. The `choose_token` hook
takes its beams plus each passage's own drafts (RAG-Sequence's candidates: `doc_searches`, run
once for both modes) and keeps the one with the highest RAG-Token log p(y|x), found exactly by
branch and bound over the passages (`rank_by_rag_token`). The `candidates` hook adds each
passage's title as an answer of its own passage, teacher-forced under it. docs/DESIGN.md §3.2.
"""
from __future__ import annotations

import torch

from rag_demo.models.generators import Generator, GenState
from rag_demo.rag.decoding import Hyp, score_candidates, score_pairs
from rag_demo.rag.engine import NO_DRAFTS, dedupe, doc_searches
from rag_demo.rag.hooks import Choice, Prefilled
from rag_demo.rag.marginalize import rag_token_logprob
from rag_demo.reader.part import Aid
from rag_demo.reader.retries import Rejects

# Generation.extras: the indices of RAG-Token's candidates whose number is an upper bound, not exact
UPPER_BOUNDS = "upper_bounds"


class TokenDrafts(Aid):
    """choose_token: RAG-Token's answer among its beams and each passage's drafts
    (`choose_among_drafts`); rejects: the echo test candidates must pass, or None."""

    knob, hooks, keeps_prefill = "token_drafts", ("choose_token",), True

    def __init__(self, rejects: Rejects | None):
        self.rejects = rejects

    def choose_token(self, q: Prefilled, mixture: list[Hyp]) -> Choice:
        return choose_among_drafts(q, mixture, self.rejects)


class TitleCandidates(Aid):
    """candidates: each passage's title as an answer of its own (`with_titles`); titles: their
    token ids (Generator.title_answer_ids)."""

    knob, hooks = "title_candidates", ("candidates",)

    def __init__(self, titles: list[list[int]], rejects: Rejects | None):
        self.titles, self.rejects = titles, rejects

    def candidates(self, q: Prefilled, hyps: list[list[Hyp]]) -> list[list[Hyp]]:
        return with_titles(q, hyps, self.titles, self.rejects)


def choose_among_drafts(q: Prefilled, mixture: list[Hyp], rejects: Rejects | None) -> Choice:
    """RAG-Token's answer among its beams and each passage's drafts, by its exact log p(y|x). A
    rejected candidate (an echo) competes only when every candidate is one, as in a search. When
    the deadline or a cancel cuts the drafts or the ranking short, the mixture's own answer stands."""
    groups, stopped = doc_searches(q)  # not streamed: the mixture's search already streamed
    cands = dedupe(mixture + [h for group in groups for h in group if h.tokens])
    if rejects is not None:
        cands = [h for h in cands if not rejects(h.tokens)] or cands
    ranked = None if stopped else rank_by_rag_token(q.gen, q.state0, q.first_lp, [h.tokens for h in cands], q.prior,
                                                     q.stop)
    if ranked is None:
        cut = stopped or (q.stop() if q.stop is not None else None) or "stopped"
        return Choice(mixture[0], note=f" (drafts stopped: {cut})", fell_back=NO_DRAFTS)
    win, doc_lp, scores, bounded = ranked
    return Choice(cands[win], [(h.tokens, sc) for h, sc in zip(cands, scores)], doc_lp,
                  note=", with each doc's drafts", extras={UPPER_BOUNDS: bounded})


def with_titles(q: Prefilled, hyps: list[list[Hyp]], titles: list[list[int]], rejects: Rejects | None
                ) -> list[list[Hyp]]:
    """Each passage's candidates plus its title (" Title.") as an answer of that passage, its
    log p(title | x, z) teacher-forced in one batch, unless it is rejected (it echoes the question)
    or the passage already drafted it."""
    todo = [(z, t) for z, t in enumerate(titles) if t and not (rejects is not None and rejects(t))
            and not any(h.tokens == t for h in hyps[z])]
    if not todo:
        return hyps
    lp, _ = score_pairs(q.gen, q.state0, q.first_lp, [z for z, _ in todo], [t for _, t in todo],
                        q.gen.pad_token_id)  # (N, T)
    hyps = list(hyps)
    for i, (z, t) in enumerate(todo):
        hyps[z] = [*hyps[z], Hyp(t, float(lp[i, : len(t)].sum()), z)]  # log p(title | x, z)
    return hyps


def rank_by_rag_token(gen: Generator, state0: GenState, first_lp: torch.Tensor, cands: list[list[int]],
                      prior: torch.Tensor, stop=None) -> tuple[int, torch.Tensor, list[float], set[int]] | None:
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
        got, _ = score_candidates(gen, gen.select(state0, torch.tensor([z])), first_lp[z : z + 1],
                                  [cands[c] for c in alive], gen.pad_token_id)  # (1, C', T')
        idx, t = torch.tensor(alive), got.shape[2]
        lp[z, idx, :t] = got[0]
        acc[idx, :t] = torch.logaddexp(acc[idx, :t], prior[z] + got[0])  # (C', T')  the prior enters per token
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
        got, _ = score_candidates(gen, gen.select(state0, torch.tensor(todo)), first_lp[todo], [cands[win]],
                                  gen.pad_token_id)  # (K', 1, T')
        lp[todo, win, : got.shape[2]] = got[:, 0]
    doc_lp = lp[:, win, : len(cands[win])]  # (K, T)
    exact = float(rag_token_logprob(doc_lp, prior))
    bounded = {c for c in range(C) if c != win and int(seen[c]) < K}  # the others were read under every doc
    scores = [exact if c == win else float(bound[c]) if c in bounded else float(lower[c]) for c in range(C)]
    return win, doc_lp, scores, bounded
