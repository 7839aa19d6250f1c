"""Parity with transformers' RAG classes on the same tiny random DPR+BART weights.

Our engine (rag_demo.engine) against `RagTokenForGeneration` / `RagSequenceForGeneration`,
fed identical context ids and doc scores from a small FAISS index built here with our
retrieval stack. To make end-of-sequence reachable within a few steps on random weights,
some cases raise BART's `final_logits_bias` for EOS in both models alike.
"""
from __future__ import annotations

import pytest
import torch
from transformers import RagSequenceForGeneration, RagTokenForGeneration

from rag_demo import engine
from rag_demo.config import RagSettings
from rag_demo.corpus import corpus_from_documents
from rag_demo.encoders import DPRPassageEncoder
from rag_demo.index import build_index
from rag_demo.marginalize import doc_log_prior, rag_sequence_logprob
from rag_demo.generators import pad_rows
from rag_demo.random_models import fixture_passages
from rag_demo.reference import reference_generate, reference_tokens
from rag_demo.stacks import load_rag_checkpoint

K = 3
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


def _want(ref, gen, ids, mask, scores, beams: int, max_new_tokens: int) -> list[int]:
    """The reference's answer in our token convention."""
    out = reference_generate(ref, ids, mask, scores, beams, max_new_tokens)
    return reference_tokens(out[0], gen.pad_token_id, gen.eos_token_ids[0])


@pytest.mark.parametrize("eos_bias", [0.0, 5.0])
@pytest.mark.parametrize("beams", [1, 2, 4])
@pytest.mark.parametrize("question", QUESTIONS)
def test_rag_token_generate_matches_reference(tiny_ckpts, index, question, beams, eos_bias):
    ref, qenc, gen = _load(tiny_ckpts, "token", eos_bias)
    prompts, ids, mask, scores = _inputs(qenc, gen, index, question)
    s = RagSettings(k=K, num_beams=beams, max_new_tokens=12)
    ours = engine.rag_token(gen, prompts, scores[0], s)
    assert ours.tokens == _want(ref, gen, ids, mask, scores, beams, 12)
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
    assert engine.rag_token(gen, prompts, scores[0], RagSettings(k=K, num_beams=beams, max_new_tokens=12)).tokens \
        == _want(ref, gen, ids, mask, scores, beams, 12)
    answer = gen.tokenizer("vincent van gogh painted it")["input_ids"]
    with torch.no_grad():
        loss = ref(context_input_ids=ids, context_attention_mask=mask, doc_scores=scores, n_docs=K,
                   labels=torch.tensor([[gen.decoder_start_token_id] + answer])).loss
    first_lp, state = gen.prefill(prompts)
    lp, m = engine.score_candidates(gen, state, first_lp, [answer], gen.pad_token_id)  # (K, 1, T)
    from rag_demo.marginalize import rag_token_logprob

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
    torch.testing.assert_close(both_lp[0], alone_lp[0], rtol=1e-5, atol=1e-5)
    both = gen.select(both, torch.tensor([1, 0]))  # the short row is now row 1
    for tok in (5, 17, 9):
        a = gen.advance(alone, torch.tensor([[tok]]))[0, -1]  # (V,)
        b = gen.advance(both, torch.tensor([[tok], [tok]]))[1, -1]  # (V,)
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


