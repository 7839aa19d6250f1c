"""Context-aware decoding (ReaderAids.context_contrast, rag_demo/reader/contrast.py).

The choice rule on hand-made distributions; validation; then the engine on a tiny random Llama
with SmolLM2's real tokenizer: every step's choice is the argmax of (1 + a) log p(with passages)
- a log p(without) over the plausible tokens (recomputed here by teacher forcing the answer
under the doc prompts and the closed-book prompt), the recorded log-probs stay the model's own,
0 changes nothing, and the pipeline hands the engine the question's closed-book prompt.
"""
from __future__ import annotations

import math
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from rag_demo.config import RagSettings  # noqa: E402
from rag_demo.rag.decoding import NEG, score_candidates  # noqa: E402
from rag_demo.reader.contrast import CONTRAST_PLAUSIBLE, Contrast  # noqa: E402
from rag_demo.rag.engine import rag_sequence, rag_token  # noqa: E402
from rag_demo.rag.marginalize import doc_log_prior, rag_token_logprob  # noqa: E402
from test_echo import _run  # noqa: E402
from test_echo import PASSAGES, QUESTION, SCORES, _prompts  # noqa: E402  (the same three passages and question)


def test_the_choice_rule_on_a_worked_example():
    # token 0: the model's favourite with or without the passage; token 1: the passage makes it
    # 4x likelier; token 2: 100x likelier, but implausible under the passage (below 0.1 x the top); token 3: plausible
    with_p = torch.tensor([[0.50, 0.40, 0.04, 0.06]]).log()  # (1, V)
    without = torch.tensor([[0.80, 0.10, 0.0004, 0.0996]]).log()  # (1, V)
    c = Contrast(None, None, without, alpha=1.0)
    pick = c.pick(with_p)  # (1, V)
    assert int(pick.argmax()) == 1  # 2 log 0.4 - log 0.1 beats 2 log 0.5 - log 0.8
    assert pick[0, 1].item() == pytest.approx(2 * math.log(0.4) - math.log(0.1), abs=1e-5)
    assert pick[0, 2].item() == NEG  # 0.04 < 0.1 * 0.5: cut, though the passage made it 100x likelier
    assert pick[0, 3].item() == pytest.approx(2 * math.log(0.06) - math.log(0.0996), abs=1e-5)  # 0.06 is not
    assert int(Contrast(None, None, without, alpha=0.1).pick(with_p).argmax()) == 0  # a weak pull keeps 0
    assert CONTRAST_PLAUSIBLE == 0.1
    # token 0 ends the answer: the beam's own favourite is an end, so its distribution chooses
    ending = Contrast(None, None, without, alpha=1.0, ends=[0]).pick(with_p)
    assert int(ending.argmax()) == 0 and torch.equal(ending, with_p)
    assert int(Contrast(None, None, without, alpha=1.0, ends=[1]).pick(with_p).argmax()) == 1  # not its favourite


def _closed(gen):
    return gen.prompt(QUESTION, None, 64, "short", examples=())


def _settings(a, n=6):
    """The paper's algorithm, greedy, with context contrast `a` the one aid on."""
    return RagSettings(preset="paper", k=3, max_new_tokens=n, answer_style="short", context_contrast=a)


def _full_lp(gen, prompts, tokens):
    """Teacher-forced next-token log-probs (R, T, V) at every answer position, after each prompt."""
    first, state = gen.prefill(prompts)  # (R, V)
    if len(tokens) == 1:
        return first[:, None]
    rest = gen.advance(state, torch.tensor([tokens[:-1]] * len(prompts)))  # (R, T-1, V)
    return torch.cat([first[:, None], rest], dim=1)  # (R, T, V)


def _contrasted(with_p, without, a, ends):
    """(T, V) what the argmax should see at each step."""
    plausible = with_p >= with_p.max(-1, keepdim=True).values + math.log(CONTRAST_PLAUSIBLE)
    out = ((1 + a) * with_p - a * without).masked_fill(~plausible, NEG)
    for t in range(len(out)):
        if int(with_p[t].argmax()) in ends:
            out[t] = with_p[t]
    return out


