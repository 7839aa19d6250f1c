"""Where reader aids attach to the paper's algorithm: logits processors and the `Reader` hooks.

The paper's RAG-Token and RAG-Sequence (engine.py) call a `Reader` at five named points; this
module's `Reader` is the paper's own, whose every hook leaves the algorithm as written. The reader
aids (rag_demo/reader/) subclass it. Every hook may change what is searched or which answer is
kept, never how an answer is scored: log p(y|x) and the attributions stay the model's.

    prior          p(z|x) from the retriever's logits (paper: softmax(logits / T))
    processors     what a search's choice sees besides the model (paper: nothing)
    review         a search's hypotheses, after it ran (paper: as they are)
    candidates     more answers of a passage's own, scored under it (paper: none)
    choose_token   RAG-Token's answer among more candidates (paper: the search's best beam)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from rag_demo.config import Decoding
from rag_demo.models.generators import Generator, GenState
from rag_demo.rag.decoding import Hyp, LogitsProcessor, OnStep, Rows, search
from rag_demo.rag.marginalize import doc_log_prior, rag_sequence_logprob

Stop = Callable[[], "str | None"]  # why decoding must stop now ("time_limit", "cancelled"), or None


@dataclass
class Prefilled:
    """One question's prompts after the prefill: what every search and every hook starts from.

    gen: the generator; prompts: one per passage (K) or one (closed-book); first_lp (R, V) the
    first answer token's log-probs; state0 the prefill's rows, never decoded on when a hook may
    decode again; prior (K,) log p(z|x) (None for closed-book); ends: the answer's end tokens."""

    gen: Generator
    prompts: list[list[int]]
    first_lp: torch.Tensor  # (R, V)
    state0: GenState
    prior: torch.Tensor | None  # (K,)
    ends: list[int]
    d: Decoding
    stop: Stop | None = None
    reader: "Reader | None" = None
    extras: dict = field(default_factory=dict)  # what the prior hook read besides p(z|x), by name


@dataclass
class Search:
    """One search as the engine ran it: `kind`, its rows (`rows.stopped` says if it was cut short),
    and enough to run it again, greedily, over some of its groups from their prefill rows (what
    retrying a rejected answer does)."""

    q: Prefilled
    kind: str  # "mixture", "per_doc" or "closed_book"
    rows: Rows
    on_step: OnStep | None = None  # what a search run again streams to (None: nothing)
    top_n: int = 0  # a search run again records the inspector's tables (greedy's Hyp.top)

    def again(self, groups: list[int], extra: list[LogitsProcessor]) -> list[Hyp]:
        """Greedy again over `groups` only, from their rows of the prefill state, with the reader's
        processors for those groups and `extra` ones; one Hyp each. A stop it meets is recorded
        on this search's rows."""
        q, rows = self.q, self.rows
        idx = rows.rows_of(torch.tensor(groups))  # (G'*r,) the groups' prefill rows
        again = Rows(q.gen, q.gen.select(q.state0, idx), per_beam=rows.per_beam, prior=rows.prior,
                     processors=[*q.reader.processors(q, self.kind, groups), *extra])
        greedy = q.d.model_copy(update={"num_beams": 1})
        found = search(again, q.first_lp[idx], len(groups), greedy, q.ends, q.stop, self.on_step, self.top_n)
        rows.stopped = rows.stopped or again.stopped
        return [group[0] for group in found]

class Reader:
    """The paper's reader: retrieval's own prior, plain searches, the search's own answer.

    A reader is made for one question (it may hold that question's passages). `key` names
    everything its hooks depend on, so work both RAG modes would repeat (each passage's own
    search) is shared only between equal readers."""

    key: tuple = ()
    # prompt tokens, counted from the end, whose log-probs `prior` reads from the prefill (0: none)
    keep_prompt_logprobs: int = 0
    # whether a hook searches again from the prefill state (then the first search runs on a copy)
    keeps_prefill: bool = False

    def prior(self, logits: torch.Tensor, prompt_lp: torch.Tensor | None, temperature: float
              ) -> tuple[torch.Tensor, dict]:
        """log p(z|x) (K,) from the retriever's logits (K,) = scale · q(x)·d(z): the doc log-prior
        log_softmax_z(logits / T); and what else the hook read to form it, by name (paper: nothing)."""
        return doc_log_prior(logits / temperature), {}  # (K,)

    def sequence_scores(self, lp: torch.Tensor, prior: torch.Tensor, mask: torch.Tensor, gen: Generator,
                        candidates: list[list[int]]) -> torch.Tensor:
        """Thorough RAG-Sequence's score of each candidate, log p(y|x) = log Σ_z p(z|x) Π_i
        p(y_i|x,z,y_<i): lp (C, K, T) teacher-forced log-probs, prior (K,) log p(z|x), mask (C, T)
        -> (C,). The prior enters once per candidate, before the sum over z."""
        return rag_sequence_logprob(lp, prior.expand(lp.shape[0], -1), mask)  # (C,)

    def processors(self, q: Prefilled, kind: str, groups: list[int]) -> list[LogitsProcessor]:
        """The processors of one search over `groups` (kind "mixture": RAG-Token's one group;
        "per_doc": RAG-Sequence's group z for passage z; "closed_book")."""
        return []

    def review(self, search: Search, hyps: list[list[Hyp]]) -> list[list[Hyp]]:
        """A search's hypotheses per group, best first, after it ran."""
        return hyps

    def candidates(self, q: Prefilled, hyps: list[list[Hyp]]) -> list[list[Hyp]]:
        """Each passage's candidates (RAG-Sequence's H_z), with any of the reader's own added."""
        return hyps

    def choose_token(self, q: Prefilled, mixture: list[Hyp]) -> Choice:
        """RAG-Token's answer: the paper's is the search's best beam."""
        return Choice(mixture[0])


class Choice:
    """RAG-Token's answer and what chose it: `candidates` (tokens, log p(y|x) as ranked); `doc_lp`
    (K, T) when the choice already scored the answer under every passage; `note` says how it was
    chosen (shown with the decoding); `fell_back` what a stop made it do instead of what the reader
    would have (engine.NO_DRAFTS); `extras` what else the chooser knows of its candidates, by name."""

    def __init__(self, best: Hyp, candidates: list[tuple[list[int], float]] | None = None,
                 doc_lp: torch.Tensor | None = None, note: str = "", fell_back: str = "",
                 extras: dict | None = None):
        self.best, self.candidates, self.doc_lp = best, candidates or [], doc_lp
        self.note, self.fell_back, self.extras = note, fell_back, extras or {}


PAPER = Reader()
