"""The decoder-only generator keeps each passage's keys and values after the prompt's opening
(`PassageKVCache`) and reuses them for every later prompt that reads that passage there: a
question asked again (another retrieval temperature, a passage taken away, the other RAG mode)
runs only its question part. The answers and every log-probability must stay what they are
without the cache (float order only), the work must really be skipped, the cache must stay
within its bound, and two requests at once must not disturb each other."""
from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach the Hub

from rag_demo.config import RagSettings  # noqa: E402
from rag_demo.knowledge.corpus import Passage  # noqa: E402
from rag_demo.models.cost import CostModel, ModelDims  # noqa: E402
from rag_demo.models.passage_kv import PassageKVCache  # noqa: E402
from rag_demo.rag import engine  # noqa: E402
from rag_demo.rag.hooks import PAPER  # noqa: E402
from rag_demo.reader.aided import prompt  # noqa: E402
from tests.aids import aided, in_two_threads  # noqa: E402

# different lengths (rows are padded), one ending in a space (its last token merges with the newline after it)
DOCS = [Passage(id="p1", title="Veltrania", text="Veltrania is an imaginary island. Its capital is Port Amsel."),
        Passage(id="p2", title="Orlan Vesk", text="Orlan Vesk was an invented painter, born in 1802 in Tarrow, a town "
                "of weavers, bakers and glassblowers on the river Tarr."),
        Passage(id="p3", title="Kessaly", text="Kessaly is an invented country whose language is Kessalic. "),
        Passage(id="p4", title="Mount Dravel", text="Mount Dravel is 4,810 metres high.")]
QUESTIONS = ["What is the capital of Veltrania?", "When was Orlan Vesk born?"]
SCORES = torch.tensor([3.0, 2.5, 1.0, 0.5])  # retrieval logits, one per passage

# Float order is all that may differ. Measured on the tiny model: 0 in float32 and bfloat16 (the
# question part runs through SDPA as a whole prefill does). float32: 1e-5, below what one wrong
# position id does to the tiny model's log-probs (~7e-5). bfloat16: one rounding step of the tiny
# model's logits is ~2.4e-4, and other CPUs' kernels may round a row differently with the batch's
# shape, so a few steps. (SmolLM2-135M, docs/results.md: float32 <= 3.3e-5 on centred log-probs
# when some passages are kept and some run, the cache-free prefill's own spread when its rows come
# in another order; bfloat16 0.)
ATOL = {torch.float32: 1e-5, torch.bfloat16: 2e-3}


def _gen(folder, dtype=torch.float32, kept: bool = True, max_bytes: int | None = None):
    from rag_demo.models.random_models import tiny_smollm_generator

    gen = tiny_smollm_generator(folder, layers=2, kv_heads=1, seed=4)  # same seed: the same weights
    gen.model.to(dtype)
    gen.hidden_cache.resize(0)  # the passages alone: kept hidden states would skip their prefill (test_kept_states.py)
    if not kept:
        gen.passage_cache.resize(0)  # keeps nothing: every prefill runs as before the cache
    elif max_bytes is not None:
        gen.passage_cache.resize(max_bytes)
    return gen


def _close(a: torch.Tensor | None, b: torch.Tensor | None, atol: float) -> None:
    """Equal up to float order; log-prob rows over the vocabulary are compared centred (a relative
    tolerance would hide a wrong position id on the tiny model's flat logits)."""
    assert (a is None) == (b is None)
    if a is None:
        return
    if a.dim() == 2 and a.shape[-1] > 1000:
        a, b = a - a.mean(-1, keepdim=True), b - b.mean(-1, keepdim=True)
    torch.testing.assert_close(a.float(), b.float(), rtol=0, atol=atol)


def _same_generation(a: engine.Generation, b: engine.Generation, atol: float) -> None:
    assert a.tokens == b.tokens
    assert a.logprob == pytest.approx(b.logprob, abs=atol)
    for x, y in ((a.doc_lp, b.doc_lp), (a.prior, b.prior), (a.extras.get("question_lp"), b.extras.get("question_lp")),
                 (a.posteriors, b.posteriors), (a.doc_posterior, b.doc_posterior)):
        _close(x, y, atol)
    assert [t for t, _ in a.candidates] == [t for t, _ in b.candidates]
    for (_, x), (_, y) in zip(a.candidates, b.candidates):
        assert x == pytest.approx(y, abs=atol)