def test_rag_token_chooses_by_the_contrast_and_keeps_exact_scores(gen):
    a = 4.0
    base = _run(rag_token, gen, _settings(0.0))
    out = _run(rag_token, gen, _settings(a))
    assert out.tokens != base.tokens, "a strong contrast changed nothing: the test would check nothing"
    prior = doc_log_prior(SCORES)  # (K,)
    docs = _full_lp(gen, _prompts(gen), out.tokens)  # (K, T, V)
    mixed = torch.log_softmax(torch.logsumexp(prior[:, None, None] + docs, 0), -1)  # (T, V)
    without = _full_lp(gen, [_closed(gen)], out.tokens)[0]  # (T, V)
    assert out.tokens == _contrasted(mixed, without, a, gen.stop_token_ids("short")).argmax(-1).tolist()
    # the scores are the model's own, whatever chose the tokens
    first_lp, state = gen.prefill(_prompts(gen))
    lp, _ = score_candidates(gen, state, first_lp, [out.tokens], gen.pad_token_id)  # (K, 1, T)
    torch.testing.assert_close(out.doc_lp, lp[:, 0], atol=1e-5, rtol=0)
    assert out.logprob == pytest.approx(float(rag_token_logprob(lp[:, 0], prior)), abs=1e-5)


def test_rag_sequence_contrasts_each_docs_own_search(gen):
    a = 4.0
    base = _run(rag_sequence, gen, _settings(0.0))
    out = _run(rag_sequence, gen, _settings(a))
    assert [c[0] for c in out.candidates] != [c[0] for c in base.candidates]
    for z, prompt in enumerate(_prompts(gen)):  # each doc's draft, replayed step by step
        tokens: list[int] = []
        for _ in range(6):
            with_p = _full_lp(gen, [prompt], tokens + [0])[0, -1]  # (V,) after the tokens so far
            without = _full_lp(gen, [_closed(gen)], tokens + [0])[0, -1]  # (V,)
            tokens.append(int(_contrasted(with_p[None], without[None], a, gen.stop_token_ids("short")).argmax()))
            if gen.stop_token_ids("short").ends_at(tokens, len(tokens) - 1):
                break
        assert tokens in [c[0] for c in out.candidates], z


def test_zero_or_beam_search_ignore_the_prompt(gen):
    base = _run(rag_token, gen, _settings(0.0))
    off = _run(rag_token, gen, _settings(0.0))
    assert off.tokens == base.tokens
    beams = _settings(2.0).merged(num_beams=2)
    b0 = _run(rag_token, gen, beams.merged(context_contrast=0))
    b1 = _run(rag_token, gen, beams)
    assert b1.tokens == b0.tokens


def test_the_pipeline_hands_the_engine_the_closed_book_prompt(tiny_offline, monkeypatch):
    import rag_demo.generating as P  # where the pipeline calls the engine

    seen = []
    real = P.rag_token

    def spy(gen, prompts, scores, d, reader, *args, **kw):
        contrast = [p for p in getattr(reader, "parts", []) if p.knob == "context_contrast"]
        seen.append(contrast[0].closed_prompt if contrast else None)
        return real(gen, prompts, scores, d, reader, *args, **kw)

    monkeypatch.setattr(P, "rag_token", spy)
    tiny_offline.answer(QUESTION, "token", context_contrast=0)
    tiny_offline.answer(QUESTION, "token", context_contrast=1.0)
    gen = tiny_offline.stack.modes["token"].generator
    assert seen == [None, gen.prompt(QUESTION, None, 64, "short", examples=())]


@pytest.fixture(scope="module")
def tiny_offline(three_passage_pipe, gen):
    settings = RagSettings(preset="aided", k=3, max_new_tokens=5, num_beams=1, worked_examples=0, answer_style="short", max_doc_tokens=64)
    return three_passage_pipe(gen, PASSAGES, settings)
