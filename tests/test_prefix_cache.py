"""The decoder-only generator keeps recent prompt openings' KV caches (`OpeningKV`, opening_kv.py): a question
whose prompts open like an earlier one's (system prompt, worked examples) runs only the rest.
Exact up to float order, and it must really skip the work."""
from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach the Hub

from rag_demo.rag import engine
from rag_demo.reader.examples import WORKED_EXAMPLES  # noqa: E402
from rag_demo.config import RagSettings  # noqa: E402
from rag_demo.knowledge.corpus import Passage  # noqa: E402
from rag_demo.models.kv_cache import shared_prefix  # noqa: E402

DOCS = [Passage(id="p1", title="Veltrania", text="Veltrania is an imaginary island. Its capital is Port Amsel."),
        Passage(id="p2", title="Orlan Vesk", text="Orlan Vesk was an invented painter, born in 1802 in Tarrow."),
        Passage(id="p3", title="Kessaly", text="Kessaly is an invented country whose language is Kessalic.")]
QUESTIONS = ["What is the capital of Veltrania?", "When was Orlan Vesk born?", "What language is spoken in Kessaly?"]


def _gen(folder, kept: int):
    from rag_demo.models.random_models import tiny_smollm_generator

    gen = tiny_smollm_generator(folder, layers=2, kv_heads=2, seed=3)
    gen.openings.KEPT = kept  # an instance attribute: the class default stays
    return gen


def _same(a: torch.Tensor, b: torch.Tensor) -> None:
    """Equal log-probs up to float order. The tiny model's logits spread by ~0.08 around ~-10.9,
    so a relative tolerance would hide real errors (a wrong position id moves them by ~7e-5):
    absolute, on log-probs centred per row; float order alone moved them by <= 1e-6 measured."""
    torch.testing.assert_close(a - a.mean(-1, keepdim=True), b - b.mean(-1, keepdim=True), rtol=0, atol=1e-5)


def _prompts(gen, q, examples=2):
    return [gen.prompt(q, d, 192, "short", examples=WORKED_EXAMPLES[:examples]) for d in DOCS]


def test_kept_prefixes_change_no_number_and_skip_the_shared_opening(smollm_tokenizer_folder):
    """Three questions in turn, each in both RAG modes and closed-book: with kept prefixes and
    without (same weights), the same first-step log-probs, question log-probs and answers. From
    the second question on, only the part after the shared opening runs (the opening is
    hundreds of tokens with worked examples; a question's own prefix part a few)."""
    keep, fresh = _gen(smollm_tokenizer_folder, 4), _gen(smollm_tokenizer_folder, 0)
    s = RagSettings(preset="paper", max_new_tokens=4, answer_style="short").decoding
    scores = torch.tensor([3.0, 2.0, 1.0])
    for i, q in enumerate(QUESTIONS):
        prompts = _prompts(keep, q)
        before = keep.prefix_tokens_run
        for keep_prompt_logprobs in (0, 3):
            a_lp, a = keep.prefill(prompts, keep_prompt_logprobs=keep_prompt_logprobs)  # (K, V)
            b_lp, b = fresh.prefill(prompts, keep_prompt_logprobs=keep_prompt_logprobs)
            _same(a_lp, b_lp)
            if keep_prompt_logprobs:
                _same(a.prompt_lp, b.prompt_lp)
        ran, P = keep.prefix_tokens_run - before, shared_prefix(prompts, keep=4)
        assert P > 150  # system prompt + 2 worked examples + this question's passage header
        if i == 0:
            assert ran == P  # nothing kept yet: the whole shared prefix ran, once for both calls
        else:
            # the K prompts part at the passage, before the question: the same opening every time
            assert ran == 0, (ran, P)
        for mode in (engine.rag_token, engine.rag_sequence):
            assert mode(keep, prompts, scores, s).tokens == mode(fresh, prompts, scores, s).tokens
        cb = keep.prompt(q, None, 192, "short", examples=WORKED_EXAMPLES[:2])
        before = keep.prefix_tokens_run
        _same(keep.prefill([cb])[0], fresh.prefill([cb])[0])
        # one row: its prefix is the opening every question shares (Prompt.opening), kept after the first;
        # the question's turn runs as the row's own positions
        ran = keep.prefix_tokens_run - before
        assert 50 < cb.opening < len(cb) - 5 and ran == (cb.opening if i == 0 else 0), (ran, cb.opening, len(cb))
        assert engine.closed_book(keep, cb, s).tokens == engine.closed_book(fresh, cb, s).tokens
    assert fresh.prefix_tokens_run > 0 and not fresh.openings.kept  # kept=0 keeps nothing, recomputes every time


