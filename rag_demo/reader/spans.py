"""Extractive answers: the search may only copy a span of the passages (ReaderAids.extractive).

A logits processor: it restricts which tokens a search may choose, never their scores, so
log p(y|x), the candidates' rescoring and the attributions stay exact for what was generated.
RAG-Sequence's search under passage z copies from passage z; RAG-Token's mixture copies from the
passages it reads, those holding at least `copy_min_prior` of p(z|x) (`copy_sources`).
"""
from __future__ import annotations

import torch

from rag_demo.rag.decoding import MASK, NEG, LogitsProcessor
from rag_demo.rag.hooks import Prefilled
from rag_demo.reader.part import Aid


class SpanConstraint(LogitsProcessor):
    """The next token must continue a span copied from the group's passages, or end the answer (an
    end token, once one token was copied). A copy opens where a word does and ends where one does
    (Span.starts / Span.stops, when the spans carry them): no half words, no half numbers.

    spans: the passages' token ids (Generator.span_ids); groups[g]: which spans group g may copy
    from (RAG-Sequence: its own passage; RAG-Token: the passages it reads)."""

    stage = MASK

    def __init__(self, spans: list[list[int]], groups: list[list[int]], ends: list[int]):
        self.spans, self.groups, self.ends = spans, groups, sorted(set(ends))

    def allowed(self, group: int, tokens: list[int]) -> list[int]:
        """The tokens group `group` may choose after `tokens`."""
        t = len(tokens)
        out: set[int] = set()
        may_end = False
        for z in self.groups[group]:
            span = self.spans[z]
            starts, stops = getattr(span, "starts", None), getattr(span, "stops", None)
            for j in range(len(span) - t + 1):  # every place the tokens so far occur, and what follows
                if span[j: j + t] == tokens and (starts is None or j in starts):
                    if j + t < len(span):
                        out.add(span[j + t])
                    may_end = may_end or stops is None or j + t in stops
        if (t and may_end) or not out:  # a copy ends a word here (or nothing can follow): the answer may end
            out.update(self.ends)
        return sorted(out)

    def mask(self, groups: list[int], tokens: list[list[int]], vocab: int) -> torch.Tensor:
        """(N, V) additive mask: 0 where the beam's next token is allowed, NEG elsewhere."""
        m = torch.full((len(groups), vocab), NEG)  # (N, V)
        for i, (g, toks) in enumerate(zip(groups, tokens)):
            m[i, self.allowed(g, toks)] = 0.0
        return m

    def __call__(self, groups: list[int], tokens: list[list[int]], scores: torch.Tensor) -> torch.Tensor:
        return scores + self.mask(groups, tokens, scores.shape[-1])  # (N, V)


def copy_sources(log_prior: torch.Tensor, floor: float) -> list[int]:
    """The passages a RAG-Token answer may copy from (ReaderAids.copy_min_prior): those with
    p(z|x) >= floor, and the most likely one whatever its p(z|x). log_prior (K,) log p(z|x)."""
    p = log_prior.exp()  # (K,)
    top = int(torch.argmax(p))
    return [z for z in range(p.shape[0]) if z == top or float(p[z]) >= floor]


class Extractive(Aid):
    """processors: a `SpanConstraint` on every search with passages: RAG-Token's mixture copies from
    the passages it reads (`copy_sources` at min_prior), each passage's own search from its passage.
    spans: each passage's token ids (Generator.span_ids)."""

    knob, hooks = "extractive", ("processors",)

    def __init__(self, spans: list[list[int]], min_prior: float):
        self.spans, self.min_prior = spans, min_prior

    def processors(self, q: Prefilled, kind: str, groups: list[int]) -> list[LogitsProcessor]:
        if kind == "closed_book":
            return []
        sets = [copy_sources(q.prior, self.min_prior)] * len(groups) if kind == "mixture" else [[z] for z in groups]
        return [SpanConstraint(self.spans, sets, q.ends)]
