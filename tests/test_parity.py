"""Parity with transformers' RAG classes on the same tiny random DPR+BART weights.

Our engine (rag_demo.rag.engine) against `RagTokenForGeneration` / `RagSequenceForGeneration`,
fed identical context ids and doc scores from a small FAISS index built here with our
retrieval stack. To make end-of-sequence reachable within a few steps on random weights,
some cases raise BART's `final_logits_bias` for EOS in both models alike.
"""
from __future__ import annotations

import pytest
import torch
from transformers import RagSequenceForGeneration, RagTokenForGeneration

from rag_demo.config import Decoding, RagSettings
from rag_demo.knowledge.corpus import corpus_from_documents
from rag_demo.rag import engine
from rag_demo.rag.decoding import Rows, score_candidates, search
from rag_demo.rag.hooks import PAPER
from rag_demo.models.encoders import DPRPassageEncoder
from rag_demo.knowledge.index import build_index
from rag_demo.rag.marginalize import doc_log_prior, rag_sequence_logprob
from rag_demo.models.generators import pad_rows
from rag_demo.models.random_models import fixture_passages
from rag_demo.measure.reference import REFERENCE_SCORING, reference_generate, reference_tokens, rag_sequence_logprob_hf
from rag_demo.models.stacks import load_rag_checkpoint

K = 3


def paper(**knobs) -> Decoding:
    """The paper preset's decoding with these knobs. The parity is the paper's algorithm against
    transformers': this fails the test if the preset ever switches a reader aid on."""
    s = RagSettings(preset="paper", **knobs)
    assert s.aids_on() == [], f"the paper preset has reader aids on: {s.aids_on()}"
    return s.decoding


QUESTIONS = ["who painted the starry night", "what is the capital of france", "when did apollo 11 land on the moon"]


@pytest.fixture(scope="module")
def index(tiny_ckpts):
    corpus = corpus_from_documents("fixture", [(t, x, None) for t, x in fixture_passages()])
    return build_index(corpus, DPRPassageEncoder.from_pretrained(tiny_ckpts["ctx_encoder"]))


def _load(tiny_ckpts, kind: str, eos_bias: float):
    """(reference model, our question encoder, our generator) with the same weights and EOS bias."""
    cls = RagTokenForGeneration if kind == "token" else RagSequenceForGeneration
    ref = cls.from_pretrained(tiny_ckpts[f"rag_{kind}"]).eval()
    qenc, gen = load_rag_checkpoint(str(tiny_ckpts[f"rag_{kind}"]), kind)
    for m in (ref.rag.generator, gen.model):
        m.final_logits_bias[0, m.config.eos_token_id] += eos_bias
    return ref, qenc, gen


def _inputs(qenc, gen, index, question: str, doc_tokens: tuple[int, ...] = (64,) * K):
    """Retrieve K docs with our stack; -> prompts, padded context ids/mask (K, S), doc_scores (1, K).
    doc_tokens: each doc's token budget (the default gives equal-length prompts, no padding)."""
    scores, passages = index.search(qenc.encode_questions([question]), K)
    prompts = [gen.prompt(question, p, max_doc_tokens=n) for p, n in zip(passages[0], doc_tokens)]
    ids, mask = pad_rows(prompts, gen.pad_token_id)  # (K, S) right-padded, as RagRetriever hands them over
    return prompts, ids, mask, torch.from_numpy(scores.copy())


def _want(ref, gen, ids, mask, scores, beams: int, max_new_tokens: int, length_penalty: float = 1.0) -> list[int]:
    """The reference's answer in our token convention."""
    out = reference_generate(ref, ids, mask, scores, beams, max_new_tokens, length_penalty)
    return reference_tokens(out[0], gen.pad_token_id, gen.eos_token_ids[0])


@pytest.mark.parametrize("length_penalty", [0.0, 1.0])  # ours (the paper's: none), transformers' default
@pytest.mark.parametrize("eos_bias", [0.0, 5.0])
@pytest.mark.parametrize("beams", [1, 2, 4])
@pytest.mark.parametrize("question", QUESTIONS)
def test_rag_token_generate_matches_reference(tiny_ckpts, index, question, beams, eos_bias, length_penalty):
    ref, qenc, gen = _load(tiny_ckpts, "token", eos_bias)
    prompts, ids, mask, scores = _inputs(qenc, gen, index, question)
    s = paper(k=K, num_beams=beams, max_new_tokens=12, length_penalty=length_penalty)
    ours = engine.rag_token(gen, prompts, scores[0], s, PAPER)
    assert ours.tokens == _want(ref, gen, ids, mask, scores, beams, 12, length_penalty)
    assert len(ours.tokens) >= 1