def test_kept_prefixes_are_bounded_and_never_handed_out(smollm_tokenizer_folder):
    """At most OpeningKV.KEPT entries, the latest last; and the caller's copy is its own:
    decoding from one prefill's state leaves the kept cache as it was."""
    gen = _gen(smollm_tokenizer_folder, 2)
    for examples in (0, 1, 2):  # three different openings
        gen.prefill(_prompts(gen, QUESTIONS[0], examples))
    assert len(gen.openings.kept) == 2
    key, kv = gen.openings.kept[-1]
    assert list(key) == list(_prompts(gen, QUESTIONS[0], 2)[0][:len(key)])
    sizes = [layer.keys.shape for layer in kv.layers]
    _, state = gen.prefill(_prompts(gen, QUESTIONS[1], 2))
    gen.advance(state, torch.tensor([[5], [6], [7]]))
    assert [layer.keys.shape for layer in gen.openings.kept[-1][1].layers] == sizes or gen.openings.kept[-1][0] != key
    assert all(layer.keys.shape[0] == 1 for _, kv in gen.openings.kept for layer in kv.layers)  # one row each


@pytest.mark.parametrize("kept", [0, 4])
def test_a_short_single_prompt_still_runs(smollm_tokenizer_folder, kept):
    gen = _gen(smollm_tokenizer_folder, kept)
    ids = gen.tokenizer("Hi", add_special_tokens=False)["input_ids"]
    lp, _ = gen.prefill([ids])  # shorter than MIN_SHARED_PREFIX: no prefix split
    assert lp.shape[0] == 1 and torch.isfinite(lp).all()


def test_selected_rows_are_an_independent_copy_with_room_to_grow():
    """GrowingLayer.selected copies the chosen rows of its buffer once: the copy reads the same
    keys and values, grows without touching the source, and a layer transformers edited in place
    (no spare buffer) is still copied right."""
    from rag_demo.models.kv_cache import GrowingLayer

    torch.manual_seed(0)
    src = GrowingLayer()
    k, v = torch.randn(3, 2, 5, 4), torch.randn(3, 2, 5, 4)  # (R, heads, L, d)
    src.update(k, v)
    rows = torch.tensor([2, 0, 2])
    out = src.selected(rows)
    torch.testing.assert_close(out.keys, k[rows], rtol=0, atol=0)
    torch.testing.assert_close(out.values, v[rows], rtol=0, atol=0)
    assert out._k.shape[-2] > 5  # spare room came along: the next token is written, not reallocated
    buffer = out._k
    nk, nv = torch.randn(3, 2, 1, 4), torch.randn(3, 2, 1, 4)
    out.update(nk, nv)
    assert out._k is buffer and out.keys.shape[-2] == 6
    torch.testing.assert_close(out.keys[..., 5:, :], nk, rtol=0, atol=0)
    torch.testing.assert_close(src.keys, k, rtol=0, atol=0)  # the source is unchanged
    assert src.keys.shape[-2] == 5
    out.keys.zero_()  # nor do the two share memory
    torch.testing.assert_close(src.keys, k, rtol=0, atol=0)

    src.batch_select_indices(torch.tensor([1, 0]))  # transformers' in-place edit: the buffer is forgotten
    again = src.selected(torch.tensor([1]))
    torch.testing.assert_close(again.keys, k[[0]], rtol=0, atol=0)
    again.update(nk[:1], nv[:1])
    torch.testing.assert_close(again.keys[..., 5:, :], nk[:1], rtol=0, atol=0)


