"""Our engine side by side with transformers' RAG classes, on the same weights and inputs.

Owns everything that speaks the reference's language: its generate call (and its
`max_length` quirk), turning its output rows into our token convention, DPR doc scores as
the reference computes them, and `compare_with_transformers`, the timed comparison behind
`python -m rag_demo bench`. The parity tests (tests/test_parity.py) and the bench test use
the same functions, so what the bench times is what the tests check.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

from rag_demo.config import RagSettings
from rag_demo.models.generators import pad_rows
from rag_demo.rag.hooks import Reader


def rag_sequence_logprob_hf(
    lp: torch.Tensor, prior: torch.Tensor, mask: torch.Tensor, first_is_bos: bool
) -> torch.Tensor:
    """The reference's RAG-Sequence score (transformers `RagSequenceForGeneration.get_nll` with
    `exclude_bos_score=True`), reproduced for parity tests only.

    It adds the prior to the *second* token's log-prob, and if every candidate starts with
    BOS it drops the first token's score. So a one-token answer, or one whose second position
    is padding, silently loses its prior (huggingface/transformers#9312). Ours
    (`rag_sequence_logprob`) always adds it once.

    lp (..., K, T), prior (..., K), mask (..., T), first_is_bos: as the reference's
    `target[:, 0].eq(bos).all()` over all candidates -> (...).
    """
    lp = lp.clone()
    if lp.shape[-1] > 1:
        lp[..., 1] = lp[..., 1] + prior  # (..., K)  prior at the second token
    lp = torch.where(mask.unsqueeze(-2).bool(), lp, 0.0)  # (..., K, T)  masked after adding: a pad there loses the prior
    if first_is_bos:
        lp = lp[..., 1:]  # (..., K, T-1)
    return torch.logsumexp(lp.sum(-1), dim=-1)  # (...)


class ReferenceScoring(Reader):
    """The paper's reader, except that thorough RAG-Sequence ranks its candidates by the
    reference's score (`rag_sequence_logprob_hf`): what the parity checks compare against
    transformers' generate, which ranks that way."""

    def sequence_scores(self, lp, prior, mask, gen, candidates):
        bos = getattr(gen.tokenizer, "bos_token_id", None)
        first_is_bos = bos is not None and all(c and c[0] == bos for c in candidates)
        return rag_sequence_logprob_hf(lp, prior.expand(lp.shape[0], -1), mask, first_is_bos)  # (C,)


REFERENCE_SCORING = ReferenceScoring()


def reference_generate(model, ids: torch.Tensor, mask: torch.Tensor, doc_scores: torch.Tensor,
                       num_beams: int, max_new_tokens: int, length_penalty: float = 1.0) -> torch.Tensor:
    """`RagTokenForGeneration.generate` / `RagSequenceForGeneration.generate` on prepared contexts.

    ids, mask (n_docs, S) right-padded context ids, doc_scores (1, n_docs) -> (1, 1 + T) output
    ids, the decoder start token first. Length is given as `max_length` = start + new tokens:
    the reference's RAG-Token beam search sizes its buffers from max_length and ignores
    `max_new_tokens`. length_penalty: beam search's (transformers' default 1.0).
    """
    with torch.inference_mode():
        return model.generate(context_input_ids=ids, context_attention_mask=mask, doc_scores=doc_scores,
                              n_docs=doc_scores.shape[-1], num_beams=num_beams, do_sample=False,
                              max_length=1 + max_new_tokens, length_penalty=length_penalty)


def reference_tokens(row: torch.Tensor, pad: int, eos: int) -> list[int]:
    """A reference output row (1 + T,) -> our convention: no decoder start token, cut after EOS,
    no trailing padding."""
    toks = row.tolist()[1:]
    if eos in toks:
        return toks[: toks.index(eos) + 1]
    while toks and toks[-1] == pad:
        toks.pop()
    return toks


@torch.inference_mode()
def dpr_scores(q_model, q_tok, c_model, c_tok, question: str, passages: list) -> torch.Tensor:
    """(1, n_docs) DPR scores q(x)·d(z), inputs cut to the encoders' position limit (the tiny
    random DPR has 128 positions, fewer than encoders.MAX_TOKENS)."""
    n = min(256, q_model.config.max_position_embeddings, c_model.config.max_position_embeddings)
    qe = q_tok([question], truncation=True, max_length=n, return_tensors="pt")
    ce = c_tok([p.title for p in passages], [p.text for p in passages], truncation=True, max_length=n,
               padding=True, return_tensors="pt")
    return q_model(**qe).pooler_output @ c_model(**ce).pooler_output.T  # (1, n_docs)


def paired_times(a, b, reps: int):
    """Median seconds of a() and b() over `reps` rounds, alternating which runs first (so cache
    warmth and clock drift do not favour one side); -> (t_a, result_a, t_b, result_b)."""
    times: dict = {a: [], b: []}
    results: dict = {}
    for i in range(reps):
        for fn in ((a, b) if i % 2 == 0 else (b, a)):
            t0 = time.perf_counter()
            results[fn] = fn()
            times[fn].append(time.perf_counter() - t0)
    return statistics.median(times[a]), results[a], statistics.median(times[b]), results[b]


def compare_with_transformers(paths: dict, cases: list[tuple[str, list]], max_new_tokens: int = 32,
                              reps: int = 1, say: Callable[[str], None] | None = None,
                              full_length: bool = True) -> dict:
    """Our engine vs transformers' RAG generate on the same checkpoint weights.

    paths: make_random_rag_checkpoints(...) folders; cases: (question, passages) with
    len(passages) == the checkpoint's n_docs. Doc scores are the checkpoint's DPR question
    vector · the DPR context vectors. Per mode: same outputs (token lists), median seconds.

    full_length: random BART puts its EOS first on most inputs, so both sides would stop after
    one token and only the prefill would be compared. We add -1e4 to EOS in the generator's
    `final_logits_bias` (one shared module, so both sides see it) and every answer runs to
    `max_new_tokens`.
    """
    from transformers import AutoTokenizer, DPRContextEncoder, RagSequenceForGeneration, RagTokenForGeneration, RagTokenizer

    from rag_demo.rag.engine import rag_sequence, rag_token
    from rag_demo.models.encoder_decoder import EncoderDecoderGenerator

    ctx = DPRContextEncoder.from_pretrained(str(paths["ctx_encoder"])).eval()
    ctx_tok = AutoTokenizer.from_pretrained(str(paths["ctx_encoder"]))
    result = {}
    for mode, cls, key in (("token", RagTokenForGeneration, "rag_token"),
                           ("sequence", RagSequenceForGeneration, "rag_sequence")):
        model = cls.from_pretrained(str(paths[key])).eval()
        tok = RagTokenizer.from_pretrained(str(paths[key]))
        n_docs = model.config.n_docs
        gen = EncoderDecoderGenerator(model.rag.generator, tok.generator, max_input_tokens=model.config.max_combined_length)
        if full_length:
            with torch.no_grad():
                model.rag.generator.final_logits_bias[..., gen.eos_token_ids[0]] = -1e4
        # the paper's algorithm with the reference's decodings: greedy, thorough RAG-Sequence, HF's length penalty
        s = RagSettings(preset="paper", k=n_docs, num_beams=1, max_new_tokens=max_new_tokens,
                        sequence_decoding="thorough", length_penalty=1.0).decoding
        # RAG-Sequence candidates are ranked with the reference's score convention
        run = rag_token if mode == "token" else (lambda g, p, d, st: rag_sequence(g, p, d, st, REFERENCE_SCORING))
        rows = []
        for i, (q, passages) in enumerate(cases):
            if len(passages) != n_docs:
                raise ValueError(f"case {i} has {len(passages)} passages but the checkpoint's n_docs is {n_docs}: "
                                 f"pass exactly n_docs passages per question.")
            doc_scores = dpr_scores(model.rag.question_encoder, tok.question_encoder, ctx, ctx_tok, q, passages)
            prompts = [gen.prompt(q, p, s.max_doc_tokens) for p in passages]
            ids, mask = pad_rows(prompts, gen.pad_token_id)  # (n_docs, S) right-padded, as RagRetriever does

            gen_times: list[float] = []  # our generate stage alone, per call

            def ours():
                g = run(gen, prompts, doc_scores[0], s)
                gen_times.append(g.timings["generate"])
                return g

            def theirs():
                return reference_generate(model, ids, mask, doc_scores, 1, max_new_tokens)

            if i == 0:  # warm both paths up
                ours(), theirs()
                gen_times.clear()
            t_ours, g, t_hf, out = paired_times(ours, theirs, reps)
            ref = reference_tokens(out[0], gen.pad_token_id, gen.eos_token_ids[0])
            rows.append({"question": q, "same": g.tokens == ref, "ours": g.tokens, "transformers": ref,
                         "ours_s": t_ours, "ours_generate_s": statistics.median(gen_times), "transformers_s": t_hf})
            if say:
                say(f"reference {mode} {i + 1}/{len(cases)}: ours {t_ours:.3f} s, transformers {t_hf:.3f} s, "
                    f"same={rows[-1]['same']}")
        result[mode] = {
            "n_docs": n_docs, "same": all(r["same"] for r in rows), "n": len(rows),
            "ours_s_p50": statistics.median(r["ours_s"] for r in rows),
            "ours_generate_s_p50": statistics.median(r["ours_generate_s"] for r in rows),
            "transformers_s_p50": statistics.median(r["transformers_s"] for r in rows),
            # median over questions of the paired ratio: one question slowed by a noisy
            # neighbour (both sides, same rounds) cannot swing it the way a ratio of sums can
            "ratio": statistics.median(r["ours_s"] / r["transformers_s"] for r in rows),
            "ratio_generate_only": statistics.median(r["ours_generate_s"] / r["transformers_s"] for r in rows),
            "tokens_mean": sum(len(r["ours"]) for r in rows) / len(rows),
            "rows": rows,
        }
    return result


def reference_cases(questions: list[str], n_docs: int, retriever) -> list[tuple[str, list]]:
    """(question, its top n_docs passages) pairs; passages from any retriever with .search(questions, k)."""
    _, passages = retriever.search(questions, n_docs)
    return list(zip(questions, passages))
