"""The RAG math on hand-made cases: 2 docs, 2 tokens, numbers worked out by hand.

Case used throughout:
    doc scores [0, ln 3]      -> p(z|x) = [1/4, 3/4]
    doc 1: p(y1) = 0.5, p(y2 | y1) = 0.2
    doc 2: p(y1) = 0.1, p(y2 | y1) = 0.6

RAG-Token:    p(y1) = .25*.5 + .75*.1 = .2 ; p(y2) = .25*.2 + .75*.6 = .5 ; p(y) = .1
RAG-Sequence: p(y)  = .25*(.5*.2) + .75*(.1*.6) = .025 + .045 = .07
Token posteriors:    y1: [.125, .075]/.2 = [.625, .375] ; y2: [.05, .45]/.5 = [.1, .9]
Sequence posteriors: after y1: [.625, .375] ; after y2: [.025, .045]/.07 = [5/14, 9/14]
"""
from __future__ import annotations

import math

import pytest
import torch

from rag_demo.measure.reference import rag_sequence_logprob_hf  # the reference's convention (parity only)
from rag_demo.rag.marginalize import (
    doc_log_prior,
    logprob_without_each,
    rag_sequence_logprob,
    rag_token_logprob,
    rag_token_next,
    sequence_posteriors,
    token_posteriors,
)

SCORES = torch.tensor([0.0, math.log(3.0)])
LP = torch.log(torch.tensor([[0.5, 0.2], [0.1, 0.6]]))  # (K=2, T=2)
# Results are float32 logs / exps / logsumexps of the hand-set probabilities: within 6e-8 of the
# exact fractions (measured). 1e-6 absolute on probabilities <= 1 is ~15x that, and far below
# every difference these tests tell apart (.07 vs .1, .2 vs .6, a missing prior or mask).
HAND = {"rtol": 0.0, "atol": 1e-6}


def test_doc_prior_is_softmax_of_scores():
    torch.testing.assert_close(doc_log_prior(SCORES).exp(), torch.tensor([0.25, 0.75]), **HAND)


def test_rag_token_probability():
    got = rag_token_logprob(LP, doc_log_prior(SCORES)).exp()
    torch.testing.assert_close(got, torch.tensor(0.1), **HAND)


def test_rag_sequence_probability():
    got = rag_sequence_logprob(LP, doc_log_prior(SCORES)).exp()
    torch.testing.assert_close(got, torch.tensor(0.07), **HAND)


def test_token_and_sequence_differ_where_the_prior_enters():
    """Same numbers, different models: .1 vs .07 (prior per token vs per sequence)."""
    prior = doc_log_prior(SCORES)
    token, sequence = float(rag_token_logprob(LP, prior).exp()), float(rag_sequence_logprob(LP, prior).exp())
    assert token - sequence == pytest.approx(0.1 - 0.07, abs=HAND["atol"])


def test_rag_token_next_mixes_the_vocabulary():
    """Vocab [a, b]: doc 1 [.5, .5], doc 2 [.1, .9] -> a: .25*.5+.75*.1 = .2, b: .8."""
    lp = torch.log(torch.tensor([[[0.5, 0.5], [0.1, 0.9]]]))  # (B=1, K=2, V=2)
    got = rag_token_next(lp, doc_log_prior(SCORES)).exp()
    torch.testing.assert_close(got, torch.tensor([[0.2, 0.8]]), **HAND)
    torch.testing.assert_close(got.sum(-1), torch.tensor([1.0]), **HAND)


def test_token_posteriors():
    got = token_posteriors(LP, doc_log_prior(SCORES))  # (T, K)
    torch.testing.assert_close(got, torch.tensor([[0.625, 0.375], [0.1, 0.9]]), **HAND)
    torch.testing.assert_close(got.sum(-1), torch.ones(2), **HAND)


def test_sequence_posteriors_last_row_is_doc_posterior():
    got = sequence_posteriors(LP, doc_log_prior(SCORES))  # (T, K)
    torch.testing.assert_close(got, torch.tensor([[0.625, 0.375], [5 / 14, 9 / 14]]), **HAND)
    torch.testing.assert_close(got.sum(-1), torch.ones(2), **HAND)