@pytest.mark.parametrize("rows", [[0, 1, 2], [1, 0, 2], [0, 0, 2], [2, 2, 1], [2, 0], [1]])
def test_rows_kept_in_place_are_the_rows_a_copy_holds(rows):
    """GrowingLayer.reselect (a search's own cache reordered in place) holds what `selected` would:
    kept, swapped, repeated and dropped rows; it allocates nothing, and grows on as before."""
    from rag_demo.models.kv_cache import GrowingLayer

    torch.manual_seed(0)
    k, v = torch.randn(3, 2, 5, 4), torch.randn(3, 2, 5, 4)  # (R, heads, L, d)
    layer, ref = GrowingLayer(), GrowingLayer()
    layer.update(k, v)
    ref.update(k, v)
    idx = torch.tensor(rows)
    want = ref.selected(idx)
    buffer = layer._k.untyped_storage().data_ptr()
    assert layer.can_reselect(len(rows)) and not layer.can_reselect(4)  # more rows than held: a copy instead
    layer.reselect(idx)
    torch.testing.assert_close(layer.keys, want.keys, rtol=0, atol=0)
    torch.testing.assert_close(layer.values, want.values, rtol=0, atol=0)
    assert layer._k.untyped_storage().data_ptr() == buffer  # in place: the same buffer
    nk, nv = torch.randn(len(rows), 2, 1, 4), torch.randn(len(rows), 2, 1, 4)
    layer.update(nk, nv)
    want.update(nk, nv)
    torch.testing.assert_close(layer.keys, want.keys, rtol=0, atol=0)


@pytest.mark.parametrize("grow", [64, 1])  # 1: every step outgrows its buffer (made by the model's call, inference mode)
def test_a_search_reordered_in_place_answers_as_with_copies(smollm_tokenizer_folder, monkeypatch, grow):
    """Beam searches reorder their own rows in place after their first copy: RAG-Token,
    RAG-Sequence and closed-book give the same answers and log-probs as when every reorder copies
    (`select`), also when the buffers reordered were made inside torch's inference mode and the
    search runs outside it (the app's visitors do)."""
    from rag_demo.models.decoder_only import DecoderOnlyGenerator
    from rag_demo.models.kv_cache import GrowingLayer

    monkeypatch.setattr(GrowingLayer, "GROW", grow)
    gen = _gen(smollm_tokenizer_folder, 4)
    s = RagSettings(preset="paper", max_new_tokens=6, num_beams=3, answer_style="short").decoding
    scores = torch.tensor([3.0, 2.0, 1.0])
    in_place = []
    reorder = DecoderOnlyGenerator.reorder
    monkeypatch.setattr(DecoderOnlyGenerator, "reorder",
                        lambda self, st, rows: in_place.append(1) or reorder(self, st, rows))
    got = []
    for q in QUESTIONS:
        prompts = _prompts(gen, q)
        cb = gen.prompt(q, None, 192, "short", examples=WORKED_EXAMPLES[:2])
        got.append([engine.rag_token(gen, prompts, scores, s), engine.rag_sequence(gen, prompts, scores, s),
                    engine.closed_book(gen, cb, s)])
    assert in_place  # the searches did reorder in place
    monkeypatch.setattr(DecoderOnlyGenerator, "reorder", DecoderOnlyGenerator.select)  # every reorder a copy
    for q, answers in zip(QUESTIONS, got):
        prompts = _prompts(gen, q)
        cb = gen.prompt(q, None, 192, "short", examples=WORKED_EXAMPLES[:2])
        for a, b in zip(answers, [engine.rag_token(gen, prompts, scores, s), engine.rag_sequence(gen, prompts, scores, s),
                                  engine.closed_book(gen, cb, s)]):
            assert a.tokens == b.tokens
            assert a.logprob == pytest.approx(b.logprob, abs=1e-5)


