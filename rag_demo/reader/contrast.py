"""Context-aware decoding (ReaderAids.context_contrast; Shi et al. 2023, "Trusting Your Evidence").

A small reader often answers from its weights, not its passage. With a > 0 each token is chosen
by (1 + a) log p(y_t | x, z, y_<t) - a log p(y_t | x, y_<t), the second term the generator
without passages, among the tokens the passages make plausible. A logits processor: it changes
which token is chosen, never a score. Greedy only.
"""
from __future__ import annotations

import math

import torch

from rag_demo.models.generators import Generator, GenState
from rag_demo.rag.decoding import NEG, REWEIGH, LogitsProcessor
from rag_demo.rag.hooks import Prefilled
from rag_demo.reader.part import Aid

# The plausibility cut (Li et al. 2023's contrastive decoding, used by Shi et al. 2023): a token
# the passages give less than this fraction of their top token's probability is never chosen,
# however much more likely they make it than the model alone does.
CONTRAST_PLAUSIBLE = 0.1


class Contrast(LogitsProcessor):
    """The next token is argmax_y (1 + a) log p(y | x, z.., y_<t) - a log p(y | x, y_<t) over the
    plausible y (log p(y | x, z.., y_<t) >= its max + log CONTRAST_PLAUSIBLE), where the first term
    is the beam's own distribution (RAG-Token: the mixture over docs; RAG-Sequence: its doc's) and
    the second the generator without passages: one closed-book row per beam, advanced with the
    beam's tokens. Where the beam's own most likely next token ends the answer (`ends`), the
    contrast steps aside and that distribution chooses: an end token is as likely with passages
    as without, so contrasting it would make every answer run on past its span.

    state, lp (N, V): the N closed-book rows and their next-token log-probs."""

    stage = REWEIGH

    def __init__(self, gen: Generator, state: GenState, lp: torch.Tensor, alpha: float, ends=()):
        self.gen, self.state, self.lp, self.alpha = gen, state, lp, alpha
        self.ends = torch.tensor(sorted(set(ends)), dtype=torch.long)

    @classmethod
    def start(cls, gen: Generator, state0: GenState, lp0: torch.Tensor, alpha: float, n: int, ends=()) -> "Contrast":
        """n beams' rows, copies of the closed-book prefill (state0 with one row, lp0 (1, V)); state0 is kept."""
        return cls(gen, gen.select(state0, torch.zeros(n, dtype=torch.long)), lp0.expand(n, -1), alpha, ends)

    def pick(self, lp: torch.Tensor) -> torch.Tensor:
        """lp (N, V) the beams' log-probs with passages -> (N, V) what the argmax sees."""
        a = self.alpha
        adjusted = (1 + a) * lp - a * self.lp  # (N, V) the passages' pull, amplified
        plausible = lp >= lp.max(-1, keepdim=True).values + math.log(CONTRAST_PLAUSIBLE)  # (N, V)
        adjusted = adjusted.masked_fill(~plausible, NEG)  # (N, V)
        ending = torch.isin(lp.argmax(-1), self.ends)  # (N,) the beam would end its answer here
        return torch.where(ending.unsqueeze(1), lp, adjusted)  # (N, V)

    def __call__(self, groups: list[int], tokens: list[list[int]], scores: torch.Tensor) -> torch.Tensor:
        return self.pick(scores)

    def reorder(self, beams: torch.Tensor) -> None:
        self.state, self.lp = self.gen.select(self.state, beams), self.lp[beams]

    def step(self, tokens: torch.Tensor) -> None:
        """tokens (N,) one per beam: the closed-book rows read them too."""
        self.lp = self.gen.advance(self.state, tokens.unsqueeze(1))[:, -1]  # (N, V)


class ContextContrast(Aid):
    """processors: a `Contrast` on every greedy search with passages. closed_prompt: the question
    without passages, prefilled once, when a search first needs it, and copied by every contrasted
    search."""

    knob, hooks = "context_contrast", ("processors",)

    def __init__(self, alpha: float, closed_prompt: list[int]):
        self.alpha, self.closed_prompt = alpha, closed_prompt
        self._prefill: tuple[GenState, torch.Tensor] | None = None  # (state with one row, first log-probs (1, V))

    def processors(self, q: Prefilled, kind: str, groups: list[int]) -> list[LogitsProcessor]:
        if kind == "closed_book" or q.d.num_beams > 1:  # the contrast is greedy only
            return []
        if self._prefill is None:
            lp0, state0 = q.gen.prefill([self.closed_prompt])  # (1, V)
            self._prefill = (state0, lp0)
        return [Contrast.start(q.gen, *self._prefill, self.alpha, len(groups), q.ends)]