def _prompts(gen, q, s: RagSettings, docs=DOCS):
    return [prompt(gen, q, d, s.decoding, s.aids) for d in docs]


def _passage_tokens(prompts) -> int:
    return sum(p.passage[1] - p.passage[0] for p in prompts)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("preset", ["paper", "aided"])
@pytest.mark.parametrize("mode", ["token", "sequence"])
def test_same_answers_and_scores_with_the_cache_on_and_off(smollm_tokenizer_folder, mode, preset, dtype):
    """Both RAG modes, the paper's reader and the aided one (its generator's vote reads the
    question's log-probs from the prefill), float32 and bfloat16, padded rows: the first ask
    (passages run and kept), a re-ask with another retrieval temperature (all kept), one passage
    taken away, the other mode, another question over the same passages: the same tokens and
    scores as the generator without a cache."""
    on, off = _gen(smollm_tokenizer_folder, dtype), _gen(smollm_tokenizer_folder, dtype, kept=False)
    s = RagSettings(preset=preset, max_new_tokens=4, answer_style="short", num_beams=2 if preset == "aided" else 1)
    run = engine.rag_token if mode == "token" else engine.rag_sequence
    other = engine.rag_sequence if mode == "token" else engine.rag_token
    asks = [(QUESTIONS[0], DOCS, s, run), (QUESTIONS[0], DOCS, s.merged(prior_temperature=3.0), run),
            (QUESTIONS[0], DOCS[1:], s, run), (QUESTIONS[0], DOCS, s, other), (QUESTIONS[1], DOCS[::-1], s, run)]
    for q, docs, st, fn in asks:
        scores = SCORES[: len(docs)]
        got = []
        for gen in (on, off):
            prompts = _prompts(gen, q, st, docs)
            reader = aided(gen, st, prompts, q, docs) if preset == "aided" else PAPER
            got.append(fn(gen, prompts, scores, st.decoding, reader))
        _same_generation(*got, ATOL[dtype])
    assert on.passage_cache.stats().hits >= 3 * len(DOCS)  # the re-asks read kept passages
    assert off.passage_cache.stats().entries == 0


@pytest.mark.parametrize("keep_prompt_logprobs", [0, 5])
def test_prefill_is_the_plain_models_on_each_whole_prompt(smollm_tokenizer_folder, keep_prompt_logprobs):
    """Against the model itself (no cache, no shared opening): each row's next-token log-probs
    and its question tokens' log-probs after a first prefill and after a cached one, and a
    decoding step after each."""
    gen = _gen(smollm_tokenizer_folder)
    s = RagSettings(preset="aided", answer_style="short")
    prompts = _prompts(gen, QUESTIONS[0], s)

    def plain(ids: list[int]) -> torch.Tensor:  # (len, V) the model alone on the whole sequence
        with torch.no_grad():
            return torch.log_softmax(gen.model(input_ids=torch.tensor([ids])).logits[0].float(), dim=-1)

    for _ in range(2):  # passages run and kept, then read from the cache
        lp, state = gen.prefill(prompts, keep_prompt_logprobs=keep_prompt_logprobs)  # (K, V)
        step = gen.advance(state, torch.tensor([[11]] * len(prompts)))[:, -1]  # (K, V)
        for r, p in enumerate(prompts):
            whole = plain(list(p) + [11])  # (len+1, V)
            _close(lp[r: r + 1], whole[-2:-1], ATOL[torch.float32])
            _close(step[r: r + 1], whole[-1:], ATOL[torch.float32])
            if keep_prompt_logprobs:
                want = whole[-keep_prompt_logprobs - 2: -2].gather(1, torch.tensor(p[-keep_prompt_logprobs:]).unsqueeze(1)).squeeze(1)
                _close(state.prompt_lp[r], want, ATOL[torch.float32])
    assert gen.passage_cache.stats().hits == len(prompts)