UNEQUAL = (64, 12, 30)  # doc budgets giving prompts of three lengths: rows 2 and 3 are padded


@pytest.mark.parametrize("beams", [1, 3])
def test_padded_contexts_match_reference(tiny_ckpts, index, beams):
    """Prompts of unequal length (right-padded): generate and NLL still equal the reference,
    so the encoder padding mask reaches the decoder's cross-attention."""
    ref, qenc, gen = _load(tiny_ckpts, "token", 0.0)
    q = QUESTIONS[0]
    prompts, ids, mask, scores = _inputs(qenc, gen, index, q, UNEQUAL)
    assert len(set(map(len, prompts))) == K and not bool(mask.all())
    s = paper(k=K, num_beams=beams, max_new_tokens=12)
    assert engine.rag_token(gen, prompts, scores[0], s, PAPER).tokens == _want(ref, gen, ids, mask, scores, beams, 12,
                                                                                s.length_penalty)
    answer = gen.tokenizer("vincent van gogh painted it")["input_ids"]
    with torch.no_grad():
        loss = ref(context_input_ids=ids, context_attention_mask=mask, doc_scores=scores, n_docs=K,
                   labels=torch.tensor([[gen.decoder_start_token_id] + answer])).loss
    first_lp, state = gen.prefill(prompts)
    lp, m = score_candidates(gen, state, first_lp, [answer], gen.pad_token_id)  # (K, 1, T)
    from rag_demo.rag.marginalize import rag_token_logprob

    # same weights, other code path (our cache and row layout vs the reference's batch): float32
    # reordering, 0 measured on this loss of ~62; 1e-5 relative (~6e-4 here) is still far below
    # what a mask that misses the padding changes (the reason for this test)
    torch.testing.assert_close(-rag_token_logprob(lp[:, 0], doc_log_prior(scores[0]), m[0]), loss[0],
                               rtol=1e-5, atol=1e-5)


def test_padding_does_not_change_a_rows_log_probs(tiny_ckpts, index):
    """A short prompt alone, and batched with a longer one (so padded): same log-probs at
    prefill, after decoding steps, and after rows are selected (beam reordering)."""
    _, qenc, gen = _load(tiny_ckpts, "token", 0.0)
    prompts = _inputs(qenc, gen, index, QUESTIONS[1], UNEQUAL)[0]
    short, long_ = prompts[1], prompts[0]
    alone_lp, alone = gen.prefill([short])  # (1, V)
    both_lp, both = gen.prefill([short, long_])  # (2, V)
    # a row alone vs in a padded batch: float32 reordering only, 9.5e-7 abs / 1.4e-7 rel measured on
    # log-probs down to -7.4; 1e-5 leaves ~10x, while attending to the padding moves them by > 1e-2
    torch.testing.assert_close(both_lp[0], alone_lp[0], rtol=1e-5, atol=1e-5)
    both = gen.select(both, torch.tensor([1, 0]))  # the short row is now row 1
    for tok in (5, 17, 9):
        a = gen.advance(alone, torch.tensor([[tok]]))[0, -1]  # (V,)
        b = gen.advance(both, torch.tensor([[tok], [tok]]))[1, -1]  # (V,)
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)  # as at prefill: <= 9.5e-7 measured


def test_eos_bias_makes_short_answers(tiny_ckpts, index):
    """The biased cases really exercise the end-of-sequence paths (else the test above could
    pass while only ever comparing max-length outputs)."""
    _, qenc, gen = _load(tiny_ckpts, "token", 5.0)
    lens = []
    for q in QUESTIONS:
        prompts, _, _, scores = _inputs(qenc, gen, index, q)
        out = engine.rag_token(gen, prompts, scores[0], paper(k=K, num_beams=4, max_new_tokens=12), PAPER)
        lens.append(len(out.tokens))
        assert out.tokens[-1] in gen.eos_token_ids or len(out.tokens) == 12
    assert min(lens) < 12