def test_mask_ignores_padding():
    """A padded third token (any value) must not change either score."""
    lp3 = torch.cat([LP, torch.full((2, 1), -7.0)], dim=1)  # (K, 3)
    mask = torch.tensor([1.0, 1.0, 0.0])
    prior = doc_log_prior(SCORES)
    torch.testing.assert_close(rag_sequence_logprob(lp3, prior, mask).exp(), torch.tensor(0.07), **HAND)
    torch.testing.assert_close(rag_token_logprob(lp3, prior, mask).exp(), torch.tensor(0.1), **HAND)


def test_reference_convention_loses_prior_on_one_token_answers():
    """One-token answer y1: ours log(.25*.5 + .75*.1) = log .2; the reference adds the prior at
    the second token, which does not exist, so it gets log(.5 + .1) = log .6 (not a probability
    of anything: huggingface/transformers#9312)."""
    lp1 = LP[:, :1]  # (K, 1)
    mask = torch.ones(1)
    prior = doc_log_prior(SCORES)
    torch.testing.assert_close(rag_sequence_logprob(lp1, prior, mask).exp(), torch.tensor(0.2), **HAND)
    hf = rag_sequence_logprob_hf(lp1, prior, mask, first_is_bos=False)
    torch.testing.assert_close(hf.exp(), torch.tensor(0.6), **HAND)


def test_reference_convention_skips_bos():
    """With a BOS first, the reference scores only tokens after it: y = [bos, y1, y2] with
    p(bos) = 1 under both docs gives the same .07 as ours on [y1, y2]."""
    lp = torch.cat([torch.zeros(2, 1), LP], dim=1)  # (K, 3): log p(bos) = 0
    mask = torch.ones(3)
    prior = doc_log_prior(SCORES)
    hf = rag_sequence_logprob_hf(lp, prior, mask, first_is_bos=True)
    torch.testing.assert_close(hf.exp(), torch.tensor(0.07), **HAND)


def test_taking_a_doc_away_renormalises_the_prior_over_the_rest():
    """Hand case: without doc 1 only doc 2 is left (prior 1): p(y) = .1 * .6 = .06 in both
    models; without doc 2, doc 1 alone: .5 * .2 = .1. So RAG-Token's p(y) = .1 drops by log(.1/.06)
    without doc 1 and not at all without doc 2; RAG-Sequence's .07 drops to .06 and rises to .1."""
    prior = doc_log_prior(SCORES)
    for mode in ("token", "sequence"):
        torch.testing.assert_close(logprob_without_each(LP, prior, mode).exp(), torch.tensor([0.06, 0.1]), **HAND)
    # with 3 docs the other two share the prior in proportion: the explicit formula, row by row
    lp3, prior3 = torch.log(torch.tensor([[0.5, 0.2], [0.1, 0.6], [0.3, 0.3]])), torch.log(torch.tensor([.2, .3, .5]))
    for mode, f in (("token", rag_token_logprob), ("sequence", rag_sequence_logprob)):
        got = logprob_without_each(lp3, prior3, mode)
        for d in range(3):
            rest = [z for z in range(3) if z != d]
            torch.testing.assert_close(got[d], f(lp3[rest], prior3[rest] - torch.logsumexp(prior3[rest], 0)), **HAND)
    assert logprob_without_each(LP[:1], prior[:1], "token").tolist() == [float("-inf")]  # nothing left
    with pytest.raises(ValueError, match="closed-book"):
        logprob_without_each(LP, prior, "closed-book")


def test_training_loss_is_the_negative_marginal_likelihood_of_the_worked_case():
    """rag_nll on the worked case: −log .07 (RAG-Sequence), −log .1 (RAG-Token), and their mean."""
    from rag_demo.rag.marginalize import rag_nll

    prior = doc_log_prior(SCORES)
    torch.testing.assert_close(rag_nll(LP, prior, loss="sequence"), torch.tensor(-math.log(0.07)), **HAND)
    torch.testing.assert_close(rag_nll(LP, prior, loss="token"), torch.tensor(-math.log(0.1)), **HAND)
    torch.testing.assert_close(rag_nll(LP, prior, loss="both"), torch.tensor(-(math.log(0.07) + math.log(0.1)) / 2),
                               **HAND)
    with pytest.raises(ValueError, match="loss='mean' is unknown"):
        rag_nll(LP, prior, loss="mean")