def test_a_first_prefill_runs_no_padding(smollm_tokenizer_folder):
    """Prompts of different lengths with nothing kept run packed: the linear layers see each prompt's
    own tokens after the opening once, not every row padded to the longest (a fifth to a third of a
    RAG prefill's work on real passages); what they give is checked against the model itself above."""
    from rag_demo.models.batched_step import padded_tokens

    gen = _gen(smollm_tokenizer_folder)
    s = RagSettings(preset="aided", answer_style="short")
    prompts = _prompts(gen, QUESTIONS[1], s)
    gen.prefill(prompts)  # the opening computed and kept (OpeningKV), the passages kept
    gen.passage_cache.clear()  # nothing kept but the opening: the next prefill runs every passage
    opening = gen.passages.split(prompts, 0)[0]
    own = [len(p) - opening for p in prompts]
    assert len(set(own)) > 1  # rows of different lengths: padding would run
    rows = []
    hook = gen.model.model.layers[0].mlp.down_proj.register_forward_pre_hook(
        lambda _, args: rows.append(args[0].shape[:-1].numel()))
    try:
        gen.prefill(prompts)
    finally:
        hook.remove()
    assert rows == [padded_tokens(sum(own))] and sum(rows) < len(prompts) * max(own)


def test_a_reask_runs_only_the_question_part(smollm_tokenizer_folder):
    """The first ask runs every passage once (both modes share it); asking again with another
    temperature, without a passage, or in the other mode runs no passage token and no opening
    token, and each kept passage counts as a hit; the cost model is told how many tokens are kept."""
    gen = _gen(smollm_tokenizer_folder)
    s = RagSettings(preset="paper", max_new_tokens=3, answer_style="short")
    prompts = _prompts(gen, QUESTIONS[0], s)
    assert gen.cached_tokens(prompts) == 0
    engine.rag_token(gen, prompts, SCORES, s.decoding)
    first = gen.passage_tokens_run
    assert first == _passage_tokens(prompts) and gen.passage_cache.stats().misses == len(DOCS)
    assert gen.cached_tokens(prompts) == _passage_tokens(prompts)
    opening_run = gen.prefix_tokens_run
    for docs, fn, temp in ((DOCS, engine.rag_token, 2.0), (DOCS[:2] + DOCS[3:], engine.rag_token, 1.0),
                           (DOCS, engine.rag_sequence, 1.0)):
        hits = gen.passage_cache.stats().hits
        fn(gen, _prompts(gen, QUESTIONS[0], s, docs), SCORES[: len(docs)], s.merged(prior_temperature=temp).decoding)
        assert gen.passage_cache.stats().hits - hits == len(docs)
    assert gen.passage_tokens_run == first and gen.prefix_tokens_run == opening_run
    assert gen.passage_cache.stats().misses == len(DOCS)
    # another question over the same passages: the same passage tokens, so they are kept too
    engine.rag_token(gen, _prompts(gen, QUESTIONS[1], s), SCORES, s.decoding)
    assert gen.passage_tokens_run == first


def test_a_passages_tokens_are_the_same_in_every_prompt_that_reads_it(smollm_tokenizer_folder):
    """`Prompt.passage` marks the passage's "title: text" (whole tokens), the same ids whatever the
    question, the other passages or the position of the question; a trailing space, whose token
    merges with the newline after it, is left out."""
    gen = _gen(smollm_tokenizer_folder)
    s = RagSettings(preset="aided", answer_style="short")
    seen: dict[str, set] = {}
    for q in QUESTIONS:
        for st in (s, s.merged(question_position="both"), s.merged(answer_style="sentence")):
            for p, d in zip(_prompts(gen, q, st), DOCS):
                a, b = p.passage
                assert gen.tokenizer.decode(p[a:b]) == f"{d.title}: {d.text}".rstrip()
                if st.aids.question_position == "after":
                    seen.setdefault(d.id, set()).add(tuple(p[a:b]))
    assert all(len(v) == 1 for v in seen.values())
    assert gen.prompt(QUESTIONS[0], None, 192, "short").passage is None  # closed-book: no passage


