"""The math of RAG (paper section 2): marginalising the generator over retrieved documents.

Pure functions on log-probabilities, no models. Shapes: B beams or candidates, K docs,
T tokens, V vocabulary. `lp` is always a generator log-probability log p(y_i | x, z, y_<i),
`prior` the doc log-prior log p(z|x). Where the prior enters is the whole difference
between the two models:

* RAG-Sequence: once per sequence,   log p(y|x) = logsumexp_z [prior_z + sum_i lp_{z,i}]
* RAG-Token:    once per token,      log p(y|x) = sum_i logsumexp_z [prior_z + lp_{z,i}]
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def doc_log_prior(doc_scores: torch.Tensor) -> torch.Tensor:
    """log p(z|x) = log_softmax_z(q(x)·d(z)) over the K retrieved docs only.

    doc_scores (..., K) -> (..., K). E.g. scores [0, ln 3] give p = [1/4, 3/4].
    """
    return F.log_softmax(doc_scores.float(), dim=-1)  # (..., K)


def rag_token_next(lp: torch.Tensor, prior: torch.Tensor) -> torch.Tensor:
    """RAG-Token next-token distribution, the prior entering at this token:

    log p(y_i | x, y_<i) = logsumexp_z [ log p(z|x) + log p(y_i | x, z, y_<i) ]

    lp (B, K, V) per-doc next-token log-probs, prior (K,) or (B, K) -> (B, V).
    """
    if prior.dim() == 1:
        prior = prior.unsqueeze(0)  # (1, K)
    mixed = lp + prior.unsqueeze(-1)  # (B, K, V)  <- doc log-prior enters at every token
    return torch.logsumexp(mixed, dim=1)  # (B, V)


def rag_token_logprob(lp: torch.Tensor, prior: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """log p(y|x) under RAG-Token: sum_i logsumexp_z [prior_z + lp_{z,i}].

    lp (..., K, T) log-probs of the answer's own tokens under each doc, prior (..., K),
    mask (..., T) 1 for real tokens -> (...).
    """
    per_token = torch.logsumexp(lp + prior.unsqueeze(-1), dim=-2)  # (..., T)  prior at every token
    if mask is not None:
        per_token = torch.where(mask.bool(), per_token, 0.0)  # (..., T)
    return per_token.sum(-1)  # (...)


def rag_sequence_logprob(lp: torch.Tensor, prior: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """log p(y|x) under RAG-Sequence: logsumexp_z [prior_z + sum_i lp_{z,i}].

    lp (..., K, T), prior (..., K), mask (..., T) -> (...). The prior enters once per sequence,
    every generated token (BOS included, if the generator emits one) is scored.
    """
    if mask is not None:
        lp = torch.where(mask.unsqueeze(-2).bool(), lp, 0.0)  # (..., K, T)  pads score 0
    per_doc = lp.sum(-1)  # (..., K)  log p(y | x, z)
    return torch.logsumexp(prior + per_doc, dim=-1)  # (...)  prior once per sequence


def token_posteriors(lp: torch.Tensor, prior: torch.Tensor) -> torch.Tensor:
    """RAG-Token attribution (paper Fig. 2): p(z | x, y_i, y_<i) ∝ p(z|x) p(y_i | x, z, y_<i).

    lp (K, T), prior (K,) -> (T, K), each row sums to 1.
    """
    joint = lp + prior.unsqueeze(-1)  # (K, T)
    return F.softmax(joint, dim=0).T  # (T, K)


def sequence_posteriors(lp: torch.Tensor, prior: torch.Tensor) -> torch.Tensor:
    """RAG-Sequence running posterior: p(z | x, y_≤i) ∝ p(z|x) prod_{j≤i} p(y_j | x, z, y_<j).

    lp (K, T), prior (K,) -> (T, K), rows sum to 1; the last row is the sequence's doc posterior.
    """
    joint = prior.unsqueeze(-1) + torch.cumsum(lp, dim=-1)  # (K, T)
    return F.softmax(joint, dim=0).T  # (T, K)


def logprob_without_each(lp: torch.Tensor, prior: torch.Tensor, mode: str) -> torch.Tensor:
    """log p(y|x) of the same answer y with each doc taken away in turn (leave one out), the
    prior renormalised over the other K-1 docs:

    log p'(z|x) = prior_z - logsumexp_{z' != d} prior_z'   for z != d, and -inf for z = d,

    then `rag_token_logprob` or `rag_sequence_logprob` ("token" / "sequence") under p'. The
    per-doc log-probs lp_{z,i} do not depend on the other docs (each doc has its own prompt),
    so this needs no model pass. lp (K, T), prior (K,) -> (K,): entry d is log p(y | x, docs
    without d). With K = 1 nothing is left: -inf.
    """
    K = prior.shape[-1]
    if K == 1:
        return torch.full((1,), float("-inf"))  # (1,) no doc left to generate from
    keep = ~torch.eye(K, dtype=torch.bool)  # (K, K): row d keeps every doc but d
    masked = torch.where(keep, prior.unsqueeze(0), float("-inf"))  # (K, K) row d: prior without d
    renorm = masked - torch.logsumexp(masked, dim=-1, keepdim=True)  # (K, K)  <- the prior, renormalised
    lps = lp.unsqueeze(0).expand(K, -1, -1)  # (K, K, T): the same per-doc log-probs for every row d
    if mode == "token":
        return rag_token_logprob(lps, renorm)  # (K,)
    if mode == "sequence":
        return rag_sequence_logprob(lps, renorm)  # (K,)
    raise ValueError(f"mode={mode!r} has no passages to take away: use 'token' or 'sequence'.")


LOSSES = ("sequence", "token", "both")


def rag_nll(lp: torch.Tensor, prior: torch.Tensor, mask: torch.Tensor | None = None, loss: str = "both") -> torch.Tensor:
    """The training loss (paper §2.4): the negative marginal log-likelihood of the target answer,

        sequence:  −logsumexp_z [prior_z + Σ_i lp_{z,i}]          (−rag_sequence_logprob)
        token:     −Σ_i logsumexp_z [prior_z + lp_{z,i}]          (−rag_token_logprob)
        both:      the mean of the two (one generator serves both modes),

    the same functions that score an answer when the demo answers. Gradients reach the generator
    through lp and the question tower through the prior. lp (..., K, T), prior (..., K),
    mask (..., T) -> (...).
    """
    if loss == "sequence":
        return -rag_sequence_logprob(lp, prior, mask)  # (...)
    if loss == "token":
        return -rag_token_logprob(lp, prior, mask)  # (...)
    if loss == "both":
        return -(rag_sequence_logprob(lp, prior, mask) + rag_token_logprob(lp, prior, mask)) / 2  # (...)
    raise ValueError(f"loss={loss!r} is unknown: use one of {', '.join(LOSSES)}.")
