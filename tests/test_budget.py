"""Bounded cost (rag_demo/budget.py and what uses it): estimates, refusals, deadlines, cancelling,
the step gate, and memory-bounded teacher forcing. Tiny random DPR+BART checkpoints (conftest)."""
from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import torch

from rag_demo.models.cost import CostModel, ModelDims
from rag_demo.runs import Run
from rag_demo.serving.admission import time_shares
from rag_demo.serving.budget import Budget
from rag_demo.serving.scheduler import StepScheduler
from rag_demo.config import RagSettings
from rag_demo.models.stack_spec import StackSpec
from rag_demo.knowledge.corpus import corpus_from_documents
from rag_demo.rag.decoding import score_candidates, score_pairs
from rag_demo.pipeline import RagPipeline
from rag_demo.models.random_models import fixture_passages

MODES = ["sequence", "token", "closed-book"]


@pytest.fixture(scope="module")
def pipe(tiny_ckpts, tmp_path_factory):
    spec = StackSpec(name="paper", rag_token=str(tiny_ckpts["rag_token"]), rag_sequence=str(tiny_ckpts["rag_sequence"]),
                     ctx_encoder=str(tiny_ckpts["ctx_encoder"]), cache_dir=tmp_path_factory.mktemp("cache"))
    corpus = corpus_from_documents("fixture", [(t, x, None) for t, x in fixture_passages()])
    return RagPipeline.load(spec, corpus=corpus, settings=RagSettings(preset="aided", k=3, max_new_tokens=6))


# ---------------------------------------------------------------- the cost model


def test_cost_model_worked_example():
    """One RAG-Token request worked by hand: K=2, greedy, S=10 prompt tokens, T=3 new tokens.
    seconds = 2*10*0.001 (prefill) + 3*(0.01 + 2*0.002) (steps) = 0.02 + 0.042 = 0.062.
    KV bytes per token = 2 (k, v) * 4 layers * 8 wide * 2 bytes = 128; peak = prefill state
    2*10*128 = 2560 + decoding 2 copies * 2 rows * 13 tokens * 128 = 6656 + logits 2 rows * 3 * 4 * 100 = 2400."""
    cm = CostModel(prefill_s_per_token=0.001, step_s=0.01, row_s=0.002, score_s_per_token=0.005)
    dims = ModelDims(layers=4, kv_width=8, vocab=100, dtype_bytes=2)
    sec, peak = cm.request(dims, "token", k=2, beams=1, new_tokens=3, prompt_tokens=10)
    assert sec == pytest.approx(0.062)
    assert peak == 2560 + 6656 + 2400
    # thorough RAG-Sequence with 2 beams adds the rescoring of K*B = 4 candidates under K = 2 docs
    sec_seq, _ = cm.request(dims, "sequence", k=2, beams=2, new_tokens=3, prompt_tokens=10)
    assert sec_seq == pytest.approx(0.02 + 3 * (0.01 + 4 * 0.002) + 2 * 4 * 3 * 0.005)
    fast, _ = cm.request(dims, "sequence", k=2, beams=2, new_tokens=3, prompt_tokens=10, thorough=False)
    assert fast == pytest.approx(0.02 + 3 * (0.01 + 4 * 0.002) + 2 * 1 * 3 * 0.005)
    # RAG-Token with each doc's drafts (greedy): its own K = 2 draft rows decode 3 steps, and its
    # K*B + B = 3 candidates may be scored under both docs (6 rows x 3 tokens); shared drafts
    # (RAG-Sequence asked too) cost only the scoring
    own, _ = cm.request(dims, "token", k=2, beams=1, new_tokens=3, prompt_tokens=10, drafts="own")
    assert own == pytest.approx(0.062 + 3 * (0.01 + 2 * 0.002) + 6 * 3 * 0.005)
    shared, _ = cm.request(dims, "token", k=2, beams=1, new_tokens=3, prompt_tokens=10, drafts="shared")
    assert shared == pytest.approx(0.062 + 6 * 3 * 0.005)