def test_eviction_keeps_the_bound_and_the_answers(smollm_tokenizer_folder):
    """A bound that holds about two passages: bytes never exceed it, the least recently used go
    first, and answers after eviction (some passages kept, some run again) are unchanged."""
    probe = _gen(smollm_tokenizer_folder)
    s = RagSettings(preset="paper", max_new_tokens=3, answer_style="short")
    probe.prefill(_prompts(probe, QUESTIONS[0], s))
    per_passage = probe.passage_cache.stats().bytes // len(DOCS)
    bound = int(2.5 * per_passage)
    on, off = _gen(smollm_tokenizer_folder, max_bytes=bound), _gen(smollm_tokenizer_folder, kept=False)
    for q, docs in ((QUESTIONS[0], DOCS), (QUESTIONS[0], DOCS[2:]), (QUESTIONS[1], DOCS[::-1]), (QUESTIONS[0], DOCS)):
        a = engine.rag_token(on, _prompts(on, q, s, docs), SCORES[: len(docs)], s.decoding)
        b = engine.rag_token(off, _prompts(off, q, s, docs), SCORES[: len(docs)], s.decoding)
        _same_generation(a, b, ATOL[torch.float32])
        st = on.passage_cache.stats()
        assert st.bytes <= bound and st.entries <= 2
    st = on.passage_cache.stats()
    assert st.evictions > 0 and st.hits > 0  # DOCS[2:] right after DOCS: its last two were the most recent


def test_an_edited_passage_gets_its_own_entry(smollm_tokenizer_folder):
    """Editing a passage's text (the page's "edit, then ask again", an upload) makes other tokens,
    so a new entry: the edited prompt's answer is the cache-free one, the others stay kept."""
    on, off = _gen(smollm_tokenizer_folder), _gen(smollm_tokenizer_folder, kept=False)
    s = RagSettings(preset="paper", max_new_tokens=3, answer_style="short")
    engine.rag_token(on, _prompts(on, QUESTIONS[0], s), SCORES, s.decoding)
    edited = [DOCS[0], Passage(id="p2", title="Orlan Vesk", text=DOCS[1].text.replace("1802", "1820")), *DOCS[2:]]
    before = on.passage_cache.stats()
    a = engine.rag_token(on, _prompts(on, QUESTIONS[1], s, edited), SCORES, s.decoding)
    b = engine.rag_token(off, _prompts(off, QUESTIONS[1], s, edited), SCORES, s.decoding)
    _same_generation(a, b, ATOL[torch.float32])
    after = on.passage_cache.stats()
    assert (after.hits - before.hits, after.misses - before.misses) == (len(DOCS) - 1, 1)
    assert after.entries == before.entries + 1  # the original passage is still kept beside it


def test_two_requests_at_once(smollm_tokenizer_folder):
    """Two threads prefilling and decoding at once on one generator, over overlapping passages,
    each several times: every result equals the cache-free one, and the cache ends holding each
    passage once."""
    on, off = _gen(smollm_tokenizer_folder), _gen(smollm_tokenizer_folder, kept=False)
    s = RagSettings(preset="paper", max_new_tokens=3, answer_style="short")
    jobs = [(QUESTIONS[0], DOCS[:3]), (QUESTIONS[1], DOCS[1:])]
    want = [engine.rag_sequence(off, _prompts(off, q, s, d), SCORES[: len(d)], s.decoding) for q, d in jobs]

    def work(i: int):
        q, d = jobs[i]
        return engine.rag_sequence(on, _prompts(on, q, s, d), SCORES[: len(d)], s.decoding)

    got = in_two_threads(work)
    for i in range(2):
        assert len(got[i]) == 3
        for g in got[i]:
            _same_generation(g, want[i], ATOL[torch.float32])
    assert on.passage_cache.stats().entries == len(DOCS)


def test_the_cache_alone():
    """Least recently used first out, within max_bytes; a look is not a use; an entry too large
    is not kept; an entry is never the caller's buffer; a bad bound is refused by name."""
    cache = PassageKVCache(max_bytes=3 * 4 * 8)  # three entries of 8 float32
    entry = lambda x: torch.full((1, 2, 1, 2, 2), float(x))  # noqa: E731  (layers, 2, heads, L, d)
    for k in "abc":
        assert cache.put(k, entry(ord(k)))
    assert cache.get("a") is not None  # a is now the most recent
    assert "b" in cache
    cache.put("d", entry(4))  # b, the least recently used (the look above was not a use), goes
    assert "b" not in cache and all(k in cache for k in "acd")
    st = cache.stats()
    assert (st.bytes, st.entries, st.hits, st.misses, st.evictions) == (96, 3, 1, 0, 1)
    assert cache.get("b") is None and cache.stats().misses == 1
    assert not cache.put("big", torch.zeros(1, 2, 1, 2, 13)) and "big" not in cache  # 208 bytes > 96
    assert len(cache) == 3  # and nothing was evicted for it
    buffer = torch.zeros(4, 1, 2, 1, 2, 2)
    cache.put("view", buffer[1])  # a view of the caller's buffer is copied
    buffer.fill_(7.0)
    torch.testing.assert_close(cache.get("view"), torch.zeros(1, 2, 1, 2, 2), rtol=0, atol=0)
    cache.resize(32)
    assert cache.stats().bytes <= 32 and len(cache) == 1
    cache.clear()
    assert cache.stats().bytes == 0 and len(cache) == 0
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="max_bytes"):
            PassageKVCache(bad)