def test_eos_bias_makes_short_answers(tiny_ckpts, index):
    """The biased cases really exercise the end-of-sequence paths (else the test above could
    pass while only ever comparing max-length outputs)."""
    _, qenc, gen = _load(tiny_ckpts, "token", 5.0)
    lens = []
    for q in QUESTIONS:
        prompts, _, _, scores = _inputs(qenc, gen, index, q)
        out = engine.rag_token(gen, prompts, scores[0], RagSettings(k=K, num_beams=4, max_new_tokens=12))
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
    lp, m = engine.score_candidates(gen, state, first_lp, [answer], gen.pad_token_id)  # (K, 1, T)
    from rag_demo.marginalize import rag_token_logprob

    ours = rag_token_logprob(lp[:, 0], doc_log_prior(scores[0]), m[0])
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
    lp, m = engine.score_candidates(gen, state, first_lp, cands, gen.pad_token_id)  # (K, C, T)
    prior = doc_log_prior(scores[0])
    from rag_demo.marginalize import rag_sequence_logprob_hf

    lp_c = lp.permute(1, 0, 2)  # (C, K, T)
    hf_style = rag_sequence_logprob_hf(lp_c, prior.expand(C, -1), m, first_is_bos=True)
    torch.testing.assert_close(-hf_style, loss, rtol=1e-5, atol=1e-5)
    # ours: BOS scored, prior once, on the same numbers
    ours = rag_sequence_logprob(lp_c, prior.expand(C, -1), m)
    manual = torch.stack([torch.logsumexp(prior + (lp_c[c] * m[c]).sum(-1), 0) for c in range(C)])
    torch.testing.assert_close(ours, manual)
    assert (ours < -hf_style - 1e-4).all()  # scoring BOS can only lower log p(y|x)


@pytest.mark.parametrize("eos_bias", [0.0, 5.0])
@pytest.mark.parametrize("beams", [1, 3])
@pytest.mark.parametrize("question", QUESTIONS)
def test_rag_sequence_thorough_matches_reference_generate(tiny_ckpts, index, question, beams, eos_bias):
    ref, qenc, gen = _load(tiny_ckpts, "sequence", eos_bias)
    prompts, ids, mask, scores = _inputs(qenc, gen, index, question)
    s = RagSettings(k=K, num_beams=beams, max_new_tokens=10)
    ours = engine.rag_sequence(gen, prompts, scores[0], s, hf_compat_score=True)  # ranked by the reference's score
    assert ours.tokens == _want(ref, gen, ids, mask, scores, beams, 10)
    assert len(ours.candidates) >= 1


def test_rag_sequence_fast_uses_only_producing_docs(tiny_ckpts, index):
    """Fast decoding: a candidate's score sums p(z|x) p(y|x,z) over the docs whose search made it,
    so it can only be lower than or equal to the thorough score of the same candidate."""
    _, qenc, gen = _load(tiny_ckpts, "sequence", 5.0)
    prompts, _, _, scores = _inputs(qenc, gen, index, QUESTIONS[0])
    fast = engine.rag_sequence(gen, prompts, scores[0], RagSettings(k=K, num_beams=2, max_new_tokens=10, sequence_decoding="fast"))
    thorough = engine.rag_sequence(gen, prompts, scores[0], RagSettings(k=K, num_beams=2, max_new_tokens=10))
    assert fast.decoding.startswith("fast") and thorough.decoding.startswith("thorough")
    th = {tuple(gen.tokenizer(gen.decode(t))["input_ids"]): sc for t, sc in thorough.candidates}
    full = dict((tuple(t), sc) for t, sc in thorough.candidates)
    for toks, sc in fast.candidates:
        assert sc <= full[tuple(toks)] + 1e-4
    assert th  # candidates exist


def test_greedy_attribution_equals_teacher_forced_pass(tiny_ckpts, index):
    """Greedy RAG-Token records each doc's log-prob of every chosen token while decoding; that
    must equal scoring the final answer under each doc in one teacher-forced pass."""
    _, qenc, gen = _load(tiny_ckpts, "token", 5.0)
    prompts, _, _, scores = _inputs(qenc, gen, index, QUESTIONS[1])
    out = engine.rag_token(gen, prompts, scores[0], RagSettings(k=K, max_new_tokens=12))
    first_lp, state = gen.prefill(prompts)
    forced = engine.score_candidates(gen, state, first_lp, [out.tokens], gen.pad_token_id)[0][:, 0]  # (K, T)
    torch.testing.assert_close(out.doc_lp, forced, rtol=1e-4, atol=1e-4)
    assert out.doc_lp.shape == (K, len(out.tokens))