def test_estimate_grows_with_every_knob(pipe):
    q = "who painted the starry night"
    base = pipe.estimate(q, MODES, RagSettings(preset="aided", k=2, max_new_tokens=8))
    for more in (dict(k=3), dict(num_beams=4), dict(max_new_tokens=64)):
        bigger = pipe.estimate(q, MODES, RagSettings(preset="aided", **{"k": 2, "max_new_tokens": 8, **more}))
        assert bigger.seconds > base.seconds and bigger.peak_bytes >= base.peak_bytes, more
    assert set(base.per_mode) == set(MODES) and base.seconds == pytest.approx(sum(base.per_mode.values()))


def test_check_budget_refuses_with_what_was_asked_and_what_to_change(pipe):
    q = "who painted the starry night"
    ok = pipe.check_budget(q, MODES, RagSettings(preset="aided", k=2, max_new_tokens=4, num_beams=1), Budget())
    assert not ok.heavy
    tight = Budget(max_seconds=ok.seconds / 2)
    with pytest.raises(ValueError, match=r"K=2, beams=1, max new tokens=4.*over this server's budget: lower K"):
        pipe.check_budget(q, MODES, RagSettings(preset="aided", k=2, max_new_tokens=4, num_beams=1), tight)
    with pytest.raises(ValueError, match="GB of memory"):
        pipe.check_budget(q, MODES, RagSettings(preset="aided", k=2, max_new_tokens=4, num_beams=1), Budget(max_request_bytes=1))
    # fast RAG-Sequence is suggested only where it would change something
    for decoding, suggested in (("fast", False), ("thorough", True)):
        with pytest.raises(ValueError) as err:
            pipe.check_budget(q, MODES, RagSettings(preset="aided", k=2, max_new_tokens=4, num_beams=1, sequence_decoding=decoding),
                              Budget(max_request_bytes=1))
        assert ("use fast RAG-Sequence decoding" in str(err.value)) is suggested, decoding
    assert pipe.check_budget(q, MODES, RagSettings(preset="aided", k=2, max_new_tokens=4, num_beams=1), Budget(heavy_seconds=ok.seconds / 2)).heavy


def test_budget_rejects_bad_limits():
    with pytest.raises(ValueError, match="max_seconds"):
        Budget(max_seconds=0)


def test_calibrate_measures_positive_constants(pipe):
    """Calibration measures, and keeps each constant within CALIBRATION_RANGE of the default: the
    tiny model is far faster than SmolLM2 (its measured constants fall below the range and are
    held at its floor), and an overloaded machine could not push a constant above the ceiling."""
    from rag_demo.models.cost import CALIBRATION_RANGE

    default = CostModel()
    cm = default.calibrate(pipe.stack.modes["token"].generator, prompt_tokens=20, rows=3, steps=2)
    assert cm.calibrated and not default.calibrated
    lo, hi = CALIBRATION_RANGE
    for f in ("prefill_s_per_token", "step_s", "row_s", "score_s_per_token"):
        assert lo * getattr(default, f) <= getattr(cm, f) <= hi * getattr(default, f), f
    slow = CostModel(step_s=1e-9, row_s=1e-9).calibrate(pipe.stack.modes["token"].generator, prompt_tokens=20,
                                                          rows=3, steps=2)
    assert slow.step_s <= hi * 1e-9 and slow.row_s <= hi * 1e-9  # a measurement far above the default is capped


# ---------------------------------------------------------------- deadline, cancelling, the gate


@contextmanager
def no_eos(pipe):
    """Random BART says EOS first on most inputs; -1e4 on its EOS logit makes answers run on."""
    gens = {id(mm.generator): mm.generator for mm in pipe.stack.modes.values()}.values()
    with torch.no_grad():
        for g in gens:
            g.model.final_logits_bias[..., g.eos_token_ids[0]] = -1e4
    try:
        yield
    finally:
        with torch.no_grad():
            for g in gens:
                g.model.final_logits_bias.zero_()


@pytest.mark.parametrize("beams", [1, 2])
def test_past_deadline_stops_every_mode_and_says_so(pipe, beams):
    """Each mode's share of time already spent: each mode stops after its first step and marks the
    answer "time_limit"; thorough RAG-Sequence skips its rescoring and names what it did instead."""
    s = RagSettings(preset="aided", k=3, num_beams=beams, max_new_tokens=50, sequence_decoding="thorough")
    with no_eos(pipe):
        out = pipe.answers("who painted the starry night", MODES, s, Run(seconds={m: -1.0 for m in MODES}))
        free = pipe.answers("who painted the starry night", ["token"], s)["token"]
    for mode, a in out.items():
        assert a.stopped == "time_limit", mode
        assert 1 <= len(a.token_ids) <= 2, (mode, a.token_ids)  # the first step's token (BART may add <s>)
    assert "thorough stopped: time_limit" in out["sequence"].decoding and out["sequence"].fell_back == "fast_ranking"
    assert free.stopped == "max_new_tokens" and len(free.token_ids) >= 40  # the same request without a deadline