def test_the_cost_model_prices_only_the_tokens_run():
    """Kept passage tokens make the prefill cheaper, never the memory (every row still holds
    them); with nothing kept the estimate is the worst case it always was."""
    dims = ModelDims(layers=30, kv_width=192, vocab=49152, dtype_bytes=4)
    cm = CostModel()
    worst = cm.request(dims, "token", 5, 2, 32, 550)
    assert cm.request(dims, "token", 5, 2, 32, 550, cached_tokens=0) == worst
    sec, byt = cm.request(dims, "token", 5, 2, 32, 550, cached_tokens=5 * 150)
    assert byt == worst[1]
    assert sec == pytest.approx(worst[0] - 5 * 150 * cm.prefill_s_per_token)
    assert cm.request(dims, "token", 5, 2, 32, 550, cached_tokens=10**6)[0] >= 32 * cm.step_s  # never below no prefill


def test_the_pipelines_estimate_knows_what_is_kept(three_passage_pipe, smollm_tokenizer_folder):
    """RagPipeline.estimate on known passages prices the prefill of their own prompts less what
    the generator keeps: cheaper once they have been read; without passages it stays the worst case."""
    from rag_demo.models.random_models import tiny_smollm_generator

    gen = tiny_smollm_generator(smollm_tokenizer_folder, layers=2, kv_heads=1, seed=4)
    texts = [d.text for d in DOCS[:3]]
    pipe = three_passage_pipe(gen, texts, RagSettings(preset="paper", k=3, max_new_tokens=3, answer_style="short"))
    q = QUESTIONS[0]
    worst = pipe.estimate(q, ["token", "sequence"])
    passages = pipe.retrieve(q, "token", 3).passages
    before = pipe.estimate(q, ["token", "sequence"], passages=passages)
    assert before.seconds <= worst.seconds
    pipe.answers(q, ["token", "sequence"])
    after = pipe.estimate(q, ["token", "sequence"], passages=passages)
    assert after.seconds < before.seconds and after.peak_bytes == before.peak_bytes
    assert pipe.estimate(q, ["token", "sequence"]).seconds == pytest.approx(worst.seconds)


def test_bench_reasks_count_the_cache(three_passage_pipe, smollm_tokenizer_folder):
    """bench's re-ask measurement on a tiny pipeline: the cold ask runs every passage, a re-ask
    with another temperature or one passage fewer reads them all from the cache, the other preset
    (another prompt opening) runs them again; its summary rows and targets follow."""
    from rag_demo.measure import bench_report, reask
    from rag_demo.models.random_models import tiny_smollm_generator

    gen = tiny_smollm_generator(smollm_tokenizer_folder, layers=2, kv_heads=1, seed=4)
    pipe = three_passage_pipe(gen, [d.text for d in DOCS[:3]], RagSettings(preset="aided", k=3, max_new_tokens=3,
                                                                          num_beams=1))
    gen.hidden_cache.resize(0)  # the passages alone (test_kept_states.py counts the hidden states)
    r = reask.reasks(pipe, QUESTIONS[:1], ["sequence", "token", "closed-book"], pipe.settings, lambda msg: None)
    assert [x["misses"] for x in r["cold"]] == [3, 3, 3] and [x["hits"] for x in r["cold"]] == [0, 0, 0]
    assert r["temperature"][0]["hits"] == 3 and r["temperature"][0]["misses"] == 0
    assert r["without"][0]["hits"] == 2 and r["without"][0]["misses"] == 0
    assert r["preset"][0]["hits"] == 0 and r["preset"][0]["misses"] == 3
    assert all(x["hidden_hits"] == x["hidden_bytes"] == 0 for x in r["temperature"])
    assert set(r["temperature"][0]["speedup"]) == {"sequence", "token", "closed-book"}
    assert all(all(x["same"].values()) for v in ("temperature", "without", "preset") for x in r[v])
    assert 0 < r["temperature"][0]["cache_bytes"] <= r["max_bytes"]
    rows = reask.reask_rows(r)
    assert set(rows) == {"cold", "temperature", "without", "preset"}
    targets = bench_report.targets({"latency": {}, "memory": {"rss_warm": 1e9}, "reask": {"float32": r}})
    assert targets["re-ask, one passage taken away: time to first token p50"]["value"] == rows["without"][0]
    assert "re-ask" in bench_report.format_results({"n": 1, "stack": "x", "settings": {"k": 3, "max_new_tokens": 3},
                                             "latency": {}, "reask": {"float32": r}, "targets": targets,
                                             "memory": {"rss_loaded": 1, "rss_warm": 1, "peak_warm": 1, "peak_end": 1},
                                             "machine": {"processor": "p", "cpus": 2, "torch": "t", "threads": 2},
                                             "load_avg": {"start": [], "end": []}})


