"""The generator's vote on p(z|x) (ReaderAids.question_weight; UPR, Sachan et al. 2022): the
`prior` hook. How likely the generator finds the question after each passage, read from the
prefill's logits at no extra cost, is added to the retriever's logits.
"""
from __future__ import annotations

import torch

from rag_demo.rag.marginalize import doc_log_prior
from rag_demo.reader.part import Aid

# Generation.extras / Prefilled.extras: (K,) log p_G(x|z), the vote's evidence for each passage
QUESTION_LP = "question_lp"


class QuestionVote(Aid):
    """prior: log p(z|x) = log_softmax_z((logits_z + w · log p_G(x|z)) / T). tail: the question's
    tokens counted from each prompt's end (models: Generator.common_question_tail): (question
    tokens, tokens after it)."""

    knob, hooks = "question_weight", ("prior",)

    def __init__(self, weight: float, tail: tuple[int, int]):
        self.weight, self.tail = weight, tail
        self.keep_prompt_logprobs = sum(tail)

    def prior(self, logits: torch.Tensor, prompt_lp: torch.Tensor | None, temperature: float
              ) -> tuple[torch.Tensor, dict]:
        """log p_G(x|z) is the generator's log-likelihood of the question's tokens after passage
        z. T tempers the vote too: a vote of tens of nats would otherwise leave the temperature
        nothing to flatten."""
        question_lp = prompt_lp[:, : self.tail[0]].sum(-1)  # (K,) log p_G(x|z)
        return voted_prior(logits, question_lp, self.weight, temperature), {QUESTION_LP: question_lp}


def voted_prior(logits: torch.Tensor, question_lp: torch.Tensor, weight: float, temperature: float) -> torch.Tensor:
    """log p(z|x) = log_softmax_z((logits_z + w · log p_G(x|z)) / T): logits (K,) the retriever's
    scale · q(x)·d(z), question_lp (K,) the generator's log p_G(x|z)."""
    # the doc log-prior: the retriever's logits plus w times the reader's vote, tempered together
    return doc_log_prior((logits + weight * question_lp) / temperature)  # (K,)
