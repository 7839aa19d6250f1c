"""One reader aid as a part: the hooks of rag_demo.rag.hooks.Reader it implements, the others
passing through. The aided reader (aided.py) is a list of parts, composed as transformers composes
a `LogitsProcessorList`: processors concatenate, reviews and candidate sources chain, and at most
one part sets the prior and at most one chooses RAG-Token's answer.
"""
from __future__ import annotations

import torch

from rag_demo.rag.decoding import Hyp, LogitsProcessor
from rag_demo.rag.hooks import Choice, Prefilled, Search

# The hooks a part may implement, as `Aid.hooks` names them (and "prompt": what the generator reads)
HOOKS = ("prompt", "prior", "processors", "review", "candidates", "choose_token")


class Aid:
    """A part: `knob` the ReaderAids field that turns it on, `hooks` the hooks it implements.

    keep_prompt_logprobs: prompt tokens, counted from the end, whose log-probs its prior reads;
    keeps_prefill: whether it searches again from the prefill state."""

    knob: str = ""
    hooks: tuple[str, ...] = ()
    keep_prompt_logprobs: int = 0
    keeps_prefill: bool = False

    def prior(self, logits: torch.Tensor, prompt_lp: torch.Tensor | None, temperature: float
              ) -> tuple[torch.Tensor, dict] | None:
        """(log p(z|x) (K,), extras by name), or None to leave the paper's prior."""
        return None

    def processors(self, q: Prefilled, kind: str, groups: list[int]) -> list[LogitsProcessor]:
        """This part's processors of one search (kinds as in Reader.processors)."""
        return []

    def review(self, search: Search, hyps: list[list[Hyp]]) -> list[list[Hyp]]:
        """A search's hypotheses per group after this part's review."""
        return hyps

    def candidates(self, q: Prefilled, hyps: list[list[Hyp]]) -> list[list[Hyp]]:
        """Each passage's candidates with this part's added."""
        return hyps

    def choose_token(self, q: Prefilled, mixture: list[Hyp]) -> Choice | None:
        """RAG-Token's answer, or None to leave the choice to the paper."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.knob}: {', '.join(self.hooks)})"