def test_bench_times_each_generator_precision_in_one_run(three_passage_pipe, smollm_tokenizer_folder):
    """bench's latency and re-asks run once per generator precision in one call (the second on the
    generator loaded again over the same index); the tables and the targets hold both precisions'
    numbers, side by side (not a timing test)."""
    from copy import deepcopy

    from rag_demo.measure import bench, bench_report, latency
    from rag_demo.models.decoder_only import DecoderOnlyGenerator
    from rag_demo.models.random_models import tiny_smollm_generator

    gen = tiny_smollm_generator(smollm_tokenizer_folder, layers=2, kv_heads=1, seed=4)
    settings = RagSettings(preset="aided", k=3, max_new_tokens=3, num_beams=1)
    pipe = three_passage_pipe(gen, [d.text for d in DOCS[:3]], settings)

    def tiny_in(spec):  # the loader bench would call, on the tiny model
        model = deepcopy(gen.model).to(getattr(torch, spec.generator_dtype))
        return DecoderOnlyGenerator(model, gen.tokenizer, name=f"tiny-llama ({spec.generator_dtype})")

    r: dict = {}
    firsts = []
    last = bench.per_generator_dtype(pipe, ["float32", "bfloat16"], QUESTIONS[:1], ["token", "sequence"], settings, r,
                                     lambda msg: None, on_first=firsts.append,
                                     load=lambda p, d: latency.with_generator_dtype(p, d, tiny_in))
    assert firsts == [pipe] and last.index is pipe.index and last.stack.modes["token"].generator is not gen
    assert last.stack.modes["token"].generator.model.dtype == torch.bfloat16
    for key in ("latency", "reask", "generators"):
        assert list(r[key]) == ["float32", "bfloat16"], key
    for dtype in ("float32", "bfloat16"):
        assert set(r["latency"][dtype]) == {"token", "sequence"} and len(r["latency"][dtype]["token"]["total"]) == 1
        again = r["reask"][dtype]["temperature"][0]
        assert again["misses"] == 0 and again["hidden_hits"] > 0  # re-asked: no passage runs again
        assert all(again["same"].values())  # and the answers of a generator that kept nothing
    r.update(n=1, stack="x", settings={"k": 3, "max_new_tokens": 3},
             memory={"rss_loaded": 1, "rss_warm": 1, "peak_warm": 1, "peak_end": 1},
             machine={"processor": "p", "cpus": 2, "torch": "t", "threads": 2}, load_avg={"start": [], "end": []})
    r["targets"] = targets = bench_report.targets(r)
    for dtype in ("float32", "bfloat16"):
        for name in ("RAG-Token p50", "RAG-Sequence p50", "RAG-Token time to first token p50"):
            assert targets[f"{name} ({dtype} generator)"]["result"] in ("PASS", "FAIL"), (name, dtype)
    text = bench_report.format_results(r)
    for dtype in ("float32", "bfloat16"):
        assert f"| RAG-Token | {dtype} | " in text and f"| first ask (cold) | {dtype} | " in text
