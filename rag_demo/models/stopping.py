"""Which tokens end an answer: `StopRule`, the generator's end tokens with one exception."""
from __future__ import annotations

import torch


class StopRule(list):
    """The token ids that end an answer (a list, usable wherever one is), with one exception: a
    `soft` end right after an `after` token does not end it. The short answer style stops at a
    sentence-final period, but "U.S. dollar", "J. K. Rowling" and "St. Louis" hold a period
    after an initial or an abbreviation (Generator.stop_token_ids)."""

    def __init__(self, ends, soft=(), after=()):
        super().__init__(sorted(set(ends)))
        self.soft, self.after = frozenset(soft), frozenset(after)
        self._ends_t, self._soft_t, self._after_t = (torch.tensor(sorted(x), dtype=torch.long)
                                                     for x in (set(self), self.soft, self.after))

    def hits(self, tok: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        """tok, prev: same shape, the chosen tokens and the tokens before them (-1: none) ->
        a bool mask of the choices that end their answer."""
        hit = torch.isin(tok, self._ends_t)
        if self.soft:
            hit &= ~(torch.isin(tok, self._soft_t) & torch.isin(prev, self._after_t))
        return hit

    def ends_at(self, tokens: list[int], i: int) -> bool:
        """Does tokens[i] end the answer?"""
        t = tokens[i]
        return t in self and not (t in self.soft and i > 0 and tokens[i - 1] in self.after)


def as_rule(eos) -> StopRule:
    return eos if isinstance(eos, StopRule) else StopRule(eos)