def test_a_mode_a_stop_made_run_something_else_says_what_it_ran(pipe):
    """One new token each, so the searches finish before they would ask the stop (it is asked
    between steps) and the deadline first cuts what comes after them: thorough RAG-Sequence's
    rescoring (the fast ranking stands) and RAG-Token's drafts (the mixture's answer stands).
    Each answer names it in `fell_back`; the same request without a deadline ran as asked."""
    s = RagSettings(preset="aided", k=3, num_beams=1, max_new_tokens=1, sequence_decoding="thorough", token_drafts=True)
    modes = ["sequence", "token"]
    cut = pipe.answers("who painted the starry night", modes, s, Run(seconds={m: -1.0 for m in modes}))
    assert cut["sequence"].fell_back == "fast_ranking" and "thorough stopped: time_limit" in cut["sequence"].decoding
    assert cut["token"].fell_back == "no_drafts" and "drafts stopped: time_limit" in cut["token"].decoding
    free = pipe.answers("who painted the starry night", modes, s)
    assert {m: a.fell_back for m, a in free.items()} == {"sequence": "", "token": ""}
    assert free["sequence"].decoding.startswith("thorough") and "drafts" in free["token"].decoding


def test_each_mode_gets_its_own_estimate_where_the_limit_allows():
    """Time shares of a 60 s limit. Estimates of 40, 30 and 2 s: each mode gets its own estimate
    (the proportional share alone gave RAG-Sequence 60·40/72 = 33 s, cutting it short of its
    estimate), at least a third of the limit, and 5/3 of the limit at most in all. Estimates of
    100, 30 and 2 s cannot all fit: RAG-Sequence gets what the bound leaves, 100 - 2·20 = 60 s."""
    fits = time_shares(SimpleNamespace(per_mode={"sequence": 40.0, "token": 30.0, "closed-book": 2.0}), 60.0)
    assert fits == pytest.approx({"sequence": 40.0, "token": 30.0, "closed-book": 20.0})
    over = time_shares(SimpleNamespace(per_mode={"sequence": 100.0, "token": 30.0, "closed-book": 2.0}), 60.0)
    assert over == pytest.approx({"sequence": 60.0, "token": 20.0, "closed-book": 20.0})
    assert sum(over.values()) == pytest.approx(5 / 3 * 60.0)
    # under the limit in all: shares in proportion to the estimates, as before, each above its estimate
    small = time_shares(SimpleNamespace(per_mode={"sequence": 6.0, "token": 3.0, "closed-book": 1.0}), 60.0)
    assert small == pytest.approx({"sequence": 36.0, "token": 20.0, "closed-book": 20.0})


@pytest.mark.parametrize("mode", MODES)
def test_cancelled_request_stops_where_the_client_left(pipe, mode):
    """The cancel check runs between steps: a client gone at the third check gets 3 tokens."""
    calls = []

    def gone():
        calls.append(1)
        return len(calls) >= 3

    with no_eos(pipe):
        a = pipe.answer("who painted the starry night", mode, RagSettings(preset="aided", k=3, max_new_tokens=40),
                        Run(cancelled=gone))
    assert a.stopped == "cancelled" and len(calls) == 3
    assert 2 <= len(a.token_ids) <= 3  # 3 generated tokens; a BART <s> among them is not shown


def test_gated_answers_equal_ungated(pipe):
    s = RagSettings(preset="aided", k=3, max_new_tokens=6)
    a = pipe.answers("what is the capital of france", MODES, s)
    gate = StepScheduler()
    b = pipe.answers("what is the capital of france", MODES, s, Run(share=lambda gen: gate.gated(gen, 1)))
    assert {m: x.token_ids for m, x in a.items()} == {m: x.token_ids for m, x in b.items()}