@pytest.mark.parametrize("question", QUESTIONS)
def test_rag_token_nll_matches_reference_loss(tiny_ckpts, index, question):
    ref, qenc, gen = _load(tiny_ckpts, "token", 0.0)
    prompts, ids, mask, scores = _inputs(qenc, gen, index, question)
    answer = gen.tokenizer("vincent van gogh painted it")["input_ids"]  # [bos, ..., eos]
    labels = torch.tensor([[gen.decoder_start_token_id] + answer])
    with torch.no_grad():
        loss = ref(context_input_ids=ids, context_attention_mask=mask, doc_scores=scores, labels=labels,
                   n_docs=K).loss  # (1,) per-sample NLL, no smoothing
    first_lp, state = gen.prefill(prompts)
    lp, m = score_candidates(gen, state, first_lp, [answer], gen.pad_token_id)  # (K, 1, T)
    from rag_demo.rag.marginalize import rag_token_logprob

    ours = rag_token_logprob(lp[:, 0], doc_log_prior(scores[0]), m[0])
    # float32 sums in another order: 3.8e-6 measured on a loss of 61.9 (6e-8 relative); 1e-5
    # relative allows other CPUs' kernels, a token scored under the wrong prefix is off by > 1e-1
    torch.testing.assert_close(-ours, loss[0], rtol=1e-5, atol=1e-5)


def _candidates(gen):
    tok = gen.tokenizer
    return [
        tok("vincent van gogh")["input_ids"],  # starts with BOS
        tok("paris")["input_ids"],
        tok("the moon in 1969 was")["input_ids"],
    ]


@pytest.mark.parametrize("question", QUESTIONS)
def test_rag_sequence_scores_match_reference_get_nll(tiny_ckpts, index, question):
    """Our scores with the reference's convention equal `get_nll`; ours differ exactly by
    scoring BOS too and adding the prior once (huggingface/transformers#9312)."""
    ref, qenc, gen = _load(tiny_ckpts, "sequence", 0.0)
    prompts, ids, mask, scores = _inputs(qenc, gen, index, question)
    cands = _candidates(gen)
    C = len(cands)
    labels = pad_rows([[gen.decoder_start_token_id] + toks for toks in cands], gen.pad_token_id)[0]  # (C, 1 + T)
    with torch.no_grad():
        loss = ref(context_input_ids=ids.repeat(C, 1), context_attention_mask=mask.repeat(C, 1),
                   doc_scores=scores.repeat(C, 1), labels=labels, exclude_bos_score=True, n_docs=K).loss  # (C,)
    first_lp, state = gen.prefill(prompts)
    lp, m = score_candidates(gen, state, first_lp, cands, gen.pad_token_id)  # (K, C, T)
    prior = doc_log_prior(scores[0])

    lp_c = lp.permute(1, 0, 2)  # (C, K, T)
    hf_style = rag_sequence_logprob_hf(lp_c, prior.expand(C, -1), m, first_is_bos=True)
    # as for RAG-Token: 3.8e-6 measured on losses up to 41.5, 1e-5 relative
    torch.testing.assert_close(-hf_style, loss, rtol=1e-5, atol=1e-5)
    # ours: BOS scored, prior once, on the same numbers (same float32 values, summed via a mask
    # product instead of torch.where: 0 measured; 1e-6 relative is a few ulps of ~48)
    ours = rag_sequence_logprob(lp_c, prior.expand(C, -1), m)
    manual = torch.stack([torch.logsumexp(prior + (lp_c[c] * m[c]).sum(-1), 0) for c in range(C)])
    torch.testing.assert_close(ours, manual, rtol=1e-6, atol=1e-6)
    assert (ours < -hf_style - 1e-4).all()  # scoring BOS can only lower log p(y|x): by 6.8 measured


@pytest.mark.parametrize("length_penalty", [0.0, 1.0])  # ours (the paper's: none), transformers' default
@pytest.mark.parametrize("eos_bias", [0.0, 5.0])
@pytest.mark.parametrize("beams", [1, 3])
@pytest.mark.parametrize("question", QUESTIONS)
def test_rag_sequence_thorough_matches_reference_generate(tiny_ckpts, index, question, beams, eos_bias, length_penalty):
    ref, qenc, gen = _load(tiny_ckpts, "sequence", eos_bias)
    prompts, ids, mask, scores = _inputs(qenc, gen, index, question)
    s = paper(k=K, num_beams=beams, max_new_tokens=10, sequence_decoding="thorough", length_penalty=length_penalty)
    ours = engine.rag_sequence(gen, prompts, scores[0], s, REFERENCE_SCORING)  # ranked by the reference's score
    assert ours.tokens == _want(ref, gen, ids, mask, scores, beams, 10, length_penalty)
    assert max(ours.candidates, key=lambda c: c[1])[0] == ours.tokens  # the answer is the best-scored candidate