@pytest.mark.parametrize("per_beam", [1, 3])  # RAG-Sequence's K groups; RAG-Token's one group of K rows
def test_a_beam_search_leaves_the_state_it_was_given_as_it_was(smollm_tokenizer_folder, per_beam):
    """The engine hands a beam search the prefill state itself (it scores the winner from that state
    afterwards): the search's first reorder copies the rows, and every later step and reorder
    writes only the copy."""
    from rag_demo.rag.decoding import Rows, search

    gen = _gen(smollm_tokenizer_folder, 4)
    gen.hidden_cache.resize(0)  # the state holds its cache: no lazy prefill
    d = RagSettings(preset="paper", max_new_tokens=6, num_beams=3, answer_style="short").decoding
    lp, state = gen.prefill(_prompts(gen, QUESTIONS[0]))  # (K, V)
    keys = [layer.keys.clone() for layer in state.cache.layers]
    mask, n = state.mask.clone(), state.cache.layers[0]._n
    groups = 3 // per_beam
    rows = Rows(gen, state, per_beam=per_beam, prior=None if per_beam == 1 else torch.zeros(3).log_softmax(0))
    hyps = search(rows, lp, groups, d, gen.stop_token_ids("short"))
    assert hyps and rows.state is not state
    assert state.cache.layers[0]._n == n and torch.equal(state.mask, mask)
    for layer, before in zip(state.cache.layers, keys):
        torch.testing.assert_close(layer.keys, before, rtol=0, atol=0)


@pytest.mark.parametrize("eager_max", [0, 2, 10_000])  # every call through SDPA / steps eager, runs SDPA / all eager
@pytest.mark.parametrize("kv_heads", [1, 2])  # 1: two query heads read one kv head (grouped-query, as SmolLM2)
def test_shared_prefix_attention_reads_what_the_plain_model_reads(smollm_tokenizer_folder, kv_heads, eager_max,
                                                                   monkeypatch):
    """The K prompts' shared opening is held once (SharedPrefixLayer) and attended to by
    `shared_prefix_attention`: the next-token log-probs after the prefill, after a beam reorder,
    after single steps and along a teacher-forced run all equal the plain model's (transformers'
    SDPA, no cache) on each row's whole sequence, whichever of its two ways runs each call
    (EAGER_MAX_QUERIES); and selecting rows copies none of the prefix."""
    from rag_demo.models import kv_cache
    from rag_demo.models.kv_cache import SharedPrefixLayer
    from rag_demo.models.random_models import tiny_smollm_generator

    monkeypatch.setattr(kv_cache, "EAGER_MAX_QUERIES", eager_max)

    gen = tiny_smollm_generator(smollm_tokenizer_folder, layers=2, kv_heads=kv_heads, seed=5)
    prompts = _prompts(gen, QUESTIONS[0])  # three lengths after the opening: rows are left-padded there

    def plain(ids: list[int]) -> torch.Tensor:  # (1, V) the model alone on the whole sequence
        with torch.no_grad():
            return torch.log_softmax(gen.model(input_ids=torch.tensor([ids])).logits[:, -1].float(), dim=-1)

    lp, state = gen.prefill(prompts)  # (3, V)
    layers = state.cache.layers
    assert all(isinstance(layer, SharedPrefixLayer) for layer in layers)
    P = layers[0].prefix_k.shape[-2]
    assert P > 150 and layers[0].keys.shape[-2] == max(len(p) for p in prompts) - P  # rows hold their own part only
    for r, p in enumerate(prompts):
        _same(lp[r: r + 1], plain(p))
    rows = torch.tensor([2, 0, 2])  # a beam reorder: a row twice, one dropped
    st = gen.select(state, rows)
    assert all(a.prefix_k is b.prefix_k for a, b in zip(st.cache.layers, layers))  # shared, not copied
    seqs = [list(prompts[int(i)]) for i in rows]
    for toks in ([11, 12, 13], [21, 22, 23]):
        step = gen.advance(st, torch.tensor(toks).unsqueeze(1))[:, -1]  # (3, V)
        for r, t in enumerate(toks):
            seqs[r].append(t)
            _same(step[r: r + 1], plain(seqs[r]))
    run = gen.advance(st, torch.tensor([[31, 32, 33]] * 3))  # (3, 3, V) teacher-forced: a causal mask inside
    for r in range(3):
        for j in range(3):
            _same(run[r, j: j + 1], plain(seqs[r] + [31, 32, 33][: j + 1]))