# ---------------------------------------------------------------- memory-bounded teacher forcing


def test_scoring_in_chunks_equals_scoring_at_once(pipe):
    """score_candidates with 1 row at a time and 1 position's logits at a time gives the same
    log-probs as the default chunks (float32 CPU kernels, rows batched differently: 1e-5)."""
    gen = pipe.stack.modes["sequence"].generator
    prompts = [gen.prompt("who painted it", p, 64) for p in pipe.index.corpus.passages[:3]]
    cands = [gen.tokenizer("vincent van gogh")["input_ids"], gen.tokenizer("paris")["input_ids"]]
    first_lp, state = gen.prefill(prompts)
    whole, mask = score_candidates(gen, state, first_lp, cands, gen.pad_token_id)  # (K, C, T)
    one, _ = score_candidates(gen, state, first_lp, cands, gen.pad_token_id, max_rows=1)
    real = mask.bool().expand(3, -1, -1)  # (K, C, T) pad positions mean nothing
    torch.testing.assert_close(one[real], whole[real], rtol=1e-5, atol=1e-5)
    for c, cand in enumerate(cands):  # each candidate teacher-forced alone, unpadded
        t = torch.tensor([cand] * 3)
        alone = gen.advance_gather(gen.select(state, torch.arange(3)), t[:, :-1], t[:, 1:])  # (K, T_c - 1)
        torch.testing.assert_close(whole[:, c, 1: len(cand)], alone, rtol=1e-5, atol=1e-5)
    # advance_gather with one position of logits at a time == gathering from the full log-softmax
    st1, st2 = gen.select(state, torch.arange(3)), gen.select(state, torch.arange(3))
    tok = torch.tensor([[5, 9, 11]] * 3)
    full = gen.advance(st1, tok).gather(2, tok.unsqueeze(-1)).squeeze(-1)  # (3, 3)
    torch.testing.assert_close(gen.advance_gather(st2, tok, tok, max_logits=1), full, rtol=1e-5, atol=1e-5)
    assert torch.isfinite(whole[:, 0, : len(cands[0])]).all() and mask.shape == (2, len(cands[0]))
    # score_pairs: candidate i under row rows[i] only, in one batch = that cell of score_candidates
    pairs, pair_mask = score_pairs(gen, state, first_lp, [2, 0, 2], [cands[0], cands[1], cands[1]], gen.pad_token_id)
    for i, (z, c) in enumerate([(2, 0), (0, 1), (2, 1)]):
        n = len(cands[c])
        assert pair_mask[i].sum() == n
        torch.testing.assert_close(pairs[i, :n], whole[z, c, :n], rtol=1e-5, atol=1e-5)


def test_scoring_stops_between_chunks():
    """A stop between chunks leaves the unscored rows at -inf (the engine then falls back)."""
    class Gen:  # a lookup generator: every token has log-prob log(1/4)
        def select(self, state, rows):
            return rows

        def advance_gather(self, st, tokens, targets):
            return torch.full(tokens.shape, -1.3862943611198906)

    first_lp = torch.full((2, 4), -1.3862943611198906)  # (K, V)
    calls = iter([False, True])
    lp, _ = score_candidates(Gen(), None, first_lp, [[1, 2, 3]], pad=0, max_rows=1, stop=lambda: next(calls))
    assert torch.isfinite(lp[0, 0]).all() and torch.isinf(lp[1, 0, 1:]).all()