def test_rag_sequence_scores_marginalise_teacher_forced_log_probs(tiny_ckpts, index):
    """RAG-Sequence candidate scores on BART, against an independent computation: each doc's beam
    search scores a candidate with log p(y|x,z) as a teacher-forced pass computes it; thorough
    decoding's score is logsumexp_z [log p(z|x) + log p(y|x,z)] over every doc, fast decoding's
    the same over only the docs whose search produced y. (On these random weights every doc's
    search produces the same candidates, the decoder barely reading the passage, so fast equals
    thorough here; test_decoding.py::test_rag_sequence_fast_uses_only_producing_docs has docs
    that disagree.)

    Tolerance: the searches' log-probs come from incremental decoding (KV cache, beam reordering),
    the oracle's from one teacher-forced pass: float32 sums in another order. 0 measured here,
    < 1e-6 for this model in test_padding_does_not_change_a_rows_log_probs; 1e-5 absolute on
    log-probs around -9 (~20 ulps) is far below a missing token's or prior's effect (> 1e-1)."""
    _, qenc, gen = _load(tiny_ckpts, "sequence", 5.0)
    prompts, _, _, scores = _inputs(qenc, gen, index, QUESTIONS[0])
    s = paper(k=K, num_beams=2, max_new_tokens=10, sequence_decoding="fast")
    fast = engine.rag_sequence(gen, prompts, scores[0], s, PAPER)
    thorough = engine.rag_sequence(gen, prompts, scores[0], paper(k=K, num_beams=2, max_new_tokens=10,
                                                                  sequence_decoding="thorough"), PAPER)
    assert fast.decoding.startswith("fast") and thorough.decoding.startswith("thorough")
    # which docs produced which candidate: one beam search per doc, as the engine runs them
    prior = doc_log_prior(scores[0])  # (K,)
    first_lp, state = gen.prefill(prompts)  # (K, V)
    rows = Rows(gen, gen.select(state, torch.arange(K)), per_beam=1, prior=None)
    groups = search(rows, first_lp, K, s, gen.eos_token_ids)
    producers: dict[tuple[int, ...], dict[int, float]] = {}  # candidate -> {doc: its search's log p(y|x,z)}
    for z, hyps in enumerate(groups):
        for h in hyps:
            producers.setdefault(tuple(h.tokens), {})[z] = h.logprob
    cands = [list(c) for c in producers]
    assert [t for t, _ in fast.candidates] == cands and [t for t, _ in thorough.candidates] == cands
    lp, mask = score_candidates(gen, state, first_lp, cands, gen.pad_token_id)  # (K, C, T), (C, T)
    per_doc = (lp * mask).sum(-1)  # (K, C) teacher-forced log p(y|x,z)
    for c, ((toks, fast_sc), (_, thorough_sc)) in enumerate(zip(fast.candidates, thorough.candidates)):
        made_by = producers[tuple(toks)]
        for z, search_lp in made_by.items():
            assert search_lp == pytest.approx(float(per_doc[z, c]), rel=0, abs=1e-5)
        want_fast = torch.logsumexp(torch.stack([prior[z] + per_doc[z, c] for z in made_by]), 0)
        assert fast_sc == pytest.approx(float(want_fast), rel=0, abs=1e-5)
        assert thorough_sc == pytest.approx(float(torch.logsumexp(prior + per_doc[:, c], 0)), rel=0, abs=1e-5)


def test_greedy_attribution_equals_teacher_forced_pass(tiny_ckpts, index):
    """Greedy RAG-Token records each doc's log-prob of every chosen token while decoding; that
    must equal scoring the final answer under each doc in one teacher-forced pass."""
    _, qenc, gen = _load(tiny_ckpts, "token", 5.0)
    prompts, _, _, scores = _inputs(qenc, gen, index, QUESTIONS[1])
    out = engine.rag_token(gen, prompts, scores[0], paper(k=K, max_new_tokens=12), PAPER)
    first_lp, state = gen.prefill(prompts)
    forced = score_candidates(gen, state, first_lp, [out.tokens], gen.pad_token_id)[0][:, 0]  # (K, T)
    # incremental decoding vs one teacher-forced pass: float32 reordering, 0 measured (< 1e-6 for
    # the padded-batch rows above); 1e-5 leaves margin, a log-prob recorded one step off is > 1e-1 away
    torch.testing.assert_close(out.doc_lp, forced, rtol=1e-5, atol=1e-5)
    assert out.doc_lp.shape == (K, len(out.tokens))
