"""Decoding: greedy and beam search over the RAG engine, and teacher-forced scoring.

Owns the search loops. One loop serves every mode; what differs is how generator rows map
to search beams:

* RAG-Token: each beam owns K rows (one per doc); the K next-token distributions are mixed
  by `marginalize.rag_token_next` before the search sees them. K KV caches advance together.
* RAG-Sequence and closed-book: G independent groups (one per doc, or one with no doc),
  each a plain beam search over its own rows.

The beam search follows transformers' `GenerationMixin._beam_search` step for step
(2B candidates, length-normalised finished scores, the `early_stopping=False` heuristic), so
our outputs can be checked token for token against `RagTokenForGeneration.generate`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from rag_demo.config import Decoding
from rag_demo.models.generators import Generator, GenState, pad_rows
from rag_demo.models.stopping import as_rule
from rag_demo.rag.marginalize import rag_token_next

NEG = -1.0e9  # the reference's "impossible" score


@dataclass
class Step:
    """What a search has made so far, handed to `on_step` after every decoding step (streaming).

    tokens: per group, its tokens so far (a finished group keeps its final tokens); row_lp:
    greedy only, per group, its rows' log-probs of each chosen token (G, r, t), group g's valid
    up to len(tokens[g]) (RAG-Token: r = K docs, so the attribution so far is exact); beam search
    hands its current best hypothesis of each group and row_lp None (its attribution comes from one
    pass over the winner at the end).
    done: per group, whether it has finished."""

    tokens: list[list[int]]
    row_lp: torch.Tensor | None  # (G, r, t) or None
    done: list[bool]


OnStep = Callable[[Step], None]
# Teacher-forced rows scored at once: their KV cache is copied from the prefill state (K=20 docs
# x 40 candidates x ~400 tokens would be ~20 GB for SmolLM2 in one go; 64 rows are ~0.6 GB).
ROWS_CHUNK = 64


# A processor's stage orders a search's processors: first what reweighs the scores the choice
# sees, then what bans tokens outright, then the masks of what may follow.
REWEIGH, BAN, MASK = 0, 1, 2


class LogitsProcessor:
    """Changes which next token a search may choose, never its score (transformers' LogitsProcessor,
    for groups of rows): called with the groups of the N beams, each beam's tokens so far and the
    scores (N, V) the choice sees, it returns new scores. A processor holding rows of its own
    (context contrast) follows the search's beams through `reorder` and `step`."""

    stage = MASK

    def __call__(self, groups: list[int], tokens: list[list[int]], scores: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def reorder(self, beams: torch.Tensor) -> None:
        """The search kept these beams (N',), in this order."""

    def step(self, tokens: torch.Tensor) -> None:
        """The search chose these tokens (N,), one per beam."""


@dataclass
class Hyp:
    """One finished output of a search group."""

    tokens: list[int]  # generated ids, EOS included when emitted, no start token
    logprob: float  # sum of log-probs under the distribution the search used
    group: int  # the group (doc) that produced it
    row_lp: torch.Tensor | None = None  # (r, T) greedy only: each row's log-prob of each chosen token
    # greedy with top_n > 0: at every step the top_n tokens of each row and of the beam's own
    # (mixed) distribution: (ids (r, T, n), log-probs (r, T, n), ids (T, n), log-probs (T, n))
    top: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None


class Rows:
    """How search beams map to generator rows, and how row log-probs become beam log-probs.

    processors: what the search's choice sees besides the model's log-probs (rag_demo.rag.hooks
    LogitsProcessor: the reader aids' span constraint, contrast, banned first tokens), applied in
    their `stage` order; none for the paper's search. They change which token is chosen, never a
    score."""

    def __init__(self, gen: Generator, state: GenState, per_beam: int, prior: torch.Tensor | None,
                 processors: Sequence[LogitsProcessor] = ()):
        self.gen, self.state, self.per_beam, self.prior = gen, state, per_beam, prior
        self.processors = sorted(processors, key=lambda p: p.stage)
        self.stopped: str | None = None  # why a search ended early ("time_limit", "cancelled"), if it did
        self.n_rows: int | None = None  # the state's rows once a step has told us; unknown at first
        self._owned = False  # whether self.state is a copy only this search holds (made by its first reorder)

    def pick(self, groups: list[int], tokens: list[list[int]], lp: torch.Tensor) -> torch.Tensor:
        """lp (N, V) the beams' log-probs -> what the search's choice sees (lp itself without processors)."""
        for p in self.processors:
            lp = p(groups, tokens, lp)  # (N, V)
        return lp

    def mix(self, lp: torch.Tensor) -> torch.Tensor:
        """lp (N*r, V) row log-probs -> (N, V) beam log-probs (the row log-probs are kept in
        `self.row_lp` so greedy decoding can record them for attribution)."""
        self.row_lp = lp  # (N*r, V)
        if self.prior is None:
            return lp  # (N, V)
        k = self.per_beam
        mixed = rag_token_next(lp.view(-1, k, lp.shape[-1]), self.prior)  # (N, V)
        return F.log_softmax(mixed, dim=-1)  # (N, V) renormalise float drift, as the reference does

    def rows_of(self, beams: torch.Tensor) -> torch.Tensor:
        """Beam indices (N,) -> generator row indices (N*r,)."""
        r = self.per_beam
        return (beams.unsqueeze(1) * r + torch.arange(r)).reshape(-1)  # (N*r,)

    def reorder(self, beams: torch.Tensor) -> None:
        """Keep these beams (N',), in this order: their rows of the state, copied; when every beam
        stays where it is the state is kept as it is (the search alone holds it), which spares a
        copy of every layer's cache at most steps of a beam search. After the first copy the state
        is the search's own and is reordered in place (`Generator.reorder`: only moved rows copied)."""
        rows = self.rows_of(beams)  # (N'*r,)
        if self.n_rows is None or rows.numel() != self.n_rows or not torch.equal(rows, torch.arange(self.n_rows)):
            # the first copy is the search's own (the state it was given may be shared): later ones in place
            self.state = self.gen.reorder(self.state, rows) if self._owned else self.gen.select(self.state, rows)
            self._owned = True
            self.n_rows = rows.numel()
        for p in self.processors:
            p.reorder(beams)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (N,) one per beam -> next beam log-probs (N, V)."""
        for p in self.processors:
            p.step(tokens)
        rows_tok = tokens.repeat_interleave(self.per_beam).unsqueeze(1)  # (N*r, 1)
        self.n_rows = rows_tok.shape[0]
        return self.mix(self.gen.advance(self.state, rows_tok)[:, -1])  # (N, V)

    def chosen_row_lp(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (N,) -> each row's log-prob of its beam's token, (N, r)."""
        r = self.per_beam
        lp = self.row_lp.view(-1, r, self.row_lp.shape[-1])  # (N, r, V)
        return lp.gather(2, tokens.view(-1, 1, 1).expand(-1, r, 1)).squeeze(-1)  # (N, r)


def greedy(rows: Rows, lp: torch.Tensor, groups: int, max_new_tokens: int, eos: list[int],
           stop: Callable[[], str | None] | None = None, on_step: OnStep | None = None, top_n: int = 0) -> list[Hyp]:
    """Argmax decoding for `groups` independent beams; lp (G, V) is the first step's log-probs
    (after `rows.mix`). Each hypothesis also carries its rows' log-probs of the chosen tokens,
    so attribution needs no second pass.

    A group that emits EOS is finished: its rows leave the state (no more compute or cache for
    it) and its score is the sum of log-probs up to and including EOS. `stop()` is asked between
    steps; when it names a reason ("time_limit", "cancelled") decoding ends there, the
    unfinished groups keep what they have, and `rows.stopped` holds the reason. `rows.processors`
    change what the argmax sees, never the scores. `on_step` (streaming) is called with a `Step`
    after every step; it sees copies, it changes nothing. top_n > 0 also records, at every step,
    the top_n next tokens of each row and of the beam's distribution (`Hyp.top`: the token
    inspector's tables, from the log-probs decoding computed)."""
    rule = as_rule(eos)
    made: list[list[int]] = [[] for _ in range(groups)]  # each group's tokens so far
    active = torch.arange(groups)  # (A,) the groups whose rows are in rows.state, in row order
    r = 1 if rows.prior is None and rows.per_beam == 1 else rows.per_beam
    toks: list[torch.Tensor] = []  # per step (G,) chosen token, -1 once a group has finished
    hist: list[torch.Tensor] = []  # per step (G, 1 + r) the beam's log-prob, then each row's
    tops: list[tuple[torch.Tensor, ...]] = []  # per step, top_n > 0: (G, r, n) ids, lps; (G, n) ids, lps
    one_row = rows.per_beam == 1 and rows.prior is None  # a beam is its row: row log-prob = beam log-prob
    for t in range(max_new_tokens):
        act = active.tolist()
        tok = rows.pick(act, [made[g] for g in act], lp).argmax(-1)  # (A,) what the aids allow; scores stay lp's
        for g, x in zip(act, tok.tolist()):
            made[g].append(x)
        c = lp.gather(1, tok.unsqueeze(1))  # (A, 1) the model's own log-prob of the choice
        row_c = c if one_row else rows.chosen_row_lp(tok)  # (A, r)
        step_tok = torch.full((groups,), -1, dtype=torch.long)  # (G,)
        step_tok[active] = tok
        step_lp = torch.zeros((groups, 1 + r))  # (G, 1 + r)
        step_lp[active] = torch.cat([c, row_c], dim=1)
        toks.append(step_tok)
        hist.append(step_lp)
        if top_n:
            row_v, row_i = rows.row_lp.view(len(active), r, -1).topk(top_n, dim=-1)  # (A, r, n)
            mix_v, mix_i = lp.topk(top_n, dim=-1)  # (A, n) the beam's own distribution
            full = [torch.zeros((groups, r, top_n)), torch.zeros((groups, r, top_n), dtype=torch.long),
                    torch.zeros((groups, top_n)), torch.zeros((groups, top_n), dtype=torch.long)]
            for x, val in zip(full, (row_v, row_i, mix_v, mix_i)):
                x[active] = val
            tops.append(tuple(full))
        prev = toks[-2][active] if len(toks) > 1 else torch.full_like(tok, -1)  # (A,) the token before
        going = ~rule.hits(tok, prev)  # (A,)
        if on_step is not None:
            on_step(_greedy_step(toks, hist, active[~going], max_new_tokens == t + 1))
        if t == max_new_tokens - 1 or not bool(going.any()):
            break
        if stop is not None and (reason := stop()):
            rows.stopped = reason
            break
        if not bool(going.all()):  # drop the finished groups' rows
            keep = going.nonzero().squeeze(1)  # (A',)
            rows.reorder(keep)
            active, tok = active[keep], tok[keep]
        lp = rows.step(tok)  # (A, V)
    seqs = torch.stack(toks, dim=1)  # (G, T)
    lps = torch.stack(hist, dim=2)  # (G, 1 + r, T)
    hyps = []
    for g in range(groups):
        n = int((seqs[g] >= 0).sum())  # a group's tokens are a prefix: it stops at its EOS
        top = None
        if top_n:
            rv, ri, mv, mi = (torch.stack([t[j][g] for t in tops[:n]], dim=-2 if j < 2 else 0) for j in range(4))
            top = (ri, rv, mi, mv)  # (r, n_tok, top_n) ids, log-probs; (n_tok, top_n) ids, log-probs
        hyps.append(Hyp(seqs[g, :n].tolist(), float(lps[g, 0, :n].sum()), g, lps[g, 1:, :n], top))
    return hyps


def _greedy_step(toks: list[torch.Tensor], hist: list[torch.Tensor], ended: torch.Tensor, last: bool) -> Step:
    """The Step greedy hands `on_step`: each group's tokens so far, its rows' log-probs of them."""
    seqs = torch.stack(toks, dim=1)  # (G, t), -1 after a group's end
    lps = torch.stack(hist, dim=2)[:, 1:]  # (G, r, t)
    done = (seqs[:, -1] < 0) | last  # (G,) finished before this step, or the token limit
    done[ended] = True  # finished at this step
    return Step([row[row >= 0].tolist() for row in seqs], lps.clone(), done.tolist())


def _trim(tokens: list[int], eos: list[int]) -> list[int]:
    """Cut after the first EOS (what follows is padding)."""
    rule = as_rule(eos)
    for i in range(len(tokens)):
        if rule.ends_at(tokens, i):
            return tokens[: i + 1]
    return tokens


def beam_search(
    rows: Rows,
    lp: torch.Tensor,
    groups: int,
    num_beams: int,
    max_new_tokens: int,
    eos: list[int],
    pad: int,
    length_penalty: float = 1.0,
    stop: Callable[[], str | None] | None = None,
    on_step: OnStep | None = None,
) -> list[list[Hyp]]:
    """Beam search for G groups of B beams; lp (G*B, V) first-step log-probs (beams identical).

    Finished hypotheses are ranked by sum_logprob / length**length_penalty (the reference's
    rule); each group returns its B finished hypotheses, best first. When `stop()` names a
    reason between steps, the running beams are finished where they are (as at max length)
    and `rows.stopped` holds the reason. `rows.processors` (the span constraint) add NEG to the
    tokens they do not allow; a beam that had to take one scores ~NEG and is dropped, so every
    returned score is the model's own. `on_step` (streaming) gets each group's best running beam after
    every step (a `Step` without row log-probs). A group that can no longer improve its finished
    set is done: its rows leave the state, so thorough RAG-Sequence's K searches stop paying for
    the docs whose answers ended while one doc's beams run on (its running beams are not read
    again; their tokens are filler).
    """
    G, B, V = groups, num_beams, lp.shape[-1]
    beam_group = torch.arange(G).repeat_interleave(B).tolist()  # (G*B,) the group of each beam
    rule = as_rule(eos)
    run_seq = torch.full((G, B, max_new_tokens), pad, dtype=torch.long)  # (G, B, T)
    run_score = torch.full((G, B), NEG)  # (G, B)
    run_score[:, 0] = 0.0  # only the first (identical) beam may expand at step 0
    fin_seq = run_seq.clone()  # (G, B, T)
    fin_score = torch.full((G, B), NEG)  # (G, B) length-normalised
    fin_raw = torch.zeros((G, B))  # (G, B) sum of log-probs
    fin_flag = torch.zeros((G, B), dtype=torch.bool)  # (G, B)
    # each finished hypothesis's length: its tokens are fin_seq[g, b, :fin_len[g, b]], the rest
    # padding (which may be the EOS id itself: SmolLM2 pads with <|im_end|>, so a beam cut by a
    # deadline must not be read as having emitted EOS)
    fin_len = torch.zeros((G, B), dtype=torch.long)  # (G, B)
    improvable = torch.ones((G, 1), dtype=torch.bool)  # (G, 1)
    top_b = torch.arange(2 * B) < B  # (2B,) only the top B candidates may finish
    live = torch.arange(G)  # (A,) the groups whose B rows each are in rows.state, in row order
    for t in range(max_new_tokens):
        if rows.processors:
            lp = rows.pick(beam_group, run_seq[:, :, :t].reshape(G * B, t).tolist(), lp)  # (G*B, V)
        acc = (lp.view(G, B, V) + run_score.unsqueeze(-1)).view(G, B * V)  # (G, B*V)
        top_lp, top_idx = torch.topk(acc, 2 * B)  # (G, 2B)
        parent, tok = top_idx // V, top_idx % V  # (G, 2B)
        cand = torch.gather(run_seq, 1, parent.unsqueeze(-1).expand(-1, -1, max_new_tokens)).clone()  # (G, 2B, T)
        cand[:, :, t] = tok
        prev = cand[:, :, t - 1] if t else torch.full_like(tok, -1)  # (G, 2B) the token before
        hits = rule.hits(tok, prev) | (t + 1 >= max_new_tokens)  # (G, 2B)
        # running beams: the best B candidates that did not stop
        run_lp = top_lp + hits.float() * NEG  # (G, 2B)
        keep = torch.topk(run_lp, B).indices  # (G, B)
        run_seq = torch.gather(cand, 1, keep.unsqueeze(-1).expand(-1, -1, max_new_tokens))  # (G, B, T)
        run_score = torch.gather(run_lp, 1, keep)  # (G, B)
        run_parent = torch.gather(parent, 1, keep)  # (G, B)
        # finished: merge the candidates that stopped among the top B into the finished set
        just = hits & top_b  # (G, 2B)
        norm = top_lp / ((t + 1) ** length_penalty)  # (G, 2B)
        norm = norm + (~improvable).float() * NEG + (~just).float() * NEG  # (G, 2B)
        m_seq, m_score = torch.cat([fin_seq, cand], 1), torch.cat([fin_score, norm], 1)  # (G, 3B, T), (G, 3B)
        m_raw, m_flag = torch.cat([fin_raw, top_lp], 1), torch.cat([fin_flag, just], 1)  # (G, 3B)
        m_len = torch.cat([fin_len, torch.full_like(tok, t + 1)], 1)  # (G, 3B)
        best = torch.topk(m_score, B).indices  # (G, B)
        fin_seq = torch.gather(m_seq, 1, best.unsqueeze(-1).expand(-1, -1, max_new_tokens))  # (G, B, T)
        fin_score, fin_raw, fin_flag, fin_len = (torch.gather(x, 1, best) for x in (m_score, m_raw, m_flag, m_len))
        # can a running beam still beat the worst finished one? (early_stopping=False heuristic)
        best_running = run_score[:, :1] / ((t + 1) ** length_penalty)  # (G, 1)
        worst_fin = torch.where(fin_flag, fin_score.min(1, keepdim=True).values, NEG)  # (G, B)
        improvable = improvable & (best_running > worst_fin).any(-1, keepdim=True)  # (G, 1)
        if on_step is not None:  # each group's best running beam; its best finished one once it is done
            done = ~improvable | hits.all(-1, keepdim=True)  # (G, 1)
            shown = torch.where(done.unsqueeze(-1), fin_seq[:, :1], run_seq[:, :1])[:, 0, : t + 1]  # (G, t+1)
            on_step(Step([_strip(row.tolist(), rule, pad) for row in shown], None, done[:, 0].tolist()))
        if not bool(improvable.any()) or bool(hits.all()):
            break
        if stop is not None and (reason := stop()):
            rows.stopped = reason
            # finish the running beams here, as if this step were the last
            norm_run = run_score / ((t + 1) ** length_penalty) + (~improvable).float() * NEG  # (G, B)
            m_seq, m_score = torch.cat([fin_seq, run_seq], 1), torch.cat([fin_score, norm_run], 1)  # (G, 2B, ..)
            m_raw = torch.cat([fin_raw, run_score], 1)  # (G, 2B)
            m_flag = torch.cat([fin_flag, improvable.expand(-1, B)], 1)  # (G, 2B)
            m_len = torch.cat([fin_len, torch.full_like(fin_len, t + 1)], 1)  # (G, 2B): cut after step t
            best = torch.topk(m_score, B).indices  # (G, B)
            fin_seq = torch.gather(m_seq, 1, best.unsqueeze(-1).expand(-1, -1, max_new_tokens))  # (G, B, T)
            fin_score, fin_raw, fin_flag, fin_len = (torch.gather(x, 1, best) for x in (m_score, m_raw, m_flag, m_len))
            break
        slot = torch.full((G,), -1, dtype=torch.long)  # (G,) each live group's block in rows.state
        slot[live] = torch.arange(len(live))
        live = improvable[:, 0].nonzero().squeeze(1)  # (A',) the groups still searching
        rows.reorder((slot[live].unsqueeze(1) * B + run_parent[live]).reshape(-1))  # (A'*B,) their beams' rows
        lp_live = rows.step(run_seq[live, :, t].reshape(-1))  # (A'*B, V)
        lp = torch.full((G, B, V), NEG)  # (G, B, V) a done group's beams: filler, never finished
        lp[live] = lp_live.view(-1, B, V)
        lp = lp.view(G * B, V)  # (G*B, V)
    return [
        [Hyp(_strip(fin_seq[g, b, : int(fin_len[g, b])].tolist(), rule, pad), float(fin_raw[g, b]), g) for b in range(B)
         if bool(fin_flag[g, b]) and float(fin_raw[g, b]) > NEG / 2]  # (a beam forced off the constraint: dropped)
        for g in range(G)
    ]


def _strip(tokens: list[int], eos: list[int], pad: int) -> list[int]:
    """A finished beam's tokens: up to its EOS, or up to trailing padding at max length."""
    rule = as_rule(eos)
    cut = _trim(tokens, rule)
    if cut and rule.ends_at(cut, len(cut) - 1):
        return cut
    while cut and cut[-1] == pad:
        cut = cut[:-1]
    return cut


def search(rows: Rows, lp: torch.Tensor, groups: int, d: Decoding, ends: list[int],
           stop: Callable[[], str | None] | None = None, on_step: OnStep | None = None, top_n: int = 0,
           ) -> list[list[Hyp]]:
    """Greedy when d.num_beams == 1 (one hypothesis per group), else beam search, each group's
    hypotheses best first. lp (G*r, V): the prefilled rows' first-step log-probs, mixed here into
    beam log-probs. `stop()`: asked between steps (see greedy / beam_search); `on_step`: streaming
    (a `Step` after every step); `top_n`: greedy's inspector tables (Hyp.top)."""
    lp = rows.mix(lp)  # (G, V)
    if d.num_beams == 1:
        return [[h] for h in greedy(rows, lp, groups, d.max_new_tokens, ends, stop, on_step, top_n)]
    if any(p.stage != MASK for p in rows.processors):
        raise ValueError("context contrast and banned first tokens are for greedy decoding (num_beams=1).")
    rows.reorder(torch.arange(groups).repeat_interleave(d.num_beams))  # each group's rows copied B times
    lp = lp.repeat_interleave(d.num_beams, dim=0)  # (G*B, V)
    return beam_search(rows, lp, groups, d.num_beams, d.max_new_tokens, ends, rows.gen.pad_token_id,
                       d.length_penalty, stop, on_step)


def _chunks_by_width(width: torch.Tensor, n: int) -> list[torch.Tensor]:
    """Row indices sorted by width (R,), cut into chunks of at most n rows; a chunk also ends
    before a row more than twice as wide as its first, so padding at most doubles a row's work."""
    chunks: list[list[int]] = []
    for r in torch.argsort(width, stable=True).tolist():  # shortest first
        if not chunks or len(chunks[-1]) == n or width[r] > 2 * width[chunks[-1][0]]:
            chunks.append([])
        chunks[-1].append(r)
    return [torch.tensor(c) for c in chunks]


def score_candidates(
    gen: Generator, state: GenState, first_lp: torch.Tensor, candidates: list[list[int]], pad: int,
    max_rows: int | None = None, stop: Callable[[], str | None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-force every candidate under every prefilled row (doc), reusing the prefill cache.

    state: K prefilled rows, first_lp (K, V) their first-step log-probs, C candidates
    -> lp (K, C, T) log p(y_t | x, z, y_<t) of each candidate token, mask (C, T).

    Memory is bounded whatever K x C x T: the K*C (doc, candidate) rows run `max_rows` at a time
    (each chunk copies only its rows of the prefill cache), and `advance_gather` never holds
    more than LOGITS_CHUNK logits. `stop()` is asked between chunks; once it names a reason the
    remaining rows score -inf (callers then fall back to what they have).

    Rows run shortest candidate first, in chunks of similar width (`_chunks_by_width`), each only
    as wide as its longest candidate: one run-on candidate of 32 tokens does not make every short
    one pay 32 positions (docs/DESIGN.md §10). Pad positions (mask 0) hold 0 or the log-prob of
    a pad token: they mean nothing, callers mask them.
    """
    K, C = first_lp.shape[0], len(candidates)
    tgt, mask = pad_rows(candidates, pad, min_width=1)  # (C, T) right-padded, T >= 1
    mask = mask.float()  # (C, T)
    rows = torch.arange(K).repeat_interleave(C)  # (K*C,) row k*C + c = candidate c under doc k
    width = mask.sum(1).long().clamp(min=1).repeat(K)  # (K*C,) each row's candidate length
    lp = _teacher_force(gen, state, first_lp, rows, tgt.repeat(K, 1), width, max_rows, stop)  # (K*C, T)
    return lp.view(K, C, tgt.shape[1]), mask  # (K, C, T), (C, T)


def score_pairs(
    gen: Generator, state: GenState, first_lp: torch.Tensor, rows: list[int], candidates: list[list[int]], pad: int,
    max_rows: int | None = None, stop: Callable[[], str | None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-force candidate i under prefilled row rows[i] only (score_candidates scores every
    candidate under every row): -> lp (N, T) log p(y_t | x, z_i, y_<t), mask (N, T). One model
    call for all N pairs (in chunks as score_candidates), where a call per pair read all of the
    model's weights N times for a few tokens each (each doc's title as a candidate)."""
    tgt, mask = pad_rows(candidates, pad, min_width=1)  # (N, T) right-padded, T >= 1
    mask = mask.float()  # (N, T)
    width = mask.sum(1).long().clamp(min=1)  # (N,)
    return _teacher_force(gen, state, first_lp, torch.tensor(rows), tgt, width, max_rows, stop), mask


def _teacher_force(gen: Generator, state: GenState, first_lp: torch.Tensor, rows: torch.Tensor, tgt_rows: torch.Tensor,
                   width: torch.Tensor, max_rows: int | None, stop) -> torch.Tensor:
    """The shared loop of score_candidates / score_pairs: target tgt_rows[i] (T,) of width[i]
    tokens teacher-forced under prefilled row rows[i] -> lp (N, T), -inf where `stop()` cut it."""
    T = tgt_rows.shape[1]
    lp = torch.full((len(rows), T), float("-inf"))  # (N, T)
    lp[:, 0] = first_lp.index_select(0, rows).gather(1, tgt_rows[:, :1]).squeeze(1)  # (N,)
    if T > 1:
        for idx in _chunks_by_width(width, max_rows or ROWS_CHUNK):  # (n,) each chunk's rows
            if stop is not None and stop():
                break
            w = int(width[idx].max())  # the chunk's longest candidate
            lp[idx, w:] = 0.0  # pads past every candidate of the chunk: not computed
            if w > 1:
                st = gen.select(state, rows[idx])  # this chunk's rows of the prefill cache
                lp[idx, 1:w] = gen.advance_gather(st, tgt_rows[idx, : w - 1], tgt_rows[idx, 1:w])  # (n, w-1)
    return lp  # (N, T)