def test_scoring_pays_only_for_each_chunks_longest_candidate():
    """Candidates of 1 and 5 tokens under 2 docs, 2 rows a chunk: rows run shortest first, so
    the 1-token candidate's chunk needs no pass and only the other chunk runs, 4 positions
    wide; every real position gets its own row's value (here minus the target token id)."""
    widths = []

    class Gen:
        def select(self, state, rows):
            return rows

        def advance_gather(self, st, tokens, targets):
            widths.append(tuple(tokens.shape))
            return -targets.float()

    first_lp = -torch.arange(2 * 10, dtype=torch.float).view(2, 10) / 10  # (K, V)
    cands = [[3, 4, 5, 6, 7], [2]]
    lp, mask = score_candidates(Gen(), None, first_lp, cands, pad=0, max_rows=2)  # (K, C, T)
    assert widths == [(2, 4)]
    for k in range(2):
        assert lp[k, 0].tolist() == [first_lp[k, 3].item(), -4.0, -5.0, -6.0, -7.0]
        assert lp[k, 1, 0].item() == first_lp[k, 2].item() and mask[1].tolist() == [1, 0, 0, 0, 0]
    # room for every row in one chunk: still cut where a candidate is more than twice as wide
    widths.clear()
    cands = [[1, 2], [3, 4, 5], [6, 7], [1, 2, 3, 4, 5, 6, 7, 8, 9]]
    lp, _ = score_candidates(Gen(), None, first_lp, cands, pad=0)  # (K, C, T)
    assert widths == [(6, 2), (2, 8)]  # 2-, 3- and 2-token candidates under both docs, then the 9
    for k in range(2):
        for c, cand in enumerate(cands):
            assert lp[k, c, 1: len(cand)].tolist() == [-float(t) for t in cand[1:]]


def test_greedy_drops_finished_rows_and_keeps_their_answers():
    """Two groups (docs) decoded greedily over a 3-token vocabulary {A=0, B=1, EOS=2}: group 0
    says EOS at once, group 1 says A, A, EOS. After step 1 only group 1's row is advanced, and
    both answers come out whole: [EOS] and [A, A, EOS]."""
    from rag_demo.rag.decoding import Rows, greedy

    L = torch.log(torch.tensor([0.1, 0.1, 0.8])), torch.log(torch.tensor([0.7, 0.2, 0.1]))  # EOS-ish, A-ish
    script = {0: [L[0]], 1: [L[1], L[1], L[0]]}  # group -> its next-token log-probs at steps 0, 1, 2

    class Gen:
        rows_seen: list[int] = []

        def advance(self, state, tokens):
            state["t"] += 1
            self.rows_seen.append(tokens.shape[0])
            return torch.stack([script[g][state["t"]] for g in state["groups"]]).unsqueeze(1)  # (R, 1, V)

        def select(self, state, rows):
            return {"groups": [state["groups"][int(r)] for r in rows], "t": state["t"]}

    gen = Gen()
    state = {"groups": [0, 1], "t": 0}
    first = torch.stack([script[0][0], script[1][0]])  # (G, V)
    hyps = greedy(Rows(gen, state, per_beam=1, prior=None), first, groups=2, max_new_tokens=5, eos=[2])
    assert [h.tokens for h in hyps] == [[2], [0, 0, 2]]
    assert gen.rows_seen == [1, 1]  # steps 2 and 3 ran group 1's row alone
    assert hyps[1].logprob == pytest.approx(float(2 * L[1][0] + L[0][2]))


def test_kv_cache_grows_in_place_and_matches_concatenation(pipe):
    """Decoding steps write into the GrowingLayer's spare room (no new buffer per step, unlike
    transformers' concatenating DynamicLayer) and the model reads the same keys as with a
    DynamicCache: identical next-token log-probs (same kernels on the same values: 1e-6)."""
    from transformers.cache_utils import DynamicCache

    from rag_demo.models.kv_cache import GrowingLayer

    gen = pipe.stack.modes["token"].generator
    prompts = [gen.prompt("who painted it", p, 64) for p in pipe.index.corpus.passages[:2]]
    _, state = gen.prefill(prompts)
    layer = state.cache.self_attention_cache.layers[0]
    assert isinstance(layer, GrowingLayer)
    buffer = layer._k.data_ptr()
    plain = gen.select(state, torch.arange(2))
    plain.cache.self_attention_cache = DynamicCache(
        [(lay.keys.clone(), lay.values.clone()) for lay in state.cache.self_attention_cache.layers])
    for tok in (5, 9, 11):
        a = gen.advance(state, torch.tensor([[tok], [tok]]))
        b = gen.advance(plain, torch.tensor([[tok], [tok]]))
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    layer = state.cache.self_attention_cache.layers[0]
    assert layer._k.data_ptr() == buffer and layer.keys.shape[-2] == plain.cache.self_attention_cache.layers[0].keys.shape[-2]
    picked = gen.select(state, torch.tensor([1]))  # selecting rows keeps the growing kind
    assert isinstance(picked.cache.self_attention_cache.layers[0], GrowingLayer)
